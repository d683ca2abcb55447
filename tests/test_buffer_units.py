"""RolloutBuffer's loop with in-process fakes (pure logic): a bug in handling one message or a
failing receive never stops the poller, and only handled messages are deleted."""

from __future__ import annotations

import asyncio
import gc
import json
import threading
import time

import pytest

from agentcore_rollout._results import inbox as _inbox
from agentcore_rollout._results import objects as _objects
from agentcore_rollout._results.buffer import RolloutBuffer
from agentcore_rollout._results.inbox import _Batched
from agentcore_rollout.contract import result_key

from .factories import SIG_KEY as KEY
from .factories import flat_config, make_result, signed_body

pytestmark = pytest.mark.unit


class FakeBody:
    def __init__(self, data: bytes) -> None:
        self._data = data

    async def __aenter__(self) -> FakeBody:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def read(self) -> bytes:
        return self._data


class FakeS3:
    def __init__(self, objects: dict[str, bytes], broken: set[str]) -> None:
        self.objects, self.broken = objects, broken

    async def get_object(self, Bucket: str, Key: str) -> dict:
        if Key in self.broken:
            raise RuntimeError("bug in a dependency")
        return {"Body": FakeBody(self.objects[Key]), "ContentLength": len(self.objects[Key])}


class FakeSQS:
    def __init__(self, batches: list[list[dict] | Exception]) -> None:
        self.batches = batches
        self.deleted: list[str] = []
        self.released: list[str] = []
        self.hidden: dict[str, int] = {}  # receipt handle -> the visibility it was released with

    async def receive_message(self, **_: object) -> dict:
        if not self.batches:
            await asyncio.sleep(0.05)
            return {}
        batch = self.batches.pop(0)
        if isinstance(batch, Exception):
            raise batch
        return {"Messages": batch}

    async def delete_message_batch(self, QueueUrl: str, Entries: list[dict]) -> None:
        self.deleted += [e["ReceiptHandle"] for e in Entries]

    async def change_message_visibility_batch(self, QueueUrl: str, Entries: list[dict]) -> None:
        self.released += [e["ReceiptHandle"] for e in Entries]
        self.hidden |= {e["ReceiptHandle"]: e["VisibilityTimeout"] for e in Entries}


def _event(key: str) -> str:
    record = {
        "eventSource": "aws:s3",
        "eventName": "ObjectCreated:Put",
        "s3": {"bucket": {"name": "bkt"}, "object": {"key": key}},
    }
    return json.dumps({"Records": [record]})


async def test_a_bug_on_one_message_and_a_failed_receive_do_not_stop_the_loop():
    cfg = flat_config(
        bucket="bkt",
        queue_url="q",
        runtime_arn="arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/a-1",
        exp_id="e",
        reconcile_before=0.0,
        result_grace=0.0,
    )
    good, bad = result_key("rollouts", "e", 0, "good"), result_key("rollouts", "e", 0, "bad")
    now = time.time()
    s3 = FakeS3({good: signed_body(make_result(request_id="good"))}, broken={bad})
    sqs = FakeSQS(
        [
            OSError("connection reset"),
            [
                {"MessageId": "1", "ReceiptHandle": "h-bad", "Body": _event(bad)},
                {"MessageId": "2", "ReceiptHandle": "h-good", "Body": _event(good)},
            ],
        ]
    )
    buffer = RolloutBuffer(s3, sqs, cfg)
    for rid in ("good", "bad"):
        buffer.expect(rid, step=0, sig_key=KEY)
    await buffer.start()
    delivery = await buffer.wait("good", deadline=now + 3)
    await buffer.close()
    assert delivery.result.status == "ok" and delivery.result.rewards == 1.0
    assert buffer.stats()["handler_errors"] == 1
    assert sqs.deleted == ["h-good"]  # the failed one stays on the queue


class FailingDeleteSQS(FakeSQS):
    async def delete_message_batch(self, QueueUrl: str, Entries: list[dict]) -> None:
        if not self.deleted:
            self.deleted.append("failed once")
            raise RuntimeError("bug while settling")
        await super().delete_message_batch(QueueUrl, Entries)


async def test_a_failed_delete_is_counted_and_no_task_error_goes_unretrieved(monkeypatch):
    loop = asyncio.get_running_loop()
    unhandled: list[dict] = []
    loop.set_exception_handler(lambda _loop, context: unhandled.append(context))
    monkeypatch.setattr(_inbox, "_DELETE_WINDOW", 0)  # a handled message's delete is sent at once
    monkeypatch.setattr(_inbox, "_RECEIVE_GATHER", 0.05)  # ... before the next is received: 1 each
    cfg = flat_config(
        bucket="bkt",
        queue_url="q",
        runtime_arn="arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/a-1",
        exp_id="e",
        reconcile_before=0,  # delivered by the notifications, not by a lookup
    )
    keys = {rid: result_key("rollouts", "e", 0, rid) for rid in ("first", "second")}
    s3 = FakeS3({k: signed_body(make_result(request_id=r)) for r, k in keys.items()}, set())
    sqs = FailingDeleteSQS(
        [[{"MessageId": r, "ReceiptHandle": f"h-{r}", "Body": _event(k)}] for r, k in keys.items()]
    )
    buffer = RolloutBuffer(s3, sqs, cfg)
    for rid in keys:
        buffer.expect(rid, step=0, sig_key=KEY)
    await buffer.start()
    deliveries = [await buffer.wait(rid, deadline=time.time() + 5) for rid in keys]
    await buffer.close()
    gc.collect()  # an unretrieved task exception is reported when the task is collected
    await asyncio.sleep(0)
    assert [d.result.status for d in deliveries] == ["ok", "ok"]
    assert buffer.stats()["unsettled_messages"] == 1
    assert sqs.deleted == ["failed once", "h-second"]
    assert unhandled == []


