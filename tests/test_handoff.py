"""Hand-off: an outcome reaches the caller as soon as the buffer has it; the session is stopped
behind it, and its live slot is held until that stop completes. Through the real wire: the
engine's own aiobotocore AgentCore client, the emulator, moto S3 -> SQS."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentcore_rollout import Outcome, RolloutEngine, RolloutRequest
from agentcore_rollout._aws import AwsClients
from agentcore_rollout.gateway import Gateway, GatewayAdmin, SGLangBackend
from agentcore_rollout.local.policy import CharRenderer
from agentcore_rollout.runtimes.agentcore import AgentCoreRuntime
from agentcore_rollout.runtimes.base import SandboxRuntime

from .agents.basic import expected_reward
from .conftest import RUNTIME_ARN, engine_config

pytestmark = pytest.mark.component


class _HeldStops(SandboxRuntime):
    """The real AgentCore client, with every stop held until the test lets stops through."""

    def __init__(self, runtime: AgentCoreRuntime) -> None:
        self._runtime = runtime
        self.name = runtime.name
        self.limits = runtime.limits
        self.release = asyncio.Event()
        self.stops_asked: list[str] = []

    async def invoke(self, session_id: str, payload: bytes) -> None:
        await self._runtime.invoke(session_id, payload)

    async def stop(self, session_id: str) -> None:
        self.stops_asked.append(session_id)
        await self.release.wait()
        await self._runtime.stop(session_id)


async def test_outcome_is_handed_over_before_the_stop_and_the_slot_waits_for_it(
    moto, channel, emulator
):
    emu = await emulator()
    cfg = engine_config(moto, channel, emu, max_live_sessions=2)
    requests = [RolloutRequest({"a": i, "b": 1}, input_id=f"q{i}") for i in range(4)]
    async with AwsClients(cfg) as clients:
        runtime = _HeldStops(
            AgentCoreRuntime(
                await clients.agentcore_in(cfg.region, cfg.service_urls.agentcore), RUNTIME_ARN
            )
        )
        async with RolloutEngine(cfg, runtimes=[runtime]) as engine:
            handles = [engine.submit(r) for r in requests]
            async with asyncio.timeout(20):  # an engine that stops first would wait forever
                first = [await h for h in handles[:2]]
            # Both outcomes are in hand while their sessions are still alive, being stopped.
            assert [o.outcome for o in first] == [Outcome.OK, Outcome.OK]
            assert sorted(runtime.stops_asked) == sorted(o.session_id for o in first)
            assert emu.sessions.stopped == [] and len(emu.sessions.started) == 2
            # The stopped-but-not-yet-gone sessions still hold both slots: nothing else starts.
            await asyncio.sleep(0.3)
            assert len(emu.sessions.started) == 2 and not any(h.done() for h in handles[2:])
            assert engine.stats().live_sessions == 2
            runtime.release.set()
            rest = [await h for h in handles[2:]]
            assert [o.outcome for o in rest] == [Outcome.OK, Outcome.OK]
        # Closing the engine waits for the last stops.
        stats = engine.stats()
    assert stats.peak_live_sessions == 2 and stats.live_sessions == 0
    sessions = emu.sessions
    assert sessions.live.peak == 2 and sorted(sessions.stopped) == sorted(sessions.started)


async def test_deletes_are_batched_and_flushed_on_close(moto, channel, emulator):
    emu = await emulator()
    cfg = engine_config(moto, channel, emu)
    requests = [RolloutRequest({"a": i, "b": 2}, input_id=f"q{i}") for i in range(40)]
    async with RolloutEngine(cfg) as engine:
        batch = await engine.rollout(requests)
    assert batch.counts["ok"] == 40
    calls, stats = engine.stats().api_calls, engine.stats()
    # 40 results (and S3's test event) in a few windows of 0.5 s (_DELETE_WINDOW): several per call
    assert calls["sqs:DeleteMessageBatch"] * 3 <= stats.messages, calls
    assert stats.unsettled_messages == 0 and stats.duplicates == 0
    # what was still waiting for its window when the engine closed was deleted too
    attrs = moto.client("sqs").get_queue_attributes(
        QueueUrl=channel.queue_url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    assert attrs == {
        "ApproximateNumberOfMessages": "0",
        "ApproximateNumberOfMessagesNotVisible": "0",
    }


class _HeldTraces(GatewayAdmin):
    """The engine's real gateway admin client, with each trace held until the test lets it."""

    def __init__(self, url: str, admin_token: str) -> None:
        super().__init__(url, admin_token)
        self.asked = asyncio.Event()
        self.release = asyncio.Event()

    async def finish_session(self, session_id: str) -> dict[str, Any]:
        self.asked.set()
        await self.release.wait()
        return await super().finish_session(session_id)


async def test_a_cancel_that_lands_while_the_trace_is_fetched_changes_nothing(
    moto, channel, emulator
):
    emu = await emulator()
    async with Gateway(SGLangBackend("http://127.0.0.1:9"), CharRenderer()) as gateway:
        gw = {"url": gateway.admin_url, "admin_token": gateway.admin_token}
        async with RolloutEngine(engine_config(moto, channel, emu, gateway=gw)) as engine:
            admins = engine._gateway._admins  # the one replica's client, replaced
            await admins[gateway.admin_url].close()
            admins[gateway.admin_url] = held = _HeldTraces(gateway.admin_url, gateway.admin_token)
            request = RolloutRequest({"a": 3, "b": 4}, input_id="q")
            handle = engine.submit(request)
            async with asyncio.timeout(20):
                await held.asked.wait()  # delivered: the outcome is decided, its trace pending
            handle.cancel()  # e.g. a group that has its n members cancels the rest
            await asyncio.sleep(0.1)
            held.release.set()
            outcome = await handle
            await held.close()
    assert outcome.outcome is Outcome.OK, outcome.error
    assert outcome.reward == expected_reward(request.payload) and outcome.trace is not None
