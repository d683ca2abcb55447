"""When to start the warm-ups a trainer asks for a step (`RolloutEngine.warm`): so that the
last is ready as the step begins, and not long before, since a parked session costs its
memory by the second (docs/limits.md#warm-sessions)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

MARGIN = 2.0
"""Seconds of slack on top of the warm-ups' ramp and cold start, or 5% of the ramp if more:
a start rate cut after a throttle, a step that begins early."""
RECHECK = 5.0
"""A step's timer re-plans at least this often: the lead grows when a throttle cuts the start
rate after the ask."""


def lead_time(n: int, start_rate: float, session_start_time: float) -> float:
    """Seconds `n` warm-ups take to be ready when they have the new-session quota to themselves."""
    ramp = n / max(start_rate, 1e-9)
    return ramp + session_start_time + max(MARGIN, 0.05 * ramp)


class WarmPlan:
    """The warm-ups wanted per step and environment, each step's started by a timer at its
    expected start less their lead time.

    A step is expected to begin one update after the step before ends: once that step's
    requests have all ended, at that moment plus the last update's length; before, at its
    start plus its rollouts' run and the update, both as the last step measured them. A
    rollout's run counts from the step's last session start, not its first: a cold step's
    ramp at the new-session quota is what warm sessions remove, so its whole length would
    time the next warm-ups late. What is not measured yet counts as 0 (the first step's
    warm-ups start when asked): early costs idle memory, late costs the trainer's time."""

    def __init__(
        self,
        step: int,
        start: Callable[[int, str | None, int], int],
        lead: Callable[[int], float],
    ) -> None:
        self._start = start  # (n, environment, step) -> warm-ups started
        self._lead = lead  # n -> seconds n warm-ups take to be ready
        self._began = {step: time.time()}
        self._last_start: dict[int, float] = {}  # step -> its latest session start
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
        self._began[step] = time.time()
        for each in [s for s in self._wanted if s <= step]:
            self._fire(each)
        for measured in (self._began, self._last_start, self._ended):
            for old in [s for s in measured if s < step - 1]:
                del measured[old]

    def request_ended(self, step: int, started_at: float | None) -> None:
        if started_at is not None:
            self._last_start[step] = max(started_at, self._last_start.get(step, started_at))

    def ended(self, step: int) -> None:
        """The last request of `step` ended: the next step's start is known better now."""
        self._ended[step] = time.time()
        for each in list(self._wanted):
            self._plan(each)

    def expected_start(self, step: int) -> float:
        """When `step` should begin (unix seconds), by what the steps so far measured."""
        last = max(self._began)
        if step <= last:
            return self._began[last]
        before = last - 1
        update = self._began[last] - self._ended[before] if before in self._ended else 0.0
        if last in self._ended:
            end = self._ended[last]
        elif before in self._ended and before in self._last_start:
            end = self._began[last] + self._ended[before] - self._last_start[before]
        else:
            end = self._began[last]
        return end + (step - last) * update

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self._wanted.clear()

    def _plan(self, step: int) -> dict[str | None, int]:
        """Start `step`'s warm-ups now if their time has come, else (re)set their timer."""
        if step not in self._wanted:
            return {}
        at = self.expected_start(step) - self._lead(sum(self._wanted[step].values()))
        if at <= time.time():
            return self._fire(step)
        if (timer := self._timers.pop(step, None)) is not None:
            timer.cancel()
        self._timers[step] = asyncio.get_running_loop().call_later(
            min(at - time.time(), RECHECK), self._plan, step
        )
        return {}

    def _fire(self, step: int) -> dict[str | None, int]:
        if (timer := self._timers.pop(step, None)) is not None:
            timer.cancel()
        return {env: self._start(n, env, step) for env, n in self._wanted.pop(step, {}).items()}
