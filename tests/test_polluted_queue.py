"""A results queue polluted with notifications that are not ours (keys outside the prefix,
another experiment's, malformed ones) costs a run little: each is received a few times at
most and never looked up in S3, nothing of it is destroyed, and results do not wait behind
it."""

from __future__ import annotations

import statistics
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from agentcore_rollout import Outcome, RolloutBatch, RolloutEngine, RolloutRequest
from agentcore_rollout.contract import listing_prefix, result_key

from .conftest import engine_config

pytestmark = pytest.mark.e2e

ROLLOUTS = 32
OUTSIDE, OTHER_EXP, MALFORMED = 150, 150, 20  # 300 foreign notifications, 20 malformed
# Seconds each agent works: longer than another experiment's first two hides (2 s each) and
# the passes over them when they come back, so the ratio is that of a run going on while they
# are set aside, and the machine's noise (shared cores) is small beside it.
WORK = 7.0


async def _run(cfg: Any, tag: str, n: int, work: float) -> tuple[RolloutBatch, list[str]]:
    """One run; returns its batch and every key its S3 client asked GetObject for."""
    asked: list[str] = []
    RECEIVED.clear()
    requests = [
        RolloutRequest({"a": i, "b": 1, "sleep": work}, input_id=f"{tag}{i}") for i in range(n)
    ]
    async with RolloutEngine(cfg) as engine:
        engine._clients.sqs.meta.events.register("after-call.sqs.ReceiveMessage", _received)
        engine._clients.s3.meta.events.register(
            "before-parameter-build.s3.GetObject", lambda params, **_: asked.append(params["Key"])
        )
        batch = await engine.rollout(requests)
    assert [o.outcome for o in batch.outcomes] == [Outcome.OK] * n
    return batch, asked


RECEIVED: Counter[tuple[str, str]] = Counter()  # (kind, message id) -> receipts in this run


def _received(parsed: dict[str, Any], **_: Any) -> None:
    """Counts what each of the engine's receives brought (botocore's after-call event)."""
    for m in parsed.get("Messages", []):
        body = m["Body"]
        kind = next(
            (k for k in ("elsewhere", "another-exp", "not a notification") if k in body), "ours"
        )
        RECEIVED[kind, m["MessageId"]] += 1


def _notify_elsewhere_too(moto: Any, channel: Any) -> None:
    """A second notification rule on the bucket, as another application could add: keys
    under `elsewhere/` notify the results queue too."""
    s3 = moto.client("s3")
    config = s3.get_bucket_notification_configuration(Bucket=channel.bucket)
    config.pop("ResponseMetadata")
    config["QueueConfigurations"].append(
        {
            "Id": "another-application",
            "QueueArn": channel.queue_arn,
            "Events": ["s3:ObjectCreated:*"],
            "Filter": {"Key": {"FilterRules": [{"Name": "prefix", "Value": "elsewhere/"}]}},
        }
    )
    s3.put_bucket_notification_configuration(
        Bucket=channel.bucket, NotificationConfiguration=config
    )


def _pollute(moto: Any, channel: Any) -> None:
    """Real S3 -> SQS notifications for keys outside the prefix and of another exp_id, then
    malformed messages sent by hand."""
    s3, sqs = moto.client("s3"), moto.client("sqs")
    keys = [f"elsewhere/{i}.json" for i in range(OUTSIDE)]
    keys += [result_key(channel.prefix, "another-exp", 0, f"r{i}") for i in range(OTHER_EXP)]
    with ThreadPoolExecutor(8) as pool:  # boto3 clients are thread-safe
        list(pool.map(lambda k: s3.put_object(Bucket=channel.bucket, Key=k, Body=b"{}"), keys))
    for i in range(MALFORMED):
        sqs.send_message(QueueUrl=channel.queue_url, MessageBody=f"not a notification {i}")
    assert _on_queue(sqs, channel.queue_url) == OUTSIDE + OTHER_EXP + MALFORMED


def _on_queue(sqs: Any, url: str) -> int:
    names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=names)["Attributes"]
    return sum(int(attrs[n]) for n in names)


async def test_foreign_and_malformed_notifications_cost_a_run_little(moto, channel, emulator):
    emu = await emulator()
    cfg = engine_config(moto, channel, emu)
    _notify_elsewhere_too(moto, channel)  # S3's test event for it goes with the first run
    await _run(cfg, "warm", 4, 0.0)  # connections, the agent's first import: out of the measure
    clean, _ = await _run(cfg, "clean", ROLLOUTS, WORK)
    _pollute(moto, channel)
    polluted, asked = await _run(cfg, "polluted", ROLLOUTS, WORK)

    medians = [statistics.median(o.latency for o in b.outcomes) for b in (clean, polluted)]
    receives = [b.api_calls["sqs:ReceiveMessage"] for b in (clean, polluted)]
    stats = polluted.stats
    print(f"median latency clean {medians[0]:.2f}s, polluted {medians[1]:.2f}s; receives")
    print(f"{receives}; foreign {stats.foreign_messages}, malformed {stats.malformed_messages}")
    # No S3 call for a key that is not ours: only this run's results were read.
    ours = listing_prefix(channel.prefix) + "exp1/"
    assert len(asked) == ROLLOUTS and all(k.startswith(ours) for k in asked), asked
    # No engine's (outside the prefix, malformed): received once in the run. Another
    # experiment's: three times, two short hides (its engine may share the queue) then a long
    # one. The old code received all of them every 2 s.
    most = {}
    for (kind, _), n in RECEIVED.items():
        most[kind] = max(most.get(kind, 0), n)
    assert most == {"elsewhere": 1, "not a notification": 1, "another-exp": 3, "ours": 1}, most
    assert (
        stats.foreign_messages <= OUTSIDE + 3 * OTHER_EXP and stats.malformed_messages <= MALFORMED
    )
    # Receives: those messages, ten to a call, on top of the clean run's.
    extra = (OUTSIDE + 3 * OTHER_EXP + MALFORMED) // 10
    assert receives[1] - receives[0] <= extra * 1.2, receives
    # Nothing was destroyed: their owners find them on the queue (or its dead-letter queue).
    sqs = moto.client("sqs")
    left = _on_queue(sqs, channel.queue_url) + _on_queue(sqs, channel.dlq_url)
    assert left == OUTSIDE + OTHER_EXP + MALFORMED
    assert medians[1] / medians[0] < 1.2, medians