async def test_settlements_go_ten_to_a_call_after_a_short_window():
    calls: list[list[str]] = []

    async def call(QueueUrl: str, Entries: list[dict]) -> dict:
        calls.append([e["ReceiptHandle"] for e in Entries])
        return {}

    batched = _Batched(call, "q", window=0.05)
    for i in range(25):
        batched.add({"ReceiptHandle": f"h{i}"})
    await asyncio.sleep(0)
    assert [len(c) for c in calls] == [10, 10]  # full calls at once; the last 5 wait
    await asyncio.sleep(0.2)
    assert [len(c) for c in calls] == [10, 10, 5]  # the window passed
    batched.add({"ReceiptHandle": "last"})
    await batched.close()  # sends what waits, without waiting for the window
    assert calls[-1] == ["last"] and batched.failed == 0


async def test_large_objects_are_checked_off_the_event_loop_and_still_refused_when_forged(
    monkeypatch,
):
    threads: list[str] = []
    check = _objects.checked_object

    def recorded(*args: object) -> object:
        threads.append(threading.current_thread().name)
        return check(*args)

    monkeypatch.setattr(_objects, "checked_object", recorded)
    cfg = flat_config(
        bucket="bkt",
        queue_url="q",
        runtime_arn="arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/a-1",
        exp_id="e",
        reconcile_before=0,
    )
    big = {"messages": [{"role": "user", "content": "x" * 1000} for _ in range(600)]}
    keys = {rid: result_key("rollouts", "e", 0, rid) for rid in ("big", "forged")}
    objects = {
        keys["big"]: signed_body(make_result(request_id="big", trajectory=big)),
        keys["forged"]: signed_body(make_result(request_id="forged", trajectory=big), "x" * 32),
    }
    assert all(len(body) > 256 * 1024 for body in objects.values())  # the worker-thread path
    sqs = FakeSQS(
        [[{"MessageId": r, "ReceiptHandle": f"h-{r}", "Body": _event(k)}] for r, k in keys.items()]
    )
    buffer = RolloutBuffer(FakeS3(objects, set()), sqs, cfg)
    for rid in keys:
        buffer.expect(rid, step=0, sig_key=KEY)
    await buffer.start()
    big_delivery, forged = [await buffer.wait(rid, deadline=time.time() + 5) for rid in keys]
    await buffer.close()
    assert big_delivery.result.status == "ok" and big_delivery.result.trajectory == big
    assert forged.result is None and "signature" in (forged.invalid or "")
    assert buffer.stats()["invalid_results"] == {"signature": 1}
    assert len(threads) == 2 and threading.main_thread().name not in threads


async def test_messages_not_ours_are_hidden_longer_each_time_they_come_back(monkeypatch):
    """Messages not ours: no S3 call, released (never deleted) for a time that grows with
    their receive count, up to SQS's maximum; another experiment's after two short hides
    (its engine may share the queue). Ours that nobody here expects: short."""
    monkeypatch.setattr(_inbox, "_FOREIGN_VISIBILITY", 2)  # the seconds below are of it
    cfg = flat_config(
        bucket="bkt",
        queue_url="q",
        runtime_arn="arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/a-1",
        exp_id="e",
        visibility_timeout=60,
    )
    other_exp, outside = _event(result_key("rollouts", "other", 0, "r")), _event("elsewhere/x.json")
    unexpected = _event(result_key("rollouts", "e", 0, "nobody"))
    received = {  # handle: (body, ApproximateReceiveCount, seconds hidden)
        "other-1": (other_exp, 1, 2),
        "other-2": (other_exp, 2, 2),
        "other-3": (other_exp, 3, 8),
        "other-4": (other_exp, 4, 32),
        "outside-1": (outside, 1, 60),
        "outside-2": (outside, 2, 240),
        "outside-40": (outside, 40, 12 * 3600 - 60),
        "malformed-1": ("not json", 1, 60),
        "malformed-2": ('{"Records": "nope"}', 2, 240),
        "ours-5": (unexpected, 5, 2),
    }
    batch = [
        {
            "MessageId": h,
            "ReceiptHandle": h,
            "Body": b,
            "Attributes": {"ApproximateReceiveCount": str(n)},
        }
        for h, (b, n, _) in received.items()
    ]
    sqs = FakeSQS([batch])
    buffer = RolloutBuffer(FakeS3({}, set()), sqs, cfg)  # any S3 read would fail the handler
    await buffer.start()
    give_up, kinds = time.monotonic() + 5, ("foreign_messages", "malformed_messages", "unmatched")
    while sum(buffer.stats()[k] for k in kinds) < len(received):
        assert time.monotonic() < give_up, "messages not handled"  # a guard
        await asyncio.sleep(0.01)
    await buffer.close()
    stats = buffer.stats()
    assert sqs.hidden == {h: hidden for h, (_, _, hidden) in received.items()}
    assert sqs.deleted == [] and stats["downloads"] == 0 and stats["handler_errors"] == 0
    assert (stats["foreign_messages"], stats["malformed_messages"], stats["unmatched"]) == (7, 2, 1)
