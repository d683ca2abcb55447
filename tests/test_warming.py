"""`WarmPlan`: a step's warm-ups start at its expected start less their lead time: once the
step before has ended, that end plus the last update; before, at the pace of the steps so
far; for the first step, once its requests have ended; and at once when the step begins."""

from __future__ import annotations

import asyncio

import pytest

from agentcore_rollout._engine.warming import WarmPlan, lead_time

pytestmark = pytest.mark.unit


def _plan(lead: float = 0.1) -> tuple[WarmPlan, list[tuple[int, str | None, int]]]:
    started: list[tuple[int, str | None, int]] = []

    def start(n: int, environment: str | None, step: int) -> int:
        started.append((n, environment, step))
        return n

    return WarmPlan(0, start, lambda n: lead), started


async def test_the_first_steps_warm_ups_start_once_its_requests_have_ended():
    plan, started = _plan()
    assert plan.ask(3, None, 1) == 0 and plan.expected_start(1) is None
    plan.ended(0)
    assert started == [(3, None, 1)]


async def test_before_a_step_ends_warm_ups_start_by_the_pace_of_the_steps_so_far():
    plan, started = _plan(lead=0.2)
    await asyncio.sleep(0.5)
    plan.began(1)  # a step takes 0.5 s: step 2 is expected 0.5 s from now
    assert plan.ask(2, "env-a", 2) == 0 and plan.ask(3, "env-b", 2) == 0
    await asyncio.sleep(0.15)
    assert started == []  # not before 0.3 s: they would only wait, at a cost
    await asyncio.sleep(0.3)
    assert sorted(started) == [(2, "env-a", 2), (3, "env-b", 2)]


async def test_a_step_that_ends_early_moves_its_successors_warm_ups_by_the_last_update():
    plan, started = _plan(lead=0.1)
    await asyncio.sleep(0.6)
    plan.ended(0)
    await asyncio.sleep(0.2)
    plan.began(1)  # a 0.6 s step, a 0.2 s update: by the pace, step 2 in 0.8 s
    plan.ask(4, None, 2)
    await asyncio.sleep(0.1)
    plan.ended(1)  # a short step: step 2 expected 0.2 s from now, its warm-ups in 0.1 s
    await asyncio.sleep(0.25)
    assert started == [(4, None, 2)]
    await asyncio.sleep(0.6)
    assert started == [(4, None, 2)]  # the pace's timer was replaced, not added to


async def test_a_later_ask_replaces_the_number_and_a_step_that_began_early_starts_its_own():
    plan, started = _plan(lead=0.1)
    await asyncio.sleep(0.4)
    plan.began(1)
    plan.ask(2, None, 2)
    plan.ask(5, None, 2)  # the batch grew
    plan.began(2)  # early: before the timer
    assert started == [(5, None, 2)]
    await asyncio.sleep(0.5)
    assert started == [(5, None, 2)]  # the timer did not start them twice
    plan.close()


def test_the_lead_time_is_the_ramp_at_the_start_rate_the_cold_start_and_a_margin():
    assert lead_time(250, 25.0, 2.0) == pytest.approx(10 + 2 + 2)
    assert lead_time(2_000, 25.0, 15.0) == pytest.approx(80 + 15 + 4)
