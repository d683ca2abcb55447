"""Requests of several steps in flight at once, bounded by `engine.limits.max_staleness`,
through the real wire: a request may end ok while the current step is at most `max_staleness`
past its own; `set_step` ends older ones still running `stale` and stops their sessions, or,
with `stale_policy` `keep`, lets them run to their end. Waiting requests are admitted oldest
step first."""

from __future__ import annotations

import asyncio
import time

import pytest

from agentcore_rollout import Outcome, RolloutEngine, RolloutRequest

from .agents.basic import controls, expected_reward
from .conftest import engine_config
from .factories import make_result, signed_body

pytestmark = pytest.mark.component


async def test_results_one_step_old_are_kept_two_steps_old_go_stale(moto, channel, emulator):
    emu = await emulator()
    async with RolloutEngine(engine_config(moto, channel, emu, max_staleness=1)) as engine:
        old = engine.submit(RolloutRequest({"a": 1, "b": 1, "mode": "hang"}, input_id="old"))
        await _until(lambda: old.request.request_id in controls)
        engine.set_step(1)
        kept = engine.submit(RolloutRequest({"a": 2, "b": 1, "sleep": 1.0}, input_id="kept"))
        await _until(lambda: kept.request.request_id in controls)
        assert not old.done()  # one step behind: still running
        engine.set_step(2)
        stale, one_behind = await old, await kept
        with pytest.raises(ValueError, match="no older than 1"):
            engine.submit(RolloutRequest({"a": 1, "b": 1}, input_id="late"), step=0)
        with pytest.raises(ValueError, match="engine's step 2"):
            engine.submit(RolloutRequest({"a": 1, "b": 1}, input_id="ahead"), step=3)
        # Its agent was stopped mid-run; a result written anyway is kept apart, never delivered.
        control = controls[old.request.request_id]
        body = signed_body(
            make_result(
                exp_id="exp1",
                request_id=control.request_id,
                input_id="old",
                session_id=control.session_id,
                rewards=0.5,
            ),
            control.sig_key,
        )
        moto.client("s3").put_object(Bucket=channel.bucket, Key=control.result.key, Body=body)
        await _until(lambda: engine.stats().late_results >= 1)
        late = engine.take_late()
    assert stale.outcome is Outcome.STALE and stale.step == 0 and stale.result is None
    assert "2 behind the current step 2" in (stale.error or "")
    assert one_behind.outcome is Outcome.OK and one_behind.step == 1
    assert one_behind.reward == expected_reward(one_behind.request.payload)
    assert [(r.request_id, r.step) for r in late] == [(old.request.request_id, 0)]
    assert sorted(emu.sessions.stopped) == sorted(emu.sessions.started)


async def test_by_default_a_new_step_ends_every_older_request_even_unstarted(
    moto, channel, emulator
):
    emu = await emulator()
    cfg = engine_config(moto, channel, emu, max_live_sessions=1)  # max_staleness=0
    async with RolloutEngine(cfg) as engine:
        running = engine.submit(RolloutRequest({"a": 1, "b": 1, "mode": "hang"}, input_id="r"))
        queued = engine.submit(RolloutRequest({"a": 2, "b": 2}, input_id="q"))  # waits for a slot
        await _until(lambda: running.request.request_id in controls)
        engine.set_step(1)
        ended = [await running, await queued]
        fresh = await engine.submit(RolloutRequest({"a": 3, "b": 3}, input_id="f"))
    assert [o.outcome for o in ended] == [Outcome.STALE, Outcome.STALE]
    assert fresh.outcome is Outcome.OK and fresh.step == 1
    assert not any(
        queued.request.request_id in sid for sid in emu.sessions.started
    )  # never started
    assert sorted(emu.sessions.stopped) == sorted(emu.sessions.started)


async def test_keep_lets_requests_of_any_older_step_run_and_end_ok(moto, channel, emulator):
    emu = await emulator()
    cfg = engine_config(moto, channel, emu, max_staleness=1, stale_policy="keep")
    async with RolloutEngine(cfg) as engine:
        long = engine.submit(RolloutRequest({"a": 1, "b": 2, "sleep": 1.5}, input_id="long"))
        await _until(lambda: long.request.request_id in controls)
        engine.set_step(3)
        assert not long.done()  # three steps behind, bound 1: still running under `keep`
        late = engine.submit(RolloutRequest({"a": 2, "b": 2}, input_id="late"), step=0)
        with pytest.raises(ValueError, match="engine's step 3"):
            engine.submit(RolloutRequest({"a": 1, "b": 1}, input_id="ahead"), step=4)
        ended = [await long, await late]
    assert [(o.outcome, o.step) for o in ended] == [(Outcome.OK, 0), (Outcome.OK, 0)]
    assert [o.reward for o in ended] == [expected_reward(o.request.payload) for o in ended]


async def test_waiting_requests_are_admitted_oldest_step_first(moto, channel, emulator):
    emu = await emulator()
    cfg = engine_config(moto, channel, emu, max_live_sessions=1, stale_policy="keep")
    async with RolloutEngine(cfg) as engine:
        busy = engine.submit(RolloutRequest({"a": 1, "b": 1, "sleep": 0.5}, input_id="busy"))
        await _until(lambda: busy.request.request_id in controls)
        engine.set_step(2)
        waiting = [  # in the order they queue for the one live-session slot
            engine.submit(RolloutRequest({"a": 1, "b": 1}, input_id=name), step=step)
            for name, step in [("new-a", 2), ("old", 0), ("new-b", 2), ("mid", 1)]
        ]
        ended = [await h for h in [busy, *waiting]]
    assert all(o.outcome is Outcome.OK for o in ended)
    order = sorted(ended[1:], key=lambda o: o.started_at or 0.0)
    assert [o.request.input_id for o in order] == ["old", "mid", "new-a", "new-b"]


async def test_set_step_never_goes_back(moto, channel, emulator):
    emu = await emulator()
    async with RolloutEngine(engine_config(moto, channel, emu), step=3) as engine:
        with pytest.raises(ValueError, match="behind the engine's step 3"):
            engine.set_step(2)
        assert engine.step == 3


async def _until(predicate, timeout: float = 15.0) -> None:
    give_up = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < give_up, "condition not reached in time"
        await asyncio.sleep(0.05)
