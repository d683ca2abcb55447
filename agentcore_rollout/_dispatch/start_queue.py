"""StartQueue: the line of start attempts waiting for an endpoint, and where each goes.

Which attempt goes next and where is one decision, made each time a slot or a token frees, apart
from a session's life (the dispatcher only `claim`s an endpoint). Waiters go lowest step first,
to the least loaded endpoint that is free; once an attempt may have created its session, every
retry goes where it was sent. One environment's outage fails its own requests alone
(docs/failures.md#an-endpoint-is-down)."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .._flow import Gauge
from ..config import DispatchConfig
from ..contract import ENVIRONMENT_KEY
from ..runtimes.base import SessionCallError
from .endpoints import EARLY, EndpointState, Pool, RuntimeEndpoint, SubmitFailed

_T = TypeVar("_T")


@dataclass
class LiveSession:
    """One live-session slot and the session it holds (see `RequestDispatcher.live_session`)."""

    session_id: str
    start_deadline: float  # unix seconds: started by then, or SubmitFailed
    priority: int = 0  # slots go to the lowest first: the request's step (oldest first)
    maybe_started: bool = False
    """Some attempt may have created the session (sent, and not clearly refused), or it is an
    earlier engine's, still running: leaving the slot stops it."""
    sent_at: float | None = None
    """When the first attempt that may have created the session was sent (unix seconds): from
    then on it may cost, even if no attempt was accepted."""
    endpoint: str | None = None
    """The endpoint whose live slot it holds: where it may have started, and is stopped."""
    refused_on: set[str] = field(default_factory=set)
    """Endpoints that clearly refused an attempt (unreachable, throttled, full): its retries
    wait for the others while any of those is up, so it spends no retries on a dead one."""
    environment: str | None = None
    """The environment its request needs: it starts only on endpoints of it, once any endpoint
    names one (`StartQueue.serving`)."""
    warm_since: float | None = None
    """A session started ahead of its request (`RequestDispatcher.warm`): when its warm-up was
    answered (unix seconds); its rollout's invocation takes the call rate, not a start."""


@dataclass(order=True)
class _Waiter:
    priority: int
    arrival: int
    granted: asyncio.Future[EndpointState] = field(compare=False)
    session: LiveSession = field(compare=False)
    pinned: EndpointState | None = field(compare=False)


