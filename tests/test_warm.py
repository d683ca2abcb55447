"""Warm sessions (`RolloutEngine.warm`): started ahead of their requests on the AgentCore
emulator through the real aiobotocore client; each serves one rollout in the session it warmed,
an unused one is stopped, one that ended meanwhile is a cold start, never a failed rollout, and
the emulator's new-session quota holds for warm-ups and cold starts together."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from agentcore_rollout import Outcome, RolloutEngine, RolloutRequest, RolloutStart

from .conftest import engine_config
from .factories import dies_before_stopping

pytestmark = pytest.mark.component


def _requests(n: int, **user: object) -> list[RolloutRequest]:
    return [RolloutRequest({"a": i, "b": 1, **user}, input_id=f"q{i}") for i in range(n)]


async def _until(predicate: Callable[[], bool]) -> None:
    async with asyncio.timeout(30):
        while not predicate():  # noqa: ASYNC110 (gauges and ledgers, not events)
            await asyncio.sleep(0.02)


async def _parked(engine: RolloutEngine, n: int) -> None:
    await _until(lambda: engine.stats().warm_parked >= n)


async def test_warm_sessions_serve_one_rollout_each_in_the_session_they_warmed(
    moto, channel, emulator
):
    emu = await emulator()
    cfg = engine_config(moto, channel, emu, warm=8)
    async with RolloutEngine(cfg) as engine:
        assert engine.warm(4) == 4
        await _parked(engine, 4)
        warmed = list(emu.sessions.started)
        assert len(warmed) == 4 and all("-warm-" in sid for sid in warmed)
        batch = await engine.rollout(_requests(6))
        stats = engine.stats()
    assert batch.counts["ok"] == 6
    on_warm = [o for o in batch.outcomes if "-warm-" in o.session_id]
    assert sorted(o.session_id for o in on_warm) == sorted(warmed)  # one rollout each
    assert all(o.reward is not None for o in on_warm)
    assert len(emu.sessions.started) == 6  # 4 warmed + 2 cold: no session started twice
    assert (stats.warm_started, stats.warm_used, stats.warm_missed) == (4, 4, 0)
    assert stats.warm_idle_seconds > 0


async def test_unused_warm_sessions_are_stopped_at_close_and_when_idle_too_long(
    moto, channel, emulator
):
    emu = await emulator()
    cfg = engine_config(moto, channel, emu, warm="auto", warm_max_idle=0.2)
    async with RolloutEngine(cfg) as engine:
        engine.warm(3)
        await _parked(engine, 3)
        await asyncio.sleep(0.3)
        engine.warm(2)  # the three idle past warm_max_idle are stopped first
        await _parked(engine, 2)
        assert engine.stats().warm_stopped == 3
    assert sorted(emu.sessions.stopped) == sorted(emu.sessions.started)  # none left
    assert len(emu.sessions.started) == 5


async def test_a_warm_session_idle_past_warm_max_idle_is_stopped_without_another_warm_call(
    moto, channel, emulator
):
    """The trainer may never call warm() again (its last step, a pause): the idle bound holds
    all the same, and the stopped session's live slot is free again."""
    emu = await emulator()
    cfg = engine_config(moto, channel, emu, warm=2, warm_max_idle=0.3)
    async with RolloutEngine(cfg) as engine:
        engine.warm(2)
        await _parked(engine, 2)
        await _until(lambda: engine.stats().warm_stopped == 2)
        await _until(lambda: engine.stats().live_sessions == 0)
        assert engine.stats().warm_parked == 0
    assert sorted(emu.sessions.stopped) == sorted(emu.sessions.started)
    assert emu.sessions.expired == []  # stopped by the engine, not ended by the runtime


async def test_a_warm_session_that_ended_is_a_cold_start_never_a_failed_rollout(
    moto, channel, emulator
):
    emu = await emulator(idle_timeout=0.3)  # the runtime ends idle sessions quickly
    cfg = engine_config(moto, channel, emu, warm=2)
    async with RolloutEngine(cfg) as engine:
        engine.warm(2)
        await _parked(engine, 2)
        await _until(lambda: len(emu.sessions.expired) >= 2)
        batch = await engine.rollout(_requests(2))
        stats = engine.stats()
    assert batch.counts["ok"] == 2
    assert (stats.warm_used, stats.warm_missed) == (2, 2)


async def test_warm_ups_and_cold_starts_keep_to_the_new_session_quota_together(
    moto, channel, emulator
):
    emu = await emulator(new_sessions_per_second=10.0)  # refuses beyond 10 new sessions/s
    cfg = engine_config(moto, channel, emu, warm="auto", start_rate=10.0)
    async with RolloutEngine(cfg) as engine:
        began = time.monotonic()
        engine.warm(12)
        batch = await engine.rollout(_requests(24))
        took = time.monotonic() - began
        stats = engine.stats()
    assert batch.counts["ok"] == 24
    assert stats.throttles == 0  # the emulator never refused a new session
    assert len(emu.sessions.started) == 24 and stats.warm_used == 12
    assert took >= (24 - 2) / 10  # 24 new sessions at 10/s, a tenth of a second of burst


async def test_warm_tops_up_to_n_so_a_pipelined_trainer_keeps_a_pool_of_that_size(
    moto, channel, emulator
):
    emu = await emulator()
    cfg = engine_config(moto, channel, emu)  # engine.dispatch.warm: auto, the default
    async with RolloutEngine(cfg) as engine:
        assert engine.warm(3) == 3
        assert engine.warm(3) == 0  # three are under way already
        await _parked(engine, 3)
        await engine.rollout(_requests(2))
        assert engine.warm(3) == 2  # two were taken: topped up again
        await _parked(engine, 3)
        stats = engine.stats()
    assert (stats.warm_started, stats.warm_used) == (5, 2)
    assert len(emu.sessions.started) == 5


