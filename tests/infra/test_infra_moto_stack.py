"""The checked-in template on moto's CloudFormation (runtime disabled), on a loopback server.

moto 5.2.5 reports CREATE_COMPLETE but silently skips bucket and queue policies, the bucket's
notification, lifecycle, public access block and ownership controls, and ECR scan settings.
So the tests assert on what the S3/SQS/ECR/IAM APIs show, apply the skipped parts from the
template's own (resolved) properties, and then check that S3 events really reach the queue.
Server mode (ThreadedMotoServer) so the S3 -> SQS delivery goes through moto's own wiring.

Two more moto quirks met here: it stores a CloudFormation role's inline policy as a Python
repr (not JSON), and it evaluates bucket policies without their conditions, so the TLS-only
Deny refuses every object request (the policy is applied, checked, then removed).
"""

from __future__ import annotations

import ast
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote_plus

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from moto.server import ThreadedMotoServer

from agentcore_rollout._aws import AwsClients
from agentcore_rollout._results.buffer import RolloutBuffer
from agentcore_rollout.contract import result_key
from infra.cdk import app
from tests.factories import SIG_KEY, flat_config, make_result, signed_body

from .cfn import Resolver, one_resource, resources_of_type

# moto warns about each resource type its CloudFormation skips; the tests check them.
pytestmark = [pytest.mark.filterwarnings("ignore:Tried to parse"), pytest.mark.component]

REGION = "us-east-1"
ACCOUNT = "123456789012"
STACK = "AgentCoreRollout"
PREFIX = "rollouts"


@dataclass
class Deployed:
    """A stack deployed on moto, with the clients to look at it."""

    url: str
    template: dict[str, Any]
    outputs: dict[str, str]
    physical: dict[str, str]
    resolve: Resolver
    skipped: set[str] = field(default_factory=set)
    bucket_policy: dict[str, Any] = field(default_factory=dict)

    def client(self, service: str) -> Any:
        return boto3.client(
            service,
            region_name=REGION,
            endpoint_url=self.url,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            config=Config(s3={"addressing_style": "path"}),
        )


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture(scope="module")
def stack(moto_url: str) -> Deployed:
    template = json.loads(app.TEMPLATE_PATH.read_text())
    deployed = Deployed(moto_url, template, {}, {}, Resolver({}, {}, {}))
    cf = deployed.client("cloudformation")
    cf.create_stack(
        StackName=STACK, TemplateBody=app.TEMPLATE_PATH.read_text(), Capabilities=["CAPABILITY_IAM"]
    )
    described = cf.describe_stacks(StackName=STACK)["Stacks"][0]
    assert described["StackStatus"] == "CREATE_COMPLETE"
    deployed.outputs = {o["OutputKey"]: o["OutputValue"] for o in described["Outputs"]}
    deployed.physical = {
        r["LogicalResourceId"]: r["PhysicalResourceId"]
        for r in cf.describe_stack_resources(StackName=STACK)["StackResources"]
        if "LogicalResourceId" in r  # moto lists the skipped resources without ids
    }
    deployed.resolve = _resolver(deployed, described["StackId"])
    return deployed


def _resolver(deployed: Deployed, stack_id: str) -> Resolver:
    template, physical = deployed.template, deployed.physical
    sqs = deployed.client("sqs")
    refs: dict[str, Any] = {k: v.get("Default") for k, v in template["Parameters"].items()}
    refs |= {
        "AWS::Partition": "aws",
        "AWS::AccountId": ACCOUNT,
        "AWS::Region": REGION,
        "AWS::StackId": stack_id,
        "AWS::URLSuffix": "amazonaws.com",
    }
    refs |= physical
    attrs: dict[tuple[str, str], Any] = {
        (queue, "Arn"): sqs.get_queue_attributes(
            QueueUrl=physical[queue], AttributeNames=["QueueArn"]
        )["Attributes"]["QueueArn"]
        for queue in resources_of_type(template, "AWS::SQS::Queue")
    }
    bucket_id = one_resource(template, "AWS::S3::Bucket")[0]
    attrs[(bucket_id, "Arn")] = f"arn:aws:s3:::{physical[bucket_id]}"
    conditions = {"RuntimeEnabled": False, "UseVpc": False, "HasGatewayUrl": False}
    return Resolver(refs, attrs, conditions)


def _missing(call: Any, **kwargs: Any) -> bool:
    try:
        call(**kwargs)
    except ClientError:
        return True
    return False


