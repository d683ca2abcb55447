"""Sessions started ahead of their requests, per environment: a step's rollouts then start at
the call rate, not at the new-session quota's pace (docs/limits.md#warm-sessions).

A warm session holds its live slot from its warm-up on. A request takes a parked one, or
waits for one under way rather than starting a second session beside it; one whose warm-up
failed, or that waited past its start deadline, starts cold. Each serves one rollout, of its
warm-up's step (`LiveSession.priority`) or a later one: a step's warm-ups are never taken by
the requests of the step before, still arriving as they start.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass

from .start_queue import LiveSession


class WarmPool:
    """Parked warm sessions and the requests waiting for one, by environment."""

    def __init__(self) -> None:
        self._parked: dict[str | None, deque[LiveSession]] = {}
        self._waiting: dict[str | None, deque[_Waiter]] = {}
        self._pending: Counter[tuple[str | None, int]] = Counter()

    def parked(self, environment: str | None) -> int:
        return len(self._parked.get(environment, ()))

    def parked_total(self) -> int:
        return sum(len(parked) for parked in self._parked.values())

    def held(self, environment: str | None, steps: range) -> int:
        """Warm sessions of `environment` parked or under way, warmed for one of `steps`."""
        parked = sum(s.priority in steps for s in self._parked.get(environment, ()))
        pending = self._pending.items()
        return parked + sum(n for (env, at), n in pending if env == environment and at in steps)

    def pending_total(self) -> int:
        return sum(self._pending.values())

    def begun(self, session: LiveSession) -> None:
        """A warm-up is under way, for requests of its step or later."""
        self._pending[session.environment, session.priority] += 1

    async def take(
        self, environment: str | None, start_deadline: float, step: int
    ) -> LiveSession | None:
        """A warm session for a request of `environment` and `step`: a parked one, else the
        next one under way (until `start_deadline`); None: start cold."""
        parked = self._parked.get(environment, deque())
        for i, session in enumerate(parked):
            if session.priority <= step:
                del parked[i]
                return session
        for_it = sum(
            n for (env, at), n in self._pending.items() if env == environment and at <= step
        )
        if for_it <= len(self._waiting.get(environment, ())):
            return None  # every warm-up under way it may take is promised to an earlier request
        waiter = _Waiter(step, asyncio.get_running_loop().create_future())
        self._waiting.setdefault(environment, deque()).append(waiter)
        try:
            async with asyncio.timeout(max(0.0, start_deadline - time.time())):
                return await waiter.found
        except TimeoutError:
            return self._gave_up(environment, waiter)
        except asyncio.CancelledError:
            self._gave_up(environment, waiter)
            raise

    def _gave_up(self, environment: str | None, waiter: _Waiter) -> None:
        if waiter in self._waiting.get(environment, ()):
            self._waiting[environment].remove(waiter)
        found = waiter.found
        if found.done() and not found.cancelled() and (session := found.result()) is not None:
            self._park_or_hand(session)  # handed over just as we gave up: the next request's

    def ready(self, session: LiveSession) -> None:
        """A warm-up succeeded: to the first request of its step or later waiting, else parked."""
        self._pending[session.environment, session.priority] -= 1
        session.warm_since = time.time()
        self._park_or_hand(session)

    def _park_or_hand(self, session: LiveSession) -> None:
        for waiter in _pop_live(self._waiting.get(session.environment, deque()), session.priority):
            waiter.found.set_result(session)
            return
        self._parked.setdefault(session.environment, deque()).append(session)

    def failed(self, session: LiveSession) -> None:
        """A warm-up failed: the request of its step or later waiting longest starts cold."""
        self._pending[session.environment, session.priority] -= 1
        for waiter in _pop_live(self._waiting.get(session.environment, deque()), session.priority):
            waiter.found.set_result(None)
            return

    def withdraw(self, session: LiveSession) -> bool:
        """Take `session` out if it is parked (to be stopped); False: a request took it."""
        parked = self._parked.get(session.environment, deque())
        for i, candidate in enumerate(parked):
            if candidate is session:
                del parked[i]
                return True
        return False

    def drain(self) -> list[LiveSession]:
        """Every parked session, taken out (to be stopped)."""
        out = [s for parked in self._parked.values() for s in parked]
        self._parked.clear()
        return out


@dataclass(eq=False)
class _Waiter:
    step: int
    found: asyncio.Future[LiveSession | None]


def _pop_live(waiting: deque[_Waiter], warmed_for: int) -> Iterator[_Waiter]:
    """Waiters still waiting that may take a session warmed for step `warmed_for`, in order,
    each taken out as it is yielded."""
    for waiter in list(waiting):
        if waiter.found.done():
            waiting.remove(waiter)
        elif waiter.step >= warmed_for:
            waiting.remove(waiter)
            yield waiter
