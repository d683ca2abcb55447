"""When to start the warm-ups a trainer asks for a step (`RolloutEngine.warm`): so that the
last is ready as the step begins, and not before, since a parked session costs its memory by
the second (docs/limits.md#warm-sessions)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

MARGIN = 2.0
"""Seconds of slack on top of the warm-ups' ramp and cold start, or 5% of the ramp if more:
a start rate cut after a throttle, a step that begins early."""


def lead_time(n: int, start_rate: float, session_start_time: float) -> float:
    """Seconds `n` warm-ups take to be ready when they have the new-session quota to themselves."""
    ramp = n / max(start_rate, 1e-9)
    return ramp + session_start_time + max(MARGIN, 0.05 * ramp)


class WarmPlan:
    """The warm-ups wanted per step and environment, each step's started by a timer at its
    expected start less their lead time.

    The expected start of the next step is, once this step's requests have all ended (the
    trainer updates), that moment plus the last update's length; before, this step's start
    plus the last step's length, start to start, which is all a step too long for its
    sessions to be ready in an update (2,048 at 25/s) has to go on. A step's length varies
    (a cold step is longer), so a timer set by the second is set again by the first when it
    is known. With neither known (the first step), they start once its requests have ended."""

    def __init__(
        self,
        step: int,
        start: Callable[[int, str | None, int], int],
        lead: Callable[[int], float],
    ) -> None:
        self._start = start  # (n, environment, step) -> warm-ups started
        self._lead = lead  # n -> seconds n warm-ups take to be ready
        self._began = {step: time.monotonic()}
        self._ended: dict[int, float] = {}  # step -> when its last request ended
        self._wanted: dict[int, dict[str | None, int]] = {}
        self._timers: dict[int, asyncio.TimerHandle] = {}

    def ask(self, n: int, environment: str | None, step: int) -> int:
        """`n` sessions of `environment` ready as `step` begins (a later ask replaces an earlier
        one's `n`); returns how many started now."""
        self._wanted.setdefault(step, {})[environment] = n
        return self._plan(step).get(environment, 0)

    def began(self, step: int) -> None:
        """`step` began: what was wanted for it and is not yet started starts now (late)."""
        self._began[step] = time.monotonic()
        for each in [s for s in self._wanted if s <= step]:
            self._fire(each)
        for old in [s for s in self._began if s < step - 1]:
            del self._began[old]
            self._ended.pop(old, None)

    def ended(self, step: int) -> None:
        """The last request of `step` ended: the next step's start is better known now."""
        self._ended[step] = time.monotonic()
        for each in list(self._wanted):
            self._plan(each)

    def expected_start(self, step: int) -> float | None:
        """When `step` should begin (monotonic seconds); None: not known yet."""
        last = max(self._began)
        if step <= last:
            return self._began[last]
        if step == last + 1 and last in self._ended:
            update = self._began[last] - self._ended.get(last - 1, self._began[last])
            return self._ended[last] + update
        if len(self._began) < 2:
            return None
        before = max(s for s in self._began if s < last)
        pace = (self._began[last] - self._began[before]) / (last - before)
        return self._began[last] + (step - last) * pace

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self._wanted.clear()

    def _plan(self, step: int) -> dict[str | None, int]:
        """Start `step`'s warm-ups now if their time has come, else (re)set their timer."""
        begins = self.expected_start(step)
        if begins is None:
            return {}
        at = begins - self._lead(sum(self._wanted[step].values()))
        if at <= time.monotonic():
            return self._fire(step)
        if (timer := self._timers.pop(step, None)) is not None:
            timer.cancel()
        loop = asyncio.get_running_loop()
        self._timers[step] = loop.call_at(loop.time() + at - time.monotonic(), self._fire, step)
        return {}

    def _fire(self, step: int) -> dict[str | None, int]:
        if (timer := self._timers.pop(step, None)) is not None:
            timer.cancel()
        return {env: self._start(n, env, step) for env, n in self._wanted.pop(step, {}).items()}