async def test_a_steps_warm_ups_are_never_taken_by_the_step_before(moto, channel, emulator):
    """As `train` does, each step asks for the next one's sessions as its own requests are
    still arriving, some of them to take its own parked warm sessions: each step's requests
    take the sessions warmed for it, never the next step's."""
    emu = await emulator()
    cfg = engine_config(moto, channel, emu)
    async with RolloutEngine(cfg) as engine:
        steps = []
        for step in range(3):
            engine.set_step(step)
            running = [engine.submit(r) for r in _requests(4, step=step)]
            if step < 2:  # step 1's at once (the first step), step 2's timed by step 1's measures
                engine.warm(4, step=step + 1)
            steps.append(await asyncio.gather(*running))
            if step < 2:
                await _parked(engine, 4)
        stats = engine.stats()
    assert [o.outcome.value for o in steps[0] + steps[1] + steps[2]] == ["ok"] * 12
    assert not any("-warm-" in o.session_id for o in steps[0])
    assert all("-warm-" in o.session_id for o in steps[1] + steps[2])
    assert (stats.warm_started, stats.warm_used, stats.warm_missed) == (8, 8, 0)


async def test_a_steps_warm_ups_and_the_step_before_keep_to_the_live_session_quota_together(
    moto, channel, emulator
):
    """Asked for at the start of the step before, the next step's warm-ups wait for its
    sessions' slots: the emulator never refuses one for its active-session quota."""
    emu = await emulator(max_sessions=8)
    cfg = engine_config(moto, channel, emu, max_live_sessions=8)
    async with RolloutEngine(cfg) as engine:
        step0 = [engine.submit(r) for r in _requests(8, sleep=0.2)]
        engine.warm(8, step=1)
        first = await asyncio.gather(*step0)
        await _parked(engine, 8)
        engine.set_step(1)
        second = await engine.rollout(_requests(8, step=1))
        stats = engine.stats()
    assert [o.outcome.value for o in [*first, *second.outcomes]] == ["ok"] * 16
    assert stats.peak_live_sessions == 8 and stats.invoke_errors == {}, (
        stats.max_live_sessions,
        stats.pool_limits,
        stats.invoke_errors,
        engine.quotas,
    )
    assert (stats.warm_started, stats.warm_used, stats.warm_missed) == (8, 8, 0)


# -- faults: a warm session is the engine's like any other, whatever ends its rollout --------


async def test_a_warm_session_whose_rollout_is_cancelled_or_staled_is_stopped(
    moto, channel, emulator
):
    """A rollout that took a warm session and ends without its result (cancelled by the
    trainer, staled by `set_step`) stops that session then, not at the engine's close."""
    emu = await emulator()
    cfg = engine_config(moto, channel, emu, warm=2, max_staleness=0, stale_policy="end")
    async with RolloutEngine(cfg) as engine:
        engine.warm(2)
        await _parked(engine, 2)
        cancelled, staled = (engine.submit(r) for r in _requests(2, sleep=30))
        await _until(lambda: emu.counts["invoke"] == 4)  # 2 warm-ups, then both rollouts
        cancelled.cancel()
        outcomes = [await cancelled]
        engine.set_step(1)
        outcomes.append(await staled)
        await _until(lambda: len(emu.sessions.stopped) == 2)
        assert engine.stats().live_sessions == 0
    assert [o.outcome for o in outcomes] == [Outcome.CANCELLED, Outcome.STALE]
    assert sorted(o.session_id for o in outcomes) == sorted(emu.sessions.started)  # the warm
    assert all("-warm-" in sid for sid in emu.sessions.started)


async def test_a_crash_leaves_no_warm_session_past_the_runtimes_idle_timeout(
    moto, channel, emulator
):
    """The engine's process dies with warm sessions parked: nothing stops them, and the
    runtime's idle timeout ends them."""
    emu = await emulator(idle_timeout=0.5)
    engine = RolloutEngine(engine_config(moto, channel, emu, warm=3))
    await engine.start()
    engine.warm(3)
    await _parked(engine, 3)

    dies_before_stopping(engine)
    await engine.aclose()
    assert emu.sessions.stopped == [] and len(emu.sessions) == 3
    await _until(lambda: len(emu.sessions) == 0)
    assert sorted(emu.sessions.expired) == sorted(emu.sessions.started)


async def test_resume_takes_over_a_rollout_running_on_a_warm_session(moto, channel, emulator):
    """The journal records the warm session a rollout ran in: a new engine resumes it there,
    collects its result and stops it; the agent runs once and no other session starts."""
    emu = await emulator()
    cfg = engine_config(moto, channel, emu, warm=1, run_secret="s" * 32)
    (request,) = _requests(1, sleep=2)
    first = RolloutEngine(cfg)
    await first.start()
    first.warm(1)
    await _parked(first, 1)
    journaled: list[RolloutStart] = []
    first.submit(request, on_start=journaled.append)
    await _until(lambda: bool(journaled) and emu.counts["invoke"] == 2)

    dies_before_stopping(first)
    await first.aclose()
    (warm,) = emu.sessions.started
    assert "-warm-" in warm and journaled[0].session_id == warm and not emu.sessions.stopped
    async with RolloutEngine(cfg) as second:
        outcome = await second.resume(journaled[0])
    assert outcome.outcome is Outcome.OK and outcome.session_id == warm
    assert emu.counts["invoke"] == 2  # the warm-up and the rollout: nothing run again
    assert emu.sessions.started == [warm] and emu.sessions.stopped == [warm]
