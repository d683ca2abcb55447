"""The engine through the real wire: aiobotocore -> emulator -> RolloutApp -> moto S3 ->
S3 event -> moto SQS -> RolloutBuffer."""

from __future__ import annotations

import pytest

from agentcore_rollout import Outcome, RolloutEngine, RolloutRequest

from .agents.basic import expected_reward
from .conftest import engine_config

pytestmark = pytest.mark.component


def _requests(n: int, **payload: object) -> list[RolloutRequest]:
    return [
        RolloutRequest({"a": i, "b": i % 5, **payload}, input_id=f"q{i // 4}", sample_index=i % 4)
        for i in range(n)
    ]


async def test_batch_of_64_all_ok_with_the_agents_rewards(moto, channel, emulator):
    emu = await emulator()
    requests = _requests(64)
    async with RolloutEngine(engine_config(moto, channel, emu)) as engine:
        batch = await engine.rollout(requests)
    assert batch.counts["ok"] == 64, [o.error for o in batch.outcomes if o.outcome != Outcome.OK]
    assert [o.request.request_id for o in batch.outcomes] == [r.request_id for r in requests]
    for o in batch.outcomes:
        assert o.reward == expected_reward(o.request.payload)
        assert o.result.input_id == o.request.input_id
        assert (
            o.result.trajectory["messages"][0]["content"]
            == f"{o.request.payload['a']}+{o.request.payload['b']}"
        )
    assert (
        sorted(emu.sessions.stopped) == sorted(emu.sessions.started)
        and len(emu.sessions.started) == 64
    )
    assert batch.api_calls["bedrock-agentcore:InvokeAgentRuntime"] == 64
    assert batch.api_calls["bedrock-agentcore:StopRuntimeSession"] == 64
    metrics = batch.metrics()
    assert metrics["rollout/outcome/ok"] == 64 and metrics["rollout/outcome/timeout"] == 0
    assert metrics["rollout/reward_mean"] == sum(o.reward for o in batch.outcomes) / 64
    assert 0 < metrics["rollout/latency_p50"] <= metrics["rollout/latency_p99"]
    assert metrics["rollout/api_calls_per_rollout"] >= 3  # invoke, stop, get (+ shared SQS)


async def test_starts_in_flight_through_a_cold_start_are_not_held_to_a_connection_pool(
    moto, channel, emulator
):
    """The invocation that creates a session holds its connection through the cold start: the
    engine's own bound on starts in flight (start rate x session_start_time) must reach the
    runtime, not a smaller pool of connections under it (64 held a 15 s cold start to
    64 / 15 = 4.3 starts a second, bench/warm.py)."""
    emu = await emulator(cold_start=2.0, new_sessions_per_second=None)
    cfg = engine_config(
        moto, channel, emu, start_rate=200.0, session_start_time=3.0, max_live_sessions=200
    )
    async with RolloutEngine(cfg) as engine:
        batch = await engine.rollout(_requests(150))
    assert batch.counts["ok"] == 150
    assert emu.sessions.starting.peak > 100, emu.sessions.starting.peak  # not 64 at most
