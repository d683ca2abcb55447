"""RequestDispatcher: starts one sandbox session per rollout on one of several endpoints
without breaking any of their accounts' quotas, and stops it where it started.

AgentCore's quotas are per account and region (`Endpoint.account`), shared by every endpoint
and runtime there, so each account has (`_Account`, from `_quotas.Limits`: the configured
values, else the account's quotas):
- a start rate (token bucket, adapted down on throttling and back up on success),
- a data-plane rate that every invoke and every stop takes from,
- at most `max_live_sessions` sessions alive; a slot frees only once the session is stopped,
  which runs behind the outcome's hand-off (`live_session`), never before it.
More endpoints in one account add no start rate; more accounts or regions do. Each endpoint
(on AgentCore, one runtime ARN + qualifier) has its own outage state, its own optional live
bound, and at most `ceil(start_rate * session_start_time)` starts in flight (Little's law, at
its account's rate), so a cold-start wave cannot pile up connections on it.

A request first takes a slot of the overall live bound (what the accounts can hold together:
`live_session`), then each attempt to start takes an endpoint where a start slot, a live slot
and its account's start and data-plane tokens are free, the least loaded of those (`_pick`);
waiters are served lowest step first. A retry after a clear refusal may go to another
endpoint; once an attempt may have created the session (sent, no clear answer), every retry
and the stop go where it was sent.

Stops have their own rate (`stop_rate`, with a second of burst; each also takes its account's
data-plane token), so a burst of results ending together is stopped at once, and a stop never
holds up anyone's outcome.

And it fails fast, per endpoint: one that keeps failing with outage errors (unreachable, 5xx)
for longer than the retry budget is declared down; requests waiting to start go to the others,
and only when every endpoint is down does every waiting request end at once with the cause.
While down, one attempt per `backoff_max` seconds probes whether it is back.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import random
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from ._limits import AdaptiveRate, Gauge, OrderedSlots, TokenBucket, backoff_delay
from ._quotas import Limits, published
from ._redact import get_logger
from ._sandbox import SandboxRuntime, SessionCallError
from .config import DEFAULT_STOP_RATE, DispatchConfig, EngineConfig

log = get_logger("agentcore_rollout.dispatcher")

_T = TypeVar("_T")
_EARLY = 0.002  # seconds: a token due this soon counts as there (timers fire a hair early)
PROBE_SESSION_PREFIX = "agentcore-rollout-probe-"  # an endpoint in doubt: stop one never started


class SubmitFailed(Exception):
    """The rollout could not be started: non-retryable error, retries spent, every endpoint
    down, or it waited too long to start. The message says which, with the last cause."""


@dataclass(frozen=True)
class Endpoint:
    """One place sessions start: a runtime, its own live bound, its account."""

    name: str
    """Where a session started, as journaled (AgentCore: `RuntimeTarget.name`)."""
    runtime: SandboxRuntime
    max_live_sessions: int | None = None
    """None: only its account's bound."""
    account: str = ""
    """`<account id>:<region>` (`RuntimeTarget.account`): endpoints of one account share its
    start rate, data-plane rate and live bound."""


@dataclass(frozen=True)
class Started:
    """A session the runtime accepted."""

    sent_at: float
    """When the accepted invocation was sent (unix seconds): the session's start."""
    deadline: float
    """The rollout's deadline written into that invocation (unix seconds)."""
    endpoint: str
    """The endpoint it started on (`Endpoint.name`): where it is stopped."""


@dataclass
class LiveSession:
    """One live-session slot and the session it holds (see `RequestDispatcher.live_session`)."""

    session_id: str
    start_by: float  # unix seconds: started by then, or SubmitFailed
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


