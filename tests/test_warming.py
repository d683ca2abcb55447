"""`WarmPlan`: a step's warm-ups start at its expected start less their lead time: one
update after the step before ends, as the last step measured its rollouts' run (from its last
session start) and the update, and once the step before has ended, by that end; at once for
the first step, or once the step has begun."""

from __future__ import annotations

import asyncio
import time

import pytest

from agentcore_rollout._engine import warming
from agentcore_rollout._engine.warming import WarmPlan, lead_time

pytestmark = pytest.mark.unit


def _plan(lead: float = 0.1) -> tuple[WarmPlan, list[tuple[int, str | None, int]]]:
    started: list[tuple[int, str | None, int]] = []

    def start(n: int, environment: str | None, step: int) -> int:
        started.append((n, environment, step))
        return n

    return WarmPlan(0, start, lambda n: lead), started


async def _first_step(plan: WarmPlan, ramp: float, run: float, update: float) -> None:
    """Step 0: its last session starts `ramp` s in, runs `run` s; then an update."""
    began = time.time()
    await asyncio.sleep(ramp + run)
    plan.request_ended(0, began + ramp)
    plan.request_ended(0, began)
    plan.ended(0)
    await asyncio.sleep(update)
    plan.began(1)


async def test_the_first_steps_warm_ups_start_when_asked():
    plan, started = _plan()
    assert plan.ask(3, None, 1) == 3
    assert started == [(3, None, 1)]


async def test_warm_ups_start_one_run_and_update_after_the_step_less_their_lead():
    plan, started = _plan(lead=0.2)
    # a cold step: 0.3 s of ramp, a 0.3 s run, a 0.3 s update; a warm step is 0.6 s, start
    # to start, not 0.9 s
    await _first_step(plan, ramp=0.3, run=0.3, update=0.3)
    assert plan.ask(2, "env-a", 2) == 0 and plan.ask(3, "env-b", 2) == 0
    await asyncio.sleep(0.25)
    assert started == []  # not before 0.4 s: they would only wait, at a cost
    await asyncio.sleep(0.3)
    assert sorted(started) == [(2, "env-a", 2), (3, "env-b", 2)]


async def test_a_step_that_runs_long_moves_its_successors_warm_ups_to_its_end():
    plan, started = _plan(lead=0.1)
    await _first_step(plan, ramp=0.0, run=0.2, update=0.2)
    plan.ask(4, None, 2)  # expected 0.4 s from now, to start in 0.3 s
    await asyncio.sleep(0.1)
    plan.request_ended(1, time.time())  # a straggler: step 1 has not ended
    await asyncio.sleep(0.1)
    assert started == []
    await asyncio.sleep(0.3)
    assert started == [(4, None, 2)]  # by the estimate: step 1 running long was not known


async def test_a_start_rate_cut_after_the_ask_moves_them_earlier(monkeypatch):
    monkeypatch.setattr(warming, "RECHECK", 0.05)
    lead = [0.1]
    started: list[tuple[int, str | None, int]] = []
    plan = WarmPlan(0, lambda n, env, step: started.append((n, env, step)) or n, lambda n: lead[0])
    await _first_step(plan, ramp=0.0, run=0.4, update=0.5)
    plan.ask(4, None, 2)  # step 2 expected 0.9 s from now, its warm-ups in 0.8 s
    lead[0] = 0.7  # a throttle cut the start rate: their ramp is longer now
    await asyncio.sleep(0.5)
    assert started == [(4, None, 2)]  # at 0.2 s, not 0.8 s


async def test_a_step_that_ends_early_moves_them_by_the_last_update():
    plan, started = _plan(lead=0.1)
    await _first_step(plan, ramp=0.0, run=0.6, update=0.3)
    plan.ask(4, None, 2)  # by the estimate: 0.9 s from now, to start in 0.8 s
    await asyncio.sleep(0.1)
    plan.ended(1)  # a short step: step 2 expected 0.3 s from now, its warm-ups in 0.2 s
    await asyncio.sleep(0.3)
    assert started == [(4, None, 2)]
    await asyncio.sleep(0.7)
    assert started == [(4, None, 2)]  # the estimate's timer was replaced, not added to


async def test_a_later_ask_replaces_the_number_and_a_step_that_began_early_starts_its_own():
    plan, started = _plan(lead=0.1)
    await _first_step(plan, ramp=0.0, run=0.3, update=0.3)
    plan.ask(2, None, 2)
    plan.ask(5, None, 2)  # the batch grew
    plan.began(2)  # early: before the timer
    assert started == [(5, None, 2)]
    await asyncio.sleep(0.7)
    assert started == [(5, None, 2)]  # the timer did not start them twice
    plan.close()


def test_the_lead_time_is_the_ramp_at_the_start_rate_the_cold_start_and_a_margin():
    assert lead_time(250, 25.0, 2.0) == pytest.approx(10 + 2 + 2)
    assert lead_time(2_000, 25.0, 15.0) == pytest.approx(80 + 15 + 4)
