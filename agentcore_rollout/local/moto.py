"""moto in server mode on loopback, in its own process (so moto's threads stay off the engine's GIL
and local figures mean something), and the results channel wired on it as the infra wires it on
AWS: bucket notification to the queue, a queue policy admitting that bucket, a dead-letter queue."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any

from ..contract import listing_prefix
from ..serving.process import ServiceProcess, exit_with_parent

LOCAL_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
}


class MotoServer(ServiceProcess):
    """`with MotoServer() as moto: moto.url` — a moto server process on 127.0.0.1."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__("moto", "agentcore_rollout.local.moto", host, str(port))

    def __enter__(self) -> MotoServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def client(self, service: str, region: str = "us-east-1") -> Any:
        """A boto3 client for this server (for provisioning and tests)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            service,
            region_name=region,
            endpoint_url=self.url,
            aws_access_key_id=LOCAL_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=LOCAL_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            config=Config(s3={"addressing_style": "path"}),
        )


@dataclass(frozen=True)
class ResultsChannel:
    bucket: str
    prefix: str
    queue_url: str
    queue_arn: str
    dlq_url: str


def provision_results_channel(
    s3: Any, sqs: Any, *, bucket: str, prefix: str, queue: str
) -> ResultsChannel:
    """Create bucket, queue and DLQ (a message received 5 times goes there), and notify the
    queue of objects created under `prefix/`."""
    s3.create_bucket(Bucket=bucket)
    dlq_url = sqs.create_queue(QueueName=f"{queue}-dlq")["QueueUrl"]
    redrive = {"deadLetterTargetArn": _queue_arn(sqs, dlq_url), "maxReceiveCount": "5"}
    attributes = {"RedrivePolicy": json.dumps(redrive)}
    queue_url = sqs.create_queue(QueueName=queue, Attributes=attributes)["QueueUrl"]
    queue_arn = _queue_arn(sqs, queue_url)
    only_the_bucket = {
        "Sid": "AllowResultBucketOnly",
        "Effect": "Allow",
        "Principal": {"Service": "s3.amazonaws.com"},
        "Action": "sqs:SendMessage",
        "Resource": queue_arn,
        "Condition": {"ArnEquals": {"aws:SourceArn": f"arn:aws:s3:::{bucket}"}},
    }
    policy = json.dumps({"Version": "2012-10-17", "Statement": [only_the_bucket]})
    sqs.set_queue_attributes(QueueUrl=queue_url, Attributes={"Policy": policy})
    # as infra/ sets it: result objects under the prefix
    rules = [
        {"Name": "prefix", "Value": listing_prefix(prefix)},
        {"Name": "suffix", "Value": ".json"},
    ]
    notify = {
        "Id": "rollout-results",
        "QueueArn": queue_arn,
        "Events": ["s3:ObjectCreated:*"],
        "Filter": {"Key": {"FilterRules": rules}},
    }
    s3.put_bucket_notification_configuration(
        Bucket=bucket, NotificationConfiguration={"QueueConfigurations": [notify]}
    )
    return ResultsChannel(bucket, prefix, queue_url, queue_arn, dlq_url)


def _queue_arn(sqs: Any, url: str) -> str:
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])
    return attributes["Attributes"]["QueueArn"]


def _retention_check_in_constant_time() -> None:
    """moto builds every queue attribute (a scan of the queue) to check each message it hands
    out against the retention period: with 300 messages waiting, a receive took seconds."""
    from moto.core.utils import unix_time
    from moto.sqs.models import SQSBackend

    def within_retention(self: Any, queue_name: str, message: Any) -> bool:
        retention = int(self.get_queue(queue_name).message_retention_period)
        return retention + message.sent_timestamp / 1000 > unix_time()

    SQSBackend.is_message_valid_based_on_retention_period = within_retention


def _serve(host: str, port: int) -> None:
    """moto's app served by waitress rather than werkzeug's development server, which closes
    every connection: each S3 or SQS call then opened a new one (AWS keeps them alive), which
    cost its clients, the engine among them, 0.3-0.5 ms of CPU a call, and moto a thread."""
    import logging
    import signal

    import waitress
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

    exit_with_parent()
    _retention_check_in_constant_time()
    logging.getLogger("waitress").setLevel(logging.ERROR)
    app = DomainDispatcherApplication(create_backend_app)
    # threads: SQS long polls hold one each for up to 20 s; one per engine poller and agent
    # writer in flight, with room to spare
    server = waitress.create_server(
        app, host=host, port=port, threads=64, connection_limit=4096, channel_timeout=300
    )
    print(f"http://{host}:{server.effective_port}", flush=True)

    def stop(*_: object) -> None:
        raise KeyboardInterrupt  # out of waitress's select loop, on this (the main) thread

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()


if __name__ == "__main__":
    _serve(sys.argv[1], int(sys.argv[2]))