class _Outage:
    """Tracks whether one endpoint is down: outage errors with no answer in between, for longer
    than the retry budget."""

    def __init__(
        self, name: str, budget: float, probe_every: float, on_change: Callable[[], None]
    ) -> None:
        self._name = name
        self._budget = budget
        self._probe_every = probe_every
        self._on_change = on_change
        self._since: float | None = None
        self._next_probe = 0.0
        self.cause: SessionCallError | None = None
        self.declared = asyncio.Event()

    def failed(self, error: SessionCallError) -> None:
        now = time.monotonic()
        self._since = now if self._since is None else self._since
        self.cause = error
        if now - self._since >= self._budget and not self.declared.is_set():
            log.error("%s down for %.1fs: %s", self._name, self.down_for(), error)
            self.declared.set()
            self._next_probe = now + self._probe_every
            self._on_change()

    def answered(self) -> None:
        self._since, self.cause = None, None
        if self.declared.is_set():
            log.warning("%s answers again", self._name)
            self.declared.clear()
            self._on_change()

    def down_for(self) -> float:
        return time.monotonic() - self._since if self._since is not None else 0.0

    def in_doubt(self) -> bool:
        """Outage errors seen, with no answer since, but not yet for the whole budget."""
        return self._since is not None and not self.declared.is_set()

    def due(self) -> bool:
        """Up, or down and due for one probe (taking nothing)."""
        return not self.declared.is_set() or time.monotonic() >= self._next_probe

    def may_try(self) -> bool:
        """Up, or down and due for one probe, which this takes."""
        if not self.due():
            return False
        if self.declared.is_set():
            self._next_probe = time.monotonic() + self._probe_every
        return True

    def refusal(self) -> SubmitFailed:
        return SubmitFailed(f"{self._name} down for {self.down_for():.1f}s: {self.cause}")


