"""Sessions started ahead of their requests, per environment: a step's rollouts then start at
the call rate, not at the new-session quota's pace (docs/limits.md#warm-sessions).

A warm session holds its live slot from its warm-up on. A request takes a parked one, or
waits for one under way rather than starting a second session beside it; one whose warm-up
failed, or that waited past its start deadline, starts cold. Each serves one rollout.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, deque
from collections.abc import Iterator

from .start_queue import LiveSession


class WarmPool:
    """Parked warm sessions and the requests waiting for one, by environment."""

    def __init__(self) -> None:
        self._parked: dict[str | None, deque[LiveSession]] = {}
        self._waiting: dict[str | None, deque[asyncio.Future[LiveSession | None]]] = {}
        self.pending: Counter[str | None] = Counter()
        """Warm-ups under way, by environment."""

    def parked(self, environment: str | None) -> int:
        return len(self._parked.get(environment, ()))

    def parked_total(self) -> int:
        return sum(len(parked) for parked in self._parked.values())

    async def take(self, environment: str | None, start_deadline: float) -> LiveSession | None:
        """A warm session for `environment`: a parked one, else the next one under way (until
        `start_deadline`); None: start cold."""
        parked = self._parked.get(environment)
        if parked:
            return parked.popleft()
        if self.pending[environment] <= len(self._waiting.get(environment, ())):
            return None  # every warm-up under way is promised to an earlier request
        waiter: asyncio.Future[LiveSession | None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(environment, deque()).append(waiter)
        try:
            async with asyncio.timeout(max(0.0, start_deadline - time.time())):
                return await waiter
        except TimeoutError:
            return self._gave_up(environment, waiter)
        except asyncio.CancelledError:
            self._gave_up(environment, waiter)
            raise

    def _gave_up(self, environment: str | None, waiter: asyncio.Future[LiveSession | None]) -> None:
        if waiter in self._waiting.get(environment, ()):
            self._waiting[environment].remove(waiter)
        if waiter.done() and not waiter.cancelled() and (session := waiter.result()) is not None:
            self.ready(session)  # handed over just as we gave up: the next request's

    def ready(self, session: LiveSession) -> None:
        """A warm-up succeeded: to the first request waiting, else parked."""
        if session.warm_since is None:
            session.warm_since = time.time()
        for waiter in _pop_live(self._waiting.get(session.environment)):
            waiter.set_result(session)
            return
        self._parked.setdefault(session.environment, deque()).append(session)

    def failed(self, environment: str | None) -> None:
        """A warm-up failed: the request waiting longest starts cold."""
        for waiter in _pop_live(self._waiting.get(environment)):
            waiter.set_result(None)
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


def _pop_live(
    waiting: deque[asyncio.Future[LiveSession | None]] | None,
) -> Iterator[asyncio.Future[LiveSession | None]]:
    while waiting:
        waiter = waiting.popleft()
        if not waiter.done():
            yield waiter
