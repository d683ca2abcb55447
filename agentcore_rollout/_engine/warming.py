"""When to start the warm-ups a trainer asks for a step (`RolloutEngine.warm`): so that the
last is ready as the step begins, by the pace of the steps so far, and not before, since a
parked session costs its memory by the second (docs/limits.md#warm-sessions)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

MARGIN = 2.0
"""Seconds of slack on top of the warm-ups' ramp and cold start, or 5% of the ramp if more:
a loaded start quota (a cut after a throttle) or a step that begins early."""


def lead_time(n: int, start_rate: float, session_start_time: float) -> float:
    """Seconds `n` warm-ups take to be ready when they have the new-session quota to themselves."""
    ramp = n / max(start_rate, 1e-9)
    return ramp + session_start_time + max(MARGIN, 0.05 * ramp)


class WarmPlan:
    """The warm-ups wanted per step and environment, each step's started by a timer at its
    expected start less their lead time. The expected start is the last step's start plus
    the last step's length; before two steps have begun it is unknown, and a step's warm-ups
    start when they are asked for."""

    def __init__(
        self,
        step: int,
        start: Callable[[int, str | None, int], int],
        lead: Callable[[int], float],
    ) -> None:
        self._start = start  # (n, environment, step) -> warm-ups started
        self._lead = lead  # n -> seconds n warm-ups take to be ready
        self._began = {step: time.monotonic()}
        self._wanted: dict[int, dict[str | None, int]] = {}
        self._timers: dict[int, asyncio.TimerHandle] = {}

    def ask(self, n: int, environment: str | None, step: int) -> int:
        """`n` sessions of `environment` ready as `step` begins (a later ask replaces an earlier
        one's `n`); returns how many started now."""
        wanted = self._wanted.setdefault(step, {})
        wanted[environment] = n
        begins = self.expected_start(step)
        at = None if begins is None else begins - self._lead(sum(wanted.values()))
        if at is None or at <= time.monotonic():
            return self._fire(step).get(environment, 0)
        if (timer := self._timers.pop(step, None)) is not None:
            timer.cancel()
        loop = asyncio.get_running_loop()
        self._timers[step] = loop.call_at(loop.time() + at - time.monotonic(), self._fire, step)
        return 0

    def began(self, step: int) -> None:
        """`step` began: what was wanted for it and is not yet started starts now (late)."""
        self._began[step] = time.monotonic()
        for each in [s for s in self._wanted if s <= step]:
            self._fire(each)
        for old in [s for s in self._began if s < step - 1]:
            del self._began[old]

    def expected_start(self, step: int) -> float | None:
        """When `step` should begin (monotonic seconds), at the pace of the last two steps
        begun; None before two have."""
        if len(self._began) < 2:
            return None
        before, last = sorted(self._began)[-2:]
        pace = (self._began[last] - self._began[before]) / (last - before)
        return self._began[last] + (step - last) * pace

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self._wanted.clear()

    def _fire(self, step: int) -> dict[str | None, int]:
        if (timer := self._timers.pop(step, None)) is not None:
            timer.cancel()
        return {env: self._start(n, env, step) for env, n in self._wanted.pop(step, {}).items()}