@pytest.fixture(scope="module")
def applied(stack: Deployed) -> Deployed:
    """Apply, from the template, every setting moto's CloudFormation skipped; note which."""
    s3, sqs, ecr = stack.client("s3"), stack.client("sqs"), stack.client("ecr")
    bucket_id, bucket = one_resource(stack.template, "AWS::S3::Bucket")
    name = stack.physical[bucket_id]
    props = stack.resolve(bucket["Properties"])
    applies = {
        "BucketPolicy": (
            s3.get_bucket_policy,
            lambda: s3.put_bucket_policy(
                Bucket=name, Policy=json.dumps(_bucket_policy(stack)["PolicyDocument"])
            ),
        ),
        "PublicAccessBlock": (
            s3.get_public_access_block,
            lambda: s3.put_public_access_block(
                Bucket=name,
                PublicAccessBlockConfiguration=props["PublicAccessBlockConfiguration"],
            ),
        ),
        "OwnershipControls": (
            s3.get_bucket_ownership_controls,
            lambda: s3.put_bucket_ownership_controls(
                Bucket=name, OwnershipControls=props["OwnershipControls"]
            ),
        ),
        "Lifecycle": (
            s3.get_bucket_lifecycle_configuration,
            lambda: s3.put_bucket_lifecycle_configuration(
                Bucket=name,
                LifecycleConfiguration={
                    "Rules": [_lifecycle_rule(r) for r in props["LifecycleConfiguration"]["Rules"]]
                },
            ),
        ),
    }
    for what, (get, put) in applies.items():
        if _missing(get, Bucket=name):
            stack.skipped.add(what)
        put()
    for queue_policy in resources_of_type(stack.template, "AWS::SQS::QueuePolicy").values():
        policy = stack.resolve(queue_policy["Properties"])
        for url in policy["Queues"]:
            if "Policy" not in sqs.get_queue_attributes(
                QueueUrl=url, AttributeNames=["Policy"]
            ).get("Attributes", {}):
                stack.skipped.add("QueuePolicy")
            sqs.set_queue_attributes(
                QueueUrl=url, Attributes={"Policy": json.dumps(policy["PolicyDocument"])}
            )
    if not s3.get_bucket_notification_configuration(Bucket=name).get("QueueConfigurations"):
        stack.skipped.add("Notification")
    s3.put_bucket_notification_configuration(
        Bucket=name,
        NotificationConfiguration={
            "QueueConfigurations": [
                _queue_configuration(q)
                for q in props["NotificationConfiguration"]["QueueConfigurations"]
            ]
        },
    )
    # moto ignores the policy's condition: the TLS-only Deny would refuse every put.
    stack.bucket_policy = json.loads(s3.get_bucket_policy(Bucket=name)["Policy"])
    s3.delete_bucket_policy(Bucket=name)
    repo_id, repo = one_resource(stack.template, "AWS::ECR::Repository")
    scan = repo["Properties"]["ImageScanningConfiguration"]["ScanOnPush"]
    repository = ecr.describe_repositories(repositoryNames=[stack.physical[repo_id]])
    if repository["repositories"][0]["imageScanningConfiguration"].get("scanOnPush") != scan:
        stack.skipped.add("EcrScanOnPush")
    ecr.put_image_scanning_configuration(
        repositoryName=stack.physical[repo_id], imageScanningConfiguration={"scanOnPush": scan}
    )
    return stack


def _bucket_policy(stack: Deployed) -> dict[str, Any]:
    return stack.resolve(one_resource(stack.template, "AWS::S3::BucketPolicy")[1]["Properties"])


def _lifecycle_rule(rule: dict[str, Any]) -> dict[str, Any]:
    """AWS::S3::Bucket Rule -> PutBucketLifecycleConfiguration Rule."""
    api: dict[str, Any] = {
        "ID": rule["Id"],
        "Status": rule["Status"],
        "Filter": {"Prefix": rule.get("Prefix", "")},
    }
    if "ExpirationInDays" in rule:
        api["Expiration"] = {"Days": int(rule["ExpirationInDays"])}
    if "AbortIncompleteMultipartUpload" in rule:
        api["AbortIncompleteMultipartUpload"] = rule["AbortIncompleteMultipartUpload"]
    return api