class _Account:
    """One account and region's budgets, shared by its endpoints: new sessions (adapted down on
    throttling), data-plane calls (invokes and stops), live sessions."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.bound = limits.max_live_sessions
        self.starts = AdaptiveRate(_bucket(limits.start_rate))
        self.calls = _bucket(limits.data_plane_tps)
        self.live = Gauge()

    def ready_in(self) -> float:
        """Seconds until a start may take both its tokens."""
        return max(self.starts.bucket.ready_in(), self.calls.ready_in())


class _Endpoint:
    """One endpoint's state: starts in flight, live sessions and outage; its account's budgets."""

    def __init__(
        self, spec: Endpoint, account: _Account, cfg: DispatchConfig, on_change: Callable[[], None]
    ) -> None:
        self.name = spec.name
        self.runtime = spec.runtime
        self.account = account
        rate = account.limits.start_rate
        self.max_starting = max(1, math.ceil(rate * cfg.session_start_time))
        self.max_live = min(spec.max_live_sessions or account.bound, account.bound)
        self.starting = Gauge()
        self.live = Gauge()
        self.started = 0
        self.outage = _Outage(spec.name, retry_budget(cfg), cfg.backoff_max, on_change)
        self.probe: asyncio.Task[None] | None = None

    def can_start(self, holding: bool) -> bool:
        """A start slot and the account's tokens are free, and a live slot here and in the
        account (unless the session holds one here already)."""
        if self.starting.value >= self.max_starting or self.account.ready_in() > _EARLY:
            return False
        return holding or (
            self.live.value < self.max_live and self.account.live.value < self.account.bound
        )

    def load(self) -> float:
        return self.live.value / self.max_live

    def take_live(self) -> None:
        self.live.add()
        self.account.live.add()

    def release_live(self) -> None:
        self.live.remove()
        self.account.live.remove()


@dataclass(order=True)
class _Waiter:
    priority: int
    arrival: int
    granted: asyncio.Future[_Endpoint] = field(compare=False)
    session: LiveSession = field(compare=False)
    pinned: _Endpoint | None = field(compare=False)


class RequestDispatcher:
    """Starts and stops the sandbox sessions of rollouts within `engine.dispatch`'s bounds and
    each account's `accounts` limits (an account not given: `engine.dispatch`, else the
    published quotas), on `endpoints` (one bare runtime: the one endpoint)."""

    def __init__(
        self,
        endpoints: SandboxRuntime | Sequence[Endpoint],
        config: EngineConfig,
        *,
        accounts: Mapping[str, Limits] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._cfg = cfg = config.dispatch
        if not isinstance(endpoints, Sequence):
            endpoints = [Endpoint("runtime", endpoints)]
        if not endpoints:
            raise ValueError("RequestDispatcher needs at least one endpoint")
        self._rng = rng or random.Random()
        self._accounts = {
            a: _Account((accounts or {}).get(a) or _published(a, config))
            for a in dict.fromkeys(spec.account for spec in endpoints)
        }
        self._endpoints = {
            spec.name: _Endpoint(spec, self._accounts[spec.account], cfg, self._outage_changed)
            for spec in endpoints
        }
        self.max_live = self._held_at_once()
        self._live_slots = OrderedSlots(self.max_live)
        self._waiters: list[_Waiter] = []  # heap: lowest step first, then arrival
        self._pinned: list[_Waiter] = []  # retries that must go where they were sent
        self._arrivals = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._all_down = asyncio.Event()
        rates = sum(a.limits.start_rate for a in self._accounts.values())
        stops = cfg.stop_rate or max(rates, DEFAULT_STOP_RATE)
        self._stops = AdaptiveRate(TokenBucket(stops, burst=max(1.0, stops)))
        self._stopping: set[asyncio.Task[None]] = set()
        self.starting = Gauge()
        self.live = Gauge()
        self.invokes = self.stops = self.throttles = 0
        self.retries: Counter[str] = Counter()
        self.invoke_errors: Counter[str] = Counter()
        self.stop_errors: Counter[str] = Counter()

    def _held_at_once(self) -> int:
        """What every account can hold at once: the slots a request takes before its gateway
        session is opened and its start waits for an endpoint."""
        return sum(
            min(a.bound, sum(e.max_live for e in self._endpoints.values() if e.account is a))
            for a in self._accounts.values()
        )

    def stats(self) -> dict[str, Any]:
        """This dispatcher's share of `EngineStats`."""
        endpoints, accounts = self._endpoints.values(), self._accounts.values()
        return {
            "live_sessions": self.live.value,
            "starts_in_flight": self.starting.value,
            "peak_live_sessions": self.live.peak,
            "peak_starts_in_flight": self.starting.peak,
            "max_live_sessions": self.max_live,
            "start_rate": sum(a.starts.rate for a in accounts),
            "rate_cuts": sum(a.starts.cuts for a in accounts),
            "account_limits": {
                f"{name or 'runtime'}/{key}": value
                for name, a in self._accounts.items()
                for key, value in asdict(a.limits).items()
            },
            "invokes": self.invokes,
            "stops": self.stops,
            "throttles": self.throttles,
            "retries": self.retries,
            "invoke_errors": self.invoke_errors,
            "stop_errors": self.stop_errors,
            "runtime_down": self._all_down.is_set(),
            "endpoints_down": sum(e.outage.declared.is_set() for e in endpoints),
            "starts_by_endpoint": {e.name: e.started for e in endpoints},
        }

    @asynccontextmanager
    async def live_session(
        self, session_id: str, start_by: float, *, priority: int = 0
    ) -> AsyncIterator[LiveSession]:
        """Take one of the live-session slots (waiting until `start_by` at most, else
        SubmitFailed) for one session; waiters get slots, and then endpoints, lowest `priority`
        first (the engine passes the request's step: oldest-first admission). Leaving frees it: at
        once if no session may have started, else once the session is stopped where it started,
        which runs behind, at `stop_rate`, so the caller's outcome never waits for it and the live
        bounds bound every session alive, stopping ones included."""
        await self._take_live_slot(start_by, priority)
        session = LiveSession(session_id, start_by, priority)
        try:
            yield session
        finally:
            endpoint = self._endpoints.get(session.endpoint or "")
            if session.maybe_started and endpoint is not None:
                # a task held until it ends, never collected mid-stop
                stopping = asyncio.create_task(self._stop_and_release(session_id, endpoint))
                self._stopping.add(stopping)
                stopping.add_done_callback(self._stopping.discard)
            else:
                if session.maybe_started:
                    log.warning(
                        "session_id=%s not stopped: no endpoint %s", session_id, session.endpoint
                    )
                if endpoint is not None:
                    self._release_endpoint(endpoint)
                self._release_live_slot()

    def adopt(self, session: LiveSession, endpoint: str | None) -> None:
        """The slot's session is an earlier engine's, started on `endpoint` (None: the first)
        and still running: it holds a live slot there (over the bound if it must: it exists)
        and is stopped there."""
        session.maybe_started = True
        endpoint = endpoint or next(iter(self._endpoints))
        found = self._endpoints.get(endpoint)
        if found is None:
            log.warning(
                "session_id=%s runs on %s, not configured now", session.session_id, endpoint
            )
            return
        found.take_live()
        session.endpoint = endpoint

    def lost(self, session: LiveSession) -> asyncio.Event | None:
        """Set while the endpoint the session started on is declared down (no endpoint known:
        None): the engine stops waiting out its deadline for a session nobody can reach."""
        endpoint = self._endpoints.get(session.endpoint or "")
        return endpoint.outage.declared if endpoint is not None else None

    async def aclose(self) -> None:
        """Wait for the stops under way (never cancelled: each frees a session's quota)."""
        await asyncio.gather(*self._stopping, return_exceptions=True)
        for endpoint in self._endpoints.values():
            if endpoint.probe is not None:
                endpoint.probe.cancel()
        if self._timer is not None:
            self._timer.cancel()

    async def _take_live_slot(self, start_by: float, priority: int) -> None:
        if not self._live_slots.locked():
            await self._live_slots.acquire()  # free: returns without yielding to the loop
        else:
            acquired = asyncio.ensure_future(self._live_slots.acquire(priority))
            try:
                await self._until(acquired, start_by, "a live-session slot")
            except BaseException:
                # cancelled in the same turn of the loop the slot was granted: give it back
                if acquired.done() and not acquired.cancelled() and not acquired.exception():
                    self._live_slots.release()
                raise
        self.live.add()

    def _release_live_slot(self) -> None:
        self.live.remove()
        self._live_slots.release()

    def _release_endpoint(self, endpoint: _Endpoint) -> None:
        endpoint.release_live()
        self._wake()

    async def _stop_and_release(self, session_id: str, endpoint: _Endpoint) -> None:
        try:
            await self._stop(session_id, endpoint)
        finally:
            self._release_endpoint(endpoint)
            self._release_live_slot()

    async def start(
        self,
        session: LiveSession,
        payload_for: Callable[[float], bytes],
        *,
        timeout: float,
        cutoff: float,
    ) -> Started:
        """Invoke an endpoint in the slot's new session, retrying what is retryable.

        Each attempt's payload carries its own deadline, `min(now + timeout, cutoff)`, taken
        once the start-rate token is ours: time queued to start never eats into the rollout's
        timeout. Giving up (retries spent, every endpoint it may go to down, `start_by`
        passed) raises SubmitFailed."""
        error: SessionCallError | None = None
        for attempt in range(self._cfg.max_retries + 1):
            try:
                return await self._attempt(session, payload_for, timeout, cutoff, error)
            except SessionCallError as e:
                error = e
            if not error.retryable:
                raise SubmitFailed(str(error))
            if attempt == self._cfg.max_retries:
                break
            self.retries[error.code] += 1
            delay = backoff_delay(attempt, self._cfg.backoff_base, self._cfg.backoff_max, self._rng)
            log.debug("retrying session_id=%s in %.2fs after %s", session.session_id, delay, error)
            pinned = self._pinned_to(session)
            await self._until(asyncio.sleep(delay), session.start_by, "a retry", error, pinned)
        raise SubmitFailed(f"gave up after {self._cfg.max_retries + 1} attempts: {error}")

    async def _attempt(
        self,
        session: LiveSession,
        payload_for: Callable[[float], bytes],
        timeout: float,
        cutoff: float,
        error: SessionCallError | None,
    ) -> Started:
        """One invocation, once an endpoint's start slot, live slot and token are ours."""
        endpoint = await self._claim(session, error)
        try:
            sent = time.time()
            deadline = min(sent + timeout, cutoff)
            self.invokes += 1
            already, session.maybe_started = session.maybe_started, True
            first = session.sent_at is None
            session.sent_at = sent if first else session.sent_at
            try:
                await endpoint.runtime.invoke(session.session_id, payload_for(deadline))
            except SessionCallError as e:
                session.maybe_started = already or e.maybe_started
                if first and not e.maybe_started:
                    session.sent_at = None  # refused: this attempt created nothing
                if not session.maybe_started:  # a retry may go elsewhere
                    session.endpoint = None
                    session.refused_on.add(endpoint.name)
                    endpoint.release_live()
                self._count_failed_start(endpoint, e)
                raise
        finally:
            endpoint.starting.remove()
            self.starting.remove()
            self._wake()
        endpoint.outage.answered()
        endpoint.account.starts.on_success()
        endpoint.started += 1
        return Started(sent, deadline, endpoint.name)

    def _pinned_to(self, session: LiveSession) -> _Endpoint | None:
        """Where a session that may have started must be retried (None: anywhere)."""
        return self._endpoints.get(session.endpoint or "") if session.maybe_started else None

    async def _claim(self, session: LiveSession, error: SessionCallError | None) -> _Endpoint:
        """An endpoint to invoke now, its start slot, a start token and (unless the session
        holds one there) its live slot taken; waiting in line, lowest step first."""
        pinned = self._pinned_to(session)
        if pinned is not None and not pinned.outage.due():
            raise pinned.outage.refusal()
        if pinned is None and not any(e.outage.due() for e in self._endpoints.values()):
            raise self._refusal()
        waiting = self._pinned if pinned is not None else self._waiters
        if not waiting and (endpoint := self._pick(pinned, session.refused_on)) is not None:
            self._take(endpoint, session)
            return endpoint
        granted: asyncio.Future[_Endpoint] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(session.priority, next(self._arrivals), granted, session, pinned)
        heapq.heappush(waiting, waiter)
        self._wake()
        try:
            what = "a start on its endpoint" if pinned is not None else "a free endpoint"
            return await self._until(granted, session.start_by, what, error, pinned)
        except BaseException:
            if granted.done() and not granted.cancelled():  # granted as it gave up: undo
                self._untake(granted.result(), session)
            raise

    def _pick(self, pinned: _Endpoint | None, refused_on: Collection[str] = ()) -> _Endpoint | None:
        """Where to start now: the pinned endpoint if it can; else the least loaded endpoint
        that is up and can start, of those that have not refused this session while any such
        is up; else one down and due for its probe; None: wait."""
        if pinned is not None:
            return pinned if pinned.can_start(holding=True) and pinned.outage.may_try() else None
        up = [e for e in self._endpoints.values() if not e.outage.declared.is_set()]
        untried = [e for e in up if e.name not in refused_on]
        free = [e for e in untried or up if e.can_start(holding=False)]
        if free:
            return min(free, key=_Endpoint.load)
        if up:
            return None  # an endpoint that is up frees a slot or a token soon
        return next(
            (
                e
                for e in self._endpoints.values()
                if e.can_start(holding=False) and e.outage.may_try()
            ),
            None,
        )

    def _take(self, endpoint: _Endpoint, session: LiveSession) -> None:
        endpoint.account.starts.bucket.take()
        endpoint.account.calls.take()
        endpoint.starting.add()
        self.starting.add()
        if session.endpoint != endpoint.name:
            endpoint.take_live()
            session.endpoint = endpoint.name

    def _untake(self, endpoint: _Endpoint, session: LiveSession) -> None:
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
            while line:
                waiter = line[0]
                if waiter.granted.done():  # gave up waiting
                    heapq.heappop(line)
                    continue
                endpoint = self._pick(waiter.pinned, waiter.session.refused_on)
                if endpoint is None:
                    if waiter.pinned is None and not waiter.session.refused_on:
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
        """Endpoints with room wait only for their account's tokens: wake when the first are
        due (a slot's release wakes the others)."""
        waits = [
            e.account.ready_in()
            for e in self._endpoints.values()
            if e.starting.value < e.max_starting and e.outage.due()
        ]
        if not waits:
            return
        when = loop.time() + max(_EARLY / 2, min(waits))
        if self._timer is None or when < self._timer.when():
            if self._timer is not None:
                self._timer.cancel()
            self._timer = loop.call_at(when, self._on_timer)

    def _outage_changed(self) -> None:
        """An endpoint was declared down or answers again: all down, waiters fail; back, they
        may go there."""
        if all(e.outage.declared.is_set() for e in self._endpoints.values()):
            self._all_down.set()
        else:
            self._all_down.clear()
            self._wake()

    def _refusal(self) -> SubmitFailed:
        refusals = [str(e.outage.refusal()) for e in self._endpoints.values()]
        if len(refusals) == 1:
            return SubmitFailed(refusals[0])
        return SubmitFailed(f"every endpoint down: {'; '.join(refusals)}")

    def _count_failed_start(self, endpoint: _Endpoint, error: SessionCallError) -> None:
        self.invoke_errors[error.code] += 1
        if error.outage:
            self._outage_error(endpoint, error)
        else:
            endpoint.outage.answered()
        if error.throttled:
            self.throttles += 1
            endpoint.account.starts.on_throttle()

    async def _stop(self, session_id: str, endpoint: _Endpoint) -> None:
        """Best effort, where the session started: a failed stop is counted and logged, never
        raised (the session's idle timeout reclaims it). An endpoint declared down gets one
        attempt, not retries."""
        for attempt in range(self._cfg.max_retries + 1):
            await self._stops.acquire()
            await endpoint.account.calls.acquire()
            self.stops += 1
            try:
                await endpoint.runtime.stop(session_id)
            except SessionCallError as e:
                self.stop_errors[e.code] += 1
                if e.outage:
                    self._outage_error(endpoint, e)
                if e.throttled:
                    self._stops.on_throttle()
                last = attempt == self._cfg.max_retries or endpoint.outage.declared.is_set()
                if not e.retryable or last:
                    log.warning(
                        "could not stop session_id=%s on %s: %s", session_id, endpoint.name, e
                    )
                    return
                await asyncio.sleep(
                    backoff_delay(attempt, self._cfg.backoff_base, self._cfg.backoff_max, self._rng)
                )
            else:
                endpoint.outage.answered()
                self._stops.on_success()
                return

    def _outage_error(self, endpoint: _Endpoint, error: SessionCallError) -> None:
        """Count it; while the endpoint is in doubt and sessions live there, probe it at the
        retry back-off, so that it is declared down within the retry budget even when no start
        or stop calls it: its running sessions' requests wait for that (`lost`)."""
        endpoint.outage.failed(error)
        if endpoint.probe is None or endpoint.probe.done():
            endpoint.probe = asyncio.create_task(self._probe(endpoint))

    async def _probe(self, endpoint: _Endpoint) -> None:
        """Stop a session that never existed, while the endpoint is in doubt. Only its outage
        errors count: an answer proves it reachable, not that it starts sessions, so what
        clears the doubt is still the next start or stop that succeeds there."""
        cfg = self._cfg
        for attempt in itertools.count():
            await asyncio.sleep(
                backoff_delay(attempt, cfg.backoff_base, cfg.backoff_max, self._rng)
            )
            if not endpoint.outage.in_doubt() or not endpoint.live.value:
                return  # decided, or no session there waits to learn it
            await endpoint.account.calls.acquire()
            try:
                await endpoint.runtime.stop(f"{PROBE_SESSION_PREFIX}{uuid.uuid4().hex}")
            except SessionCallError as e:
                if e.outage:
                    endpoint.outage.failed(e)
                    continue
            return

    async def _until(
        self,
        work: Awaitable[_T],
        start_by: float,
        what: str,
        cause: SessionCallError | None = None,
        pinned: _Endpoint | None = None,
    ) -> _T:
        """Await `work` unless `start_by` passes or, first, the endpoint it is pinned to or
        (unpinned) every endpoint is declared down."""
        down_event = pinned.outage.declared if pinned is not None else self._all_down
        task = asyncio.ensure_future(work)
        down = asyncio.ensure_future(down_event.wait())
        try:
            done, _ = await asyncio.wait(
                {task, down},
                timeout=max(0.0, start_by - time.time()) if start_by < math.inf else None,
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
            raise pinned.outage.refusal() if pinned is not None else self._refusal()
        last = f" (last error: {cause})" if cause is not None else ""
        raise SubmitFailed(f"not started in time: still waiting for {what}{last}")


def retry_budget(config: DispatchConfig) -> float:
    """The longest back-off one request can spend retrying: the sum of the capped delays."""
    return sum(
        min(config.backoff_max, config.backoff_base * 2**k) for k in range(config.max_retries)
    )


def _published(account: str, config: EngineConfig) -> Limits:
    """An account no quotas were read for (`<account id>:<region>`, or a bare runtime's):
    `engine.dispatch`'s values, else the published quotas of its region (else the engine's)."""
    region = account.partition(":")[2] or config.region
    return Limits.of(published(region), config.dispatch)


def _bucket(rate: float) -> TokenBucket:
    """A tenth of a second of burst lets the bucket make up for a late wake-up of the event
    loop (otherwise a busy loop loses rate it never gets back) without bunching starts."""
    return TokenBucket(rate, burst=max(1.0, rate / 10))