class StartQueue:
    """Hands each start attempt an endpoint with its start slot, live slot and tokens taken,
    lowest step first, over `endpoints` grouped into `pools`."""

    def __init__(
        self,
        endpoints: Sequence[RuntimeEndpoint],
        pools: Mapping[str, Pool],
        cfg: DispatchConfig,
    ) -> None:
        self.endpoints = {
            spec.name: EndpointState(spec, pools[spec.pool], cfg, self._outage_changed)
            for spec in endpoints
        }
        self._routed = any(e.environment is not None for e in self.endpoints.values())
        self._down = {e.environment: asyncio.Event() for e in self.endpoints.values()}
        everyone = list(self.endpoints.values())  # unrouted, all of environment None
        self._serving = {  # unrouted: every endpoint, under None
            environment: [e for e in everyone if e.environment == environment]
            for environment in self._down
        }
        self.starting = Gauge()
        self.all_down = asyncio.Event()
        self._waiters: list[_Waiter] = []  # heap: lowest step first, then arrival
        self._pinned: list[_Waiter] = []  # retries that must go where they were sent
        self._arrivals = itertools.count()
        self._timer: asyncio.TimerHandle | None = None

    def serving(self, environment: str | None) -> list[EndpointState]:
        """The endpoints a request of `environment` may start on: those of that environment
        once any endpoint names one, else every endpoint."""
        return self._serving.get(environment if self._routed else None, [])

    def environment_of(self, payload: dict[str, Any]) -> str | None:
        """The environment a payload's session must start in (None: any endpoint), or a
        ValueError if no endpoint is of it."""
        if not self._routed:
            return None  # the payload's key, if any, is the agent's business
        environment = payload.get(ENVIRONMENT_KEY)
        if self.serving(environment):
            return environment
        known = sorted({str(e.environment) for e in self.endpoints.values()})
        raise ValueError(
            f"payload {ENVIRONMENT_KEY} {environment!r}: no runtime in engine.runtimes is of it "
            f"(theirs: {', '.join(known)})"
        )

    def pinned_to(self, session: LiveSession) -> EndpointState | None:
        """Where a session that may have started must be retried (None: anywhere)."""
        return self.endpoints.get(session.endpoint or "") if session.maybe_started else None

    async def claim(self, session: LiveSession, error: SessionCallError | None) -> EndpointState:
        """An endpoint to invoke now, its start slot, a start token and (unless the session
        holds one there) its live slot taken; waiting in line, lowest step first."""
        pinned = self.pinned_to(session)
        if pinned is not None and not pinned.outage.due():
            raise pinned.outage.refusal()
        if pinned is None and not any(e.outage.due() for e in self.serving(session.environment)):
            raise self._refusal(session.environment)
        waiting = self._pinned if pinned is not None else self._waiters
        if not waiting and (endpoint := self._pick(pinned, session)) is not None:
            self._take(endpoint, session)
            return endpoint
        granted: asyncio.Future[EndpointState] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(session.priority, next(self._arrivals), granted, session, pinned)
        heapq.heappush(waiting, waiter)
        self._wake()
        try:
            what = "a start on its endpoint" if pinned is not None else "a free endpoint"
            return await self.until(
                granted, session.start_deadline, what, error, pinned, session.environment
            )
        except BaseException:
            if granted.done() and not granted.cancelled():  # granted as it gave up: undo
                self._untake(granted.result(), session)
            raise

    def attempted(self, endpoint: EndpointState) -> None:
        """An attempt `claim` gave `endpoint` ended, accepted or not: its start slot frees."""
        endpoint.starting.remove()
        self.starting.remove()
        self._wake()

    def release_live(self, endpoint: EndpointState) -> None:
        """A session left its live slot on `endpoint`: a waiter may take it."""
        endpoint.release_live()
        self._wake()

    async def until(
        self,
        work: Awaitable[_T],
        start_deadline: float,
        what: str,
        cause: SessionCallError | None = None,
        pinned: EndpointState | None = None,
        environment: str | None = None,
    ) -> _T:
        """Await `work` unless `start_deadline` passes or, first, the endpoint it is pinned to
        or (unpinned) every endpoint it may start on is declared down."""
        if pinned is not None:
            down_event = pinned.outage.declared
        else:
            down_event = self._down[environment] if self._routed else self.all_down
        task = asyncio.ensure_future(work)
        down = asyncio.ensure_future(down_event.wait())
        try:
            done, _ = await asyncio.wait(
                {task, down},
                timeout=(
                    max(0.0, start_deadline - time.time()) if start_deadline < math.inf else None
                ),
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            for pending in (task, down):
                if not pending.done():
                    pending.cancel()
            await asyncio.gather(task, down, return_exceptions=True)
        if task in done:  # it won (even if the other finished too): what it got is ours
            return task.result()
        if down in done:
            raise pinned.outage.refusal() if pinned is not None else self._refusal(environment)
        last = f" (last error: {cause})" if cause is not None else ""
        raise SubmitFailed(f"not started in time: still waiting for {what}{last}")

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _pick(self, pinned: EndpointState | None, session: LiveSession) -> EndpointState | None:
        """Where to start now: the pinned endpoint if it can; else the least loaded endpoint
        it may start on that is up and can start, of those that have not refused this session
        while any such is up; else one down and due for its probe; None: wait."""
        if pinned is not None:
            return pinned if pinned.can_start(holding=True) and pinned.outage.may_try() else None
        serving = self.serving(session.environment)
        up = [e for e in serving if not e.outage.declared.is_set()]
        untried = [e for e in up if e.name not in session.refused_on]
        free = [e for e in untried or up if e.can_start(holding=False)]
        if free:
            return min(free, key=EndpointState.load)
        if up:
            return None  # an endpoint that is up frees a slot or a token soon
        return next((e for e in serving if e.can_start(holding=False) and e.outage.may_try()), None)

    def _take(self, endpoint: EndpointState, session: LiveSession) -> None:
        endpoint.pool.starts.bucket.take()
        endpoint.pool.calls.take()
        endpoint.starting.add()
        self.starting.add()
        if session.endpoint != endpoint.name:
            endpoint.take_live()
            session.endpoint = endpoint.name

    def _untake(self, endpoint: EndpointState, session: LiveSession) -> None:
        """A grant the waiter did not live to use (its token is spent)."""
        endpoint.starting.remove()
        self.starting.remove()
        if not session.maybe_started:
            endpoint.release_live()
            session.endpoint = None
        self._wake()

    def _wake(self) -> None:
        """Grant waiters, lowest step first, as long as an endpoint can start one; then wake
        again when the next start token is due."""
        for line in (self._pinned, self._waiters):
            held: list[_Waiter] = []
            full: set[str | None] = set()  # environments none of whose endpoints can start one
            while line:
                waiter = line[0]
                if waiter.granted.done():  # gave up waiting
                    heapq.heappop(line)
                    continue
                anywhere = waiter.pinned is None and not waiter.session.refused_on
                environment = waiter.session.environment if self._routed else None
                if anywhere and environment in full:  # as the last of its environment: wait
                    held.append(heapq.heappop(line))
                    continue
                endpoint = self._pick(waiter.pinned, waiter.session)
                if endpoint is None:
                    if anywhere:
                        full.add(environment)
                        if len(full) == len(self._serving):
                            break  # no endpoint can start anyone
                    held.append(heapq.heappop(line))
                    continue
                heapq.heappop(line)
                self._take(endpoint, waiter.session)
                waiter.granted.set_result(endpoint)
            for waiter in held:
                heapq.heappush(line, waiter)
        if self._waiters or self._pinned:
            self._wake_at_next_token(asyncio.get_running_loop())

    def _on_timer(self) -> None:
        # Not `when() <= loop.time()`: uvloop fires a timer up to a millisecond before its
        # when() by its own clock, and a fired timer taken for a pending one is never renewed.
        self._timer = None
        self._wake()

    def _wake_at_next_token(self, loop: asyncio.AbstractEventLoop) -> None:
        """Endpoints with room wait only for their pool's tokens: wake when the first are
        due (a slot's release wakes the others)."""
        waits = [
            e.pool.ready_in()
            for e in self.endpoints.values()
            if e.starting.value < e.max_starting and e.outage.due()
        ]
        if not waits:
            return
        when = loop.time() + max(EARLY / 2, min(waits))
        if self._timer is None or when < self._timer.when():
            if self._timer is not None:
                self._timer.cancel()
            self._timer = loop.call_at(when, self._on_timer)

    def _outage_changed(self) -> None:
        """An endpoint was declared down or answers again: all down, waiters fail; back, they
        may go there."""
        for environment, down in self._down.items():
            if all(e.outage.declared.is_set() for e in self.serving(environment)):
                down.set()
            else:
                down.clear()
        if all(e.outage.declared.is_set() for e in self.endpoints.values()):
            self.all_down.set()
        else:
            self.all_down.clear()
            self._wake()

    def _refusal(self, environment: str | None) -> SubmitFailed:
        refusals = [str(e.outage.refusal()) for e in self.serving(environment)]
        if len(refusals) == 1:
            return SubmitFailed(refusals[0])
        return SubmitFailed(f"every endpoint down: {'; '.join(refusals)}")