def _queue_configuration(config: dict[str, Any]) -> dict[str, Any]:
    """AWS::S3::Bucket QueueConfiguration -> PutBucketNotificationConfiguration one."""
    return {
        "QueueArn": config["Queue"],
        "Events": [config["Event"]],
        "Filter": {"Key": {"FilterRules": config["Filter"]["S3Key"]["Rules"]}},
    }


def _document(value: Any) -> dict[str, Any]:
    """A policy document as moto returns it: a dict, JSON, or (CloudFormation roles) a repr."""
    if isinstance(value, dict):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return ast.literal_eval(value)


def _queue_attributes(stack: Deployed, logical_id: str) -> dict[str, str]:
    sqs = stack.client("sqs")
    return sqs.get_queue_attributes(QueueUrl=stack.physical[logical_id], AttributeNames=["All"])[
        "Attributes"
    ]


def test_stack_deploys_without_the_runtime(stack: Deployed) -> None:
    assert set(stack.outputs) == {
        "BucketName",
        "ResultPrefix",
        "QueueUrl",
        "DeadLetterQueueUrl",
        "RepositoryUri",
        "RoleArn",
        "TrainerPolicyArn",
    }
    assert stack.outputs["ResultPrefix"] == PREFIX
    assert stack.outputs["BucketName"].startswith(f"agentcore-rollout-{ACCOUNT}-")
    agentcore = stack.client("bedrock-agentcore-control")
    assert agentcore.list_agent_runtimes()["agentRuntimes"] == []


def test_bucket_exists_encrypted(stack: Deployed) -> None:
    s3 = stack.client("s3")
    name = stack.outputs["BucketName"]
    s3.head_bucket(Bucket=name)
    rules = s3.get_bucket_encryption(Bucket=name)["ServerSideEncryptionConfiguration"]["Rules"]
    assert rules[0]["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"] == "AES256"


def test_queues_exist_encrypted_with_redrive(stack: Deployed) -> None:
    queue = _queue_attributes(stack, "NotificationQueue")
    dlq = _queue_attributes(stack, "DeadLetterQueue")
    assert stack.outputs["QueueUrl"] == stack.physical["NotificationQueue"]
    assert queue["SqsManagedSseEnabled"] == dlq["SqsManagedSseEnabled"] == "true"
    redrive = json.loads(queue["RedrivePolicy"])
    assert redrive == {"deadLetterTargetArn": dlq["QueueArn"], "maxReceiveCount": 5}


def test_repository_role_and_trainer_policy_exist(stack: Deployed) -> None:
    ecr, iam = stack.client("ecr"), stack.client("iam")
    repo = ecr.describe_repositories(repositoryNames=["agentcore-rollout"])["repositories"][0]
    assert repo["imageTagMutability"] == "IMMUTABLE"
    assert stack.outputs["RepositoryUri"] == repo["repositoryUri"]

    role_name = stack.outputs["RoleArn"].rsplit("/", 1)[-1]
    trust = _document(iam.get_role(RoleName=role_name)["Role"]["AssumeRolePolicyDocument"])
    assert trust["Statement"][0]["Condition"]["StringEquals"] == {"aws:SourceAccount": ACCOUNT}
    inline = iam.get_role_policy(RoleName=role_name, PolicyName="rollout-runtime")
    by_sid = {s["Sid"]: s for s in _document(inline["PolicyDocument"])["Statement"]}
    bucket = stack.outputs["BucketName"]
    assert by_sid["WriteRolloutResults"]["Resource"] == f"arn:aws:s3:::{bucket}/{PREFIX}/*"

    policy_arn = stack.outputs["TrainerPolicyArn"]
    version = iam.get_policy(PolicyArn=policy_arn)["Policy"]["DefaultVersionId"]
    document = iam.get_policy_version(PolicyArn=policy_arn, VersionId=version)["PolicyVersion"]
    statements = {s["Sid"]: s for s in _document(document["Document"])["Statement"]}
    # Without the runtime, the trainer may invoke the runtime of the configured name.
    assert statements["InvokeAndStopRuntimeSessions"]["Resource"] == [
        f"arn:aws:bedrock-agentcore:{REGION}:{ACCOUNT}:runtime/agentcore_rollout-*"
    ]


