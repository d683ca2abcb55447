"""Results carried in the agent's own SQS message (`results.notify_directly`), through the real
wire (moto server, the emulator, the SDK's writer): delivered with no GetObject, verified as
S3 objects are; the bucket's notification of the same object is a duplicate, read from
nowhere; a forged or tampered carried result is set aside and never an outcome; a result too
big to carry, or one whose message never comes, is read from S3, the record."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest

from agentcore_rollout import Outcome, RolloutEngine, RolloutRequest
from agentcore_rollout.contract import (
    INLINE_RESULT_MAX_BYTES,
    ResultTarget,
    direct_notification,
    encode_result,
    normal_prefix,
    parse_notification,
    result_key,
)
from tests.agents import basic

from .conftest import engine_config
from .factories import make_result, signed_body

pytestmark = pytest.mark.component


def _requests(n: int, **payload: Any) -> list[RolloutRequest]:
    """Ids of their own: the in-process agents are shared by every test and remember them."""
    tag = uuid.uuid4().hex[:8]
    return [
        RolloutRequest({"a": i, "b": 1, **payload}, input_id=f"q{i}", request_id=f"{tag}-{i}")
        for i in range(n)
    ]


def _queue_left(moto: Any, queue_url: str) -> int:
    """Messages still on the queue, hidden or not."""
    attrs = moto.client("sqs").get_queue_attributes(
        QueueUrl=queue_url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return sum(int(v) for v in attrs.values())


async def _until(predicate: Any, timeout: float = 15.0) -> None:
    give_up = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < give_up, "condition not reached in time"
        await asyncio.sleep(0.05)


def test_the_message_carries_a_small_result_whole_and_a_big_one_by_key() -> None:
    body = signed_body(make_result(request_id="r1"))
    target = ResultTarget(bucket="b" * 3, key="k", inline_max_bytes=len(body))
    (ref,) = parse_notification(direct_notification(target, "e", "r1", body))
    assert ref.result is not None and ref.result.sig
    assert encode_result(ref.result) == body  # the signed object, byte for byte

    smaller = target.model_copy(update={"inline_max_bytes": len(body) - 1})
    (ref,) = parse_notification(direct_notification(smaller, "e", "r1", body))
    assert (ref.bucket, ref.key, ref.result) == ("bbb", "k", None)


async def test_inline_results_need_no_get_object_and_their_bucket_notice_is_a_duplicate(
    moto, channel, emulator
):
    emu = await emulator()
    cfg = engine_config(moto, channel, emu, notify_directly=True)
    async with RolloutEngine(cfg) as engine:
        batch = await engine.rollout(_requests(6))
        # each object's bucket notification comes too, now or after the inline wait
        await _until(lambda: engine.stats().duplicates >= 6)
        stats = engine.stats()
    assert [o.outcome for o in batch.outcomes] == [Outcome.OK] * 6
    assert [o.result.scalar_reward() for o in batch.outcomes] == [
        basic.expected_reward({"a": i, "b": 1}) for i in range(6)
    ]
    assert stats.inline_results == 6 and stats.duplicates == 6
    assert stats.downloads == 0 and "s3:GetObject" not in stats.api_calls
    assert stats.late_results == 0 and not stats.rejected_inline
    assert _queue_left(moto, channel.queue_url) == 0  # both messages of each result deleted


async def test_a_forged_inline_result_is_set_aside_and_the_real_one_delivers(
    moto, channel, emulator
):
    emu = await emulator()
    cfg = engine_config(moto, channel, emu, notify_directly=True)
    (request,) = _requests(1, sleep=1.5)  # forgeries first, then the agent's result
    key = result_key(normal_prefix(channel.prefix), "exp1", 0, request.request_id)
    target = ResultTarget(bucket=channel.bucket, key=key, inline_max_bytes=INLINE_RESULT_MAX_BYTES)
    forged = make_result(  # a better reward, signed without the request's key
        exp_id="exp1", request_id=request.request_id, input_id="q0", rewards=9.0
    )
    misfiled = make_result(exp_id="exp1", request_id="someone-else", input_id="q0")
    sqs = moto.client("sqs")
    async with RolloutEngine(cfg) as engine:
        handle = engine.submit(request)
        for fake in (forged, misfiled):
            note = direct_notification(target, "exp1", request.request_id, signed_body(fake))
            sqs.send_message(QueueUrl=channel.queue_url, MessageBody=note)
        outcome = await handle
        stats = engine.stats()
    assert outcome.outcome is Outcome.OK
    assert outcome.result.scalar_reward() == basic.expected_reward({"a": 0, "b": 1})
    assert stats.rejected_inline == {"signature": 1, "wrong_object": 1}
    assert stats.inline_results == 1  # the agent's own message, verified
    assert _queue_left(moto, channel.queue_url) >= 2  # the forgeries: set aside, not deleted


async def test_a_result_too_big_to_carry_is_read_from_s3(moto, channel, emulator):
    emu = await emulator()
    cfg = engine_config(moto, channel, emu, notify_directly=True)
    (request,) = _requests(1, mode="big", size=INLINE_RESULT_MAX_BYTES + 1)
    async with RolloutEngine(cfg) as engine:
        outcome = await engine.rollout([request])
        stats = engine.stats()
    assert outcome.outcomes[0].outcome is Outcome.OK
    assert stats.inline_results == 0 and stats.downloads == 1
    assert stats.api_calls["s3:GetObject"] == 1


@pytest.fixture
async def agent_sqs_down(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The in-process agents' SQS endpoint refuses connections (their S3 one still works)."""
    await basic.app._writer.close()  # its clients are made again, from this environment
    monkeypatch.setenv("AWS_ENDPOINT_URL_SQS", "http://127.0.0.1:9")
    yield
    await basic.app._writer.close()


async def test_when_the_agent_message_is_lost_the_bucket_notice_delivers(
    moto, channel, emulator, agent_sqs_down
):
    emu = await emulator()
    cfg = engine_config(moto, channel, emu, notify_directly=True)
    async with RolloutEngine(cfg) as engine:
        batch = await engine.rollout(_requests(2))
        stats = engine.stats()
    assert [o.outcome for o in batch.outcomes] == [Outcome.OK] * 2
    assert stats.inline_results == 0 and stats.downloads == 2
    assert stats.api_calls["s3:GetObject"] == 2
