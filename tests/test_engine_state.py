"""What the engine remembers per request is bounded: ended requests are forgotten once their
step leaves the retained window (through the real wire), and the figures a trainer logs add
up (pure logic)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from agentcore_rollout import EngineStats, RolloutEngine, RolloutRequest
from agentcore_rollout.contract import result_key

from .conftest import engine_config

pytestmark = pytest.mark.component


async def test_ended_requests_are_forgotten_once_their_step_leaves_the_window(
    moto, channel, emulator
):
    emu = await emulator()
    batches = []
    # max_staleness=0: the current step and the one before it are remembered
    async with RolloutEngine(engine_config(moto, channel, emu)) as engine:
        for step in range(4):
            engine.set_step(step)
            batch = await engine.rollout(
                RolloutRequest({"a": i, "b": step}, input_id=f"s{step}q{i}") for i in range(4)
            )
            assert batch.counts["ok"] == 4 and batch.step == step
            assert engine.stats().tracked_requests == 4 * min(step + 1, 2)
            batches.append(batch)
        # A late copy of a notification: for a forgotten request it is unknown (released back
        # to the queue, for another engine of this experiment), for a remembered one a
        # duplicate (deleted); neither reaches a batch.
        forgotten, remembered = batches[0].outcomes[0], batches[3].outcomes[0]
        sqs = moto.client("sqs")
        for o in (forgotten, remembered):
            key = result_key("rollouts", "exp1", o.step, o.request.request_id)
            sqs.send_message(
                QueueUrl=channel.queue_url, MessageBody=json.dumps(_event(channel, key))
            )
        before = engine.stats()
        await _until(lambda: engine.stats().since(before).unmatched >= 2)  # it came back
        seen = engine.stats().since(before)
        engine.set_step(4)
        assert engine.stats().tracked_requests == 4  # step 3 only
    assert seen.duplicates == 1


async def test_a_request_id_stays_taken_while_its_step_is_retained(moto, channel, emulator):
    emu = await emulator()
    request = RolloutRequest({"a": 1, "b": 1}, input_id="g")
    async with RolloutEngine(engine_config(moto, channel, emu)) as engine:
        assert (await engine.submit(request)).outcome == "ok"
        engine.set_step(1)
        with pytest.raises(ValueError, match="already in use"):
            engine.submit(request)


def test_stats_since_subtracts_counters_and_keeps_gauges():
    earlier = EngineStats(
        live_sessions=5, invokes=10, retries={"ThrottlingException": 2}, api_calls={"s3:Get": 7}
    )
    later = EngineStats(
        live_sessions=1,
        invokes=25,
        retries={"ThrottlingException": 5, "InternalServerException": 1},
        api_calls={"s3:Get": 7, "sqs:Receive": 3},
    )
    delta = later.since(earlier)
    assert delta.live_sessions == 1 and delta.invokes == 15
    assert delta.retries == {"InternalServerException": 1, "ThrottlingException": 3}
    assert delta.api_calls == {"sqs:Receive": 3}  # zeros are dropped
    metrics = delta.metrics()
    assert metrics["rollout/engine/invokes"] == 15
    assert metrics["rollout/engine/retries/ThrottlingException"] == 3
    assert "rollout/engine/api_calls/s3:Get" not in metrics


def _event(channel, key: str) -> dict:
    return {
        "Records": [
            {
                "eventSource": "aws:s3",
                "eventName": "ObjectCreated:Put",
                "s3": {"bucket": {"name": channel.bucket}, "object": {"key": key}},
            }
        ]
    }


async def _until(predicate, timeout: float = 15.0) -> None:
    give_up = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < give_up, "condition not reached in time"
        await asyncio.sleep(0.05)