def test_moto_skipped_these_and_they_are_applied_from_the_template(applied: Deployed) -> None:
    assert applied.skipped == {
        "BucketPolicy",
        "PublicAccessBlock",
        "OwnershipControls",
        "Lifecycle",
        "QueuePolicy",
        "Notification",
        "EcrScanOnPush",
    }, "moto changed: update the module docstring"
    s3 = applied.client("s3")
    name = applied.outputs["BucketName"]
    block = s3.get_public_access_block(Bucket=name)["PublicAccessBlockConfiguration"]
    assert all(block.values()) and len(block) == 4
    deny = applied.bucket_policy["Statement"][0]
    assert deny["Effect"] == "Deny" and deny["Action"] == "s3:*"
    assert deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    assert deny["Resource"] == [f"arn:aws:s3:::{name}", f"arn:aws:s3:::{name}/*"]
    rules = s3.get_bucket_lifecycle_configuration(Bucket=name)["Rules"]
    expire = next(r for r in rules if r["ID"] == "ExpireRolloutResults")
    assert expire["Filter"] == {"Prefix": f"{PREFIX}/"} and expire["Expiration"] == {"Days": 7}
    queue_policy = json.loads(_queue_attributes(applied, "NotificationQueue")["Policy"])
    allow = queue_policy["Statement"][1]
    assert allow["Condition"]["ArnEquals"] == {"aws:SourceArn": f"arn:aws:s3:::{name}"}
    assert allow["Condition"]["StringEquals"] == {"aws:SourceAccount": ACCOUNT}


def _receive_all(sqs: Any, url: str, wait: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    while batch := sqs.receive_message(
        QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=wait
    ).get("Messages", []):
        messages += batch
        for message in batch:
            sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
        wait = 0
    return messages


def test_put_under_the_prefix_reaches_the_queue_and_others_do_not(applied: Deployed) -> None:
    s3, sqs = applied.client("s3"), applied.client("sqs")
    bucket, url = applied.outputs["BucketName"], applied.outputs["QueueUrl"]
    _receive_all(sqs, url, wait=0)  # the s3:TestEvent of configuring the notification
    result_key = f"{PREFIX}/exp 1/00000003/req-1.json"
    for key in (
        "other/exp1/00000003/req-2.json",  # outside the prefix
        f"{PREFIX}-old/req-3.json",  # a sibling prefix
        f"{PREFIX}/exp1/00000003/notes.txt",  # not a result object
        result_key,
    ):
        s3.put_object(Bucket=bucket, Key=key, Body=b"{}")
    messages = _receive_all(sqs, url, wait=2)
    records = [r for m in messages for r in json.loads(m["Body"]).get("Records", [])]
    assert len(records) == 1, records
    record = records[0]
    assert record["eventSource"] == "aws:s3"
    assert record["eventName"].startswith("ObjectCreated:")
    assert record["s3"]["bucket"]["name"] == bucket
    assert unquote_plus(record["s3"]["object"]["key"]) == result_key


async def test_the_engines_buffer_gets_results_under_the_prefix_only(applied: Deployed) -> None:
    """The template's wiring, end to end into RolloutBuffer: a signed result under the prefix
    is delivered through its notification; the same object outside the prefix is never seen."""
    s3, sqs = applied.client("s3"), applied.client("sqs")
    bucket, url = applied.outputs["BucketName"], applied.outputs["QueueUrl"]
    _receive_all(sqs, url, wait=0)
    cfg = flat_config(
        exp_id="exp1",
        bucket=bucket,
        prefix=PREFIX,
        queue_url=url,
        runtime_arn="arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/x",
        region=REGION,
        service_urls={"s3": applied.url, "sqs": applied.url},
        wait_time=1,
        reconcile_before=0.0,
        result_grace=0.0,
    )
    body = signed_body(make_result(exp_id="exp1", step=3, request_id="req-9", rewards=0.5))
    async with AwsClients(cfg) as clients:
        buffer = RolloutBuffer(clients.s3, clients.sqs, cfg)
        await buffer.start()
        buffer.expect("req-9", step=3, sig_key=SIG_KEY)
        s3.put_object(Bucket=bucket, Key="other/exp1/00000003/req-9.json", Body=body)
        s3.put_object(Bucket=bucket, Key=result_key(PREFIX, "exp1", 3, "req-9"), Body=body)
        delivery = await buffer.wait("req-9", deadline=time.time() + 20)
        await buffer.close()
    assert delivery.result is not None and delivery.result.status == "ok"
    assert delivery.via == "notification" and delivery.result.rewards == 0.5
    stats = buffer.stats()
    assert stats["messages"] == 1 and stats["s3_lookups"] == 0
