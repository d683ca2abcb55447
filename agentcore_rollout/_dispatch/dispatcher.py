"""RequestDispatcher: a rollout's sandbox session from its live-session slot to its stop.

A request first takes a slot of the overall live bound (what the pools hold together:
`live_session`), then each attempt to start asks the start queue for an endpoint
(`start_queue`), within its pool's budgets (`endpoints`). Stops run behind the
outcome's hand-off at their own rate (`stop_rate`, a second of burst, each also taking its
pool's call token), so a burst of results is stopped at once and a stop never holds
up an outcome; a slot frees only once its session is stopped. An endpoint in doubt with
sessions living there is probed (a stop of a session that never existed), so it is declared
down even when nothing else calls it, and the requests of its sessions learn it (`lost`).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from .._flow import AdaptiveRate, Gauge, OrderedSlots, TokenBucket, backoff_delay
from .._redact import get_logger
from ..config import DEFAULT_STOP_RATE, EngineConfig
from ..contract import WARM_UP_PAYLOAD, warm_session_id
from ..runtimes.base import RuntimeLimits, SandboxRuntime, SessionCallError
from .endpoints import EndpointState, Pool, RuntimeEndpoint, SubmitFailed
from .start_queue import LiveSession, StartQueue
from .warm import WarmPool

log = get_logger("agentcore_rollout.dispatcher")

PROBE_SESSION_PREFIX = "agentcore-rollout-probe-"  # an endpoint in doubt: stop one never started


@dataclass(frozen=True)
class Started:
    """A session the runtime accepted."""

    sent_at: float
    """When the accepted invocation was sent (unix seconds): the session's start."""
    deadline: float
    """The rollout's deadline written into that invocation (unix seconds)."""
    endpoint: str
    """The endpoint it started on (`RuntimeEndpoint.name`): where it is stopped."""


class RequestDispatcher:
    """Starts and stops the sandbox sessions of rollouts within `engine.dispatch`'s bounds and
    each pool's limits (`pools`), on `endpoints` (one bare runtime: the one endpoint)."""

    def __init__(
        self,
        endpoints: SandboxRuntime | Sequence[RuntimeEndpoint],
        config: EngineConfig,
        *,
        pools: Mapping[str, RuntimeLimits] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._cfg = cfg = config.dispatch
        if not isinstance(endpoints, Sequence):
            endpoints = [RuntimeEndpoint("runtime", endpoints)]
        if not endpoints:
            raise ValueError("RequestDispatcher needs at least one endpoint")
        self._rng = rng or random.Random()
        self._pools = {
            a: Pool((pools or {}).get(a) or _assumed(a, config))
            for a in dict.fromkeys(spec.pool for spec in endpoints)
        }
        self._queue = StartQueue(endpoints, self._pools, cfg)
        self.max_live = self._held_at_once()
        self._live_slots = OrderedSlots(self.max_live)
        rates = sum(a.limits.start_rate for a in self._pools.values())
        stops = cfg.stop_rate or max(rates, DEFAULT_STOP_RATE)
        self._stops = AdaptiveRate(TokenBucket(stops, burst=max(1.0, stops)))
        self._stopping: set[asyncio.Task[None]] = set()
        self.live = Gauge()
        self.invokes = self.stops = self.throttles = 0
        self._warm = WarmPool()
        self._warming: set[asyncio.Task[None]] = set()
        self._idle_timers: dict[str, asyncio.TimerHandle] = {}  # parked ones', by session id
        self.warm_started = self.warm_used = self.warm_missed = self.warm_stopped = 0
        self.warm_idle_seconds = 0.0
        self.retries: Counter[str] = Counter()
        self.invoke_errors: Counter[str] = Counter()
        self.stop_errors: Counter[str] = Counter()

    def _held_at_once(self) -> int:
        """What every pool can hold at once: the slots a request takes before its gateway
        session is opened and its start waits for an endpoint."""
        return sum(
            min(a.bound, sum(e.max_live for e in self._queue.endpoints.values() if e.pool is a))
            for a in self._pools.values()
        )

    @property
    def start_rate(self) -> float:
        """New sessions a second across the pools now (cut after a throttle)."""
        return sum(a.starts.rate for a in self._pools.values())

    def environment_of(self, payload: dict[str, Any]) -> str | None:
        """The environment a payload's session must start in (`StartQueue.environment_of`)."""
        return self._queue.environment_of(payload)

    def stats(self) -> dict[str, Any]:
        """This dispatcher's share of `EngineStats`."""
        endpoints, pools = self._queue.endpoints.values(), self._pools.values()
        return {
            "live_sessions": self.live.value,
            "starts_in_flight": self._queue.starting.value,
            "peak_live_sessions": self.live.peak,
            "peak_starts_in_flight": self._queue.starting.peak,
            "max_live_sessions": self.max_live,
            "start_rate": self.start_rate,
            "rate_cuts": sum(a.starts.cuts for a in pools),
            "pool_limits": {
                f"{name or 'runtime'}/{key}": getattr(a.limits, key)
                for name, a in self._pools.items()
                for key in ("start_rate", "call_rate", "max_live_sessions")
            },
            "invokes": self.invokes,
            "stops": self.stops,
            "throttles": self.throttles,
            "retries": self.retries,
            "invoke_errors": self.invoke_errors,
            "stop_errors": self.stop_errors,
            "runtime_down": self._queue.all_down.is_set(),
            "warm_started": self.warm_started,
            "warm_used": self.warm_used,
            "warm_missed": self.warm_missed,
            "warm_stopped": self.warm_stopped,
            "warm_parked": self._warm.parked_total(),
            "warm_idle_seconds": self.warm_idle_seconds,
            "endpoints_down": sum(e.outage.declared.is_set() for e in endpoints),
            "starts_by_endpoint": {e.name: e.started for e in endpoints},
        }

    @asynccontextmanager
    async def live_session(
        self,
        session_id: str,
        start_deadline: float,
        *,
        priority: int = 0,
        environment: str | None = None,
        warm: bool = True,
    ) -> AsyncIterator[LiveSession]:
        """Take one of the live-session slots (waiting until `start_deadline` at most, else
        SubmitFailed) for one session; waiters get slots, and then endpoints, lowest `priority`
        first (the engine passes the request's step: oldest-first admission). Leaving frees it: at
        once if no session may have started, else once the session is stopped where it started,
        which runs behind, at `stop_rate`, so the caller's outcome never waits for it and the live
        bounds bound every session alive, stopping ones included. It starts only on endpoints
        of `environment` (`StartQueue.serving`). A warm session of `environment`, when there is
        one and `warm` allows, is the slot's instead, its id the session's."""
        session = await self._warm.take(environment, start_deadline, priority) if warm else None
        if session is None:
            await self._take_live_slot(start_deadline, priority, environment)
            session = LiveSession(session_id, start_deadline, priority, environment=environment)
        try:
            yield session
        finally:
            self._leave(session)

    def _leave(self, session: LiveSession) -> None:
        """Free the session's slot: at once if no session may have started, else once the
        session is stopped where it started (behind, at `stop_rate`)."""
        endpoint = self._queue.endpoints.get(session.endpoint or "")
        if session.maybe_started and endpoint is not None:
            # a task held until it ends, never collected mid-stop
            stopping = asyncio.create_task(self._stop_and_release(session.session_id, endpoint))
            self._stopping.add(stopping)
            stopping.add_done_callback(self._stopping.discard)
        else:
            if session.maybe_started:
                log.warning(
                    "session_id=%s not stopped: no endpoint %s",
                    session.session_id,
                    session.endpoint,
                )
            if endpoint is not None:
                self._queue.release_live(endpoint)
            self._release_live_slot()

    def adopt(self, session: LiveSession, endpoint: str) -> None:
        """The slot's session is an earlier engine's, started on `endpoint` and still running:
        it holds a live slot there (over the bound if it must: it exists) and is stopped there."""
        session.maybe_started = True
        found = self._queue.endpoints.get(endpoint)
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
        endpoint = self._queue.endpoints.get(session.endpoint or "")
        return endpoint.outage.declared if endpoint is not None else None

    async def aclose(self) -> None:
        """Stop the warm sessions nobody took, then wait for the stops under way (never
        cancelled: each frees a session's quota)."""
        for warming in list(self._warming):
            warming.cancel()
        await asyncio.gather(*self._warming, return_exceptions=True)
        for timer in self._idle_timers.values():
            timer.cancel()
        self.cool()
        await asyncio.gather(*self._stopping, return_exceptions=True)
        for endpoint in self._queue.endpoints.values():
            if endpoint.probe is not None:
                endpoint.probe.cancel()
        self._queue.close()

    async def _take_live_slot(
        self, start_deadline: float, priority: int, environment: str | None
    ) -> None:
        if not self._live_slots.locked():
            await self._live_slots.acquire()  # free: returns without yielding to the loop
        else:
            acquired = asyncio.ensure_future(self._live_slots.acquire(priority))
            try:
                await self._queue.until(
                    acquired, start_deadline, "a live-session slot", environment=environment
                )
            except BaseException:
                # cancelled in the same turn of the loop the slot was granted: give it back
                if acquired.done() and not acquired.cancelled() and not acquired.exception():
                    self._live_slots.release()
                raise
        self.live.add()

    def _release_live_slot(self) -> None:
        self.live.remove()
        self._live_slots.release()

    async def _stop_and_release(self, session_id: str, endpoint: EndpointState) -> None:
        try:
            await self._stop(session_id, endpoint)
        finally:
            self._queue.release_live(endpoint)
            self._release_live_slot()

    async def start(
        self,
        session: LiveSession,
        payload_for: Callable[[float], bytes],
        *,
        timeout: float,
        deadline: float,
    ) -> Started:
        """Invoke an endpoint in the slot's new session, retrying what is retryable.

        `deadline` is the latest the rollout may end (unix seconds; math.inf: none). Each
        attempt's payload carries its own deadline, `min(now + timeout, deadline)`, taken once
        the start-rate token is ours: time queued to start never eats into the rollout's
        timeout. Giving up (retries spent, every endpoint it may go to down, the session's
        `start_deadline` passed) raises SubmitFailed. A warm session's is one further call."""
        if session.warm_since is not None:
            return await self._start_warm(session, payload_for, timeout, deadline)
        error: SessionCallError | None = None
        for attempt in range(self._cfg.max_retries + 1):
            try:
                return await self._attempt(session, payload_for, timeout, deadline, error)
            except SessionCallError as e:
                error = e
            if not error.retryable:
                raise SubmitFailed(str(error))
            if attempt == self._cfg.max_retries:
                break
            self.retries[error.code] += 1
            delay = backoff_delay(attempt, self._cfg.backoff_base, self._cfg.backoff_max, self._rng)
            log.debug("retrying session_id=%s in %.2fs after %s", session.session_id, delay, error)
            pinned = self._queue.pinned_to(session)
            retry = asyncio.sleep(delay)
            await self._queue.until(
                retry, session.start_deadline, "a retry", error, pinned, session.environment
            )
        raise SubmitFailed(f"gave up after {self._cfg.max_retries + 1} attempts: {error}")

    async def _attempt(
        self,
        session: LiveSession,
        payload_for: Callable[[float], bytes],
        timeout: float,
        deadline: float,
        error: SessionCallError | None,
    ) -> Started:
        """One invocation, once an endpoint's start slot, live slot and token are ours."""
        endpoint = await self._queue.claim(session, error)
        try:
            sent = time.time()
            payload_deadline = min(sent + timeout, deadline)
            self.invokes += 1
            already, session.maybe_started = session.maybe_started, True
            first = session.sent_at is None
            session.sent_at = sent if first else session.sent_at
            try:
                await endpoint.runtime.invoke(session.session_id, payload_for(payload_deadline))
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
            self._queue.attempted(endpoint)
        endpoint.outage.answered()
        endpoint.pool.starts.on_success()
        endpoint.started += 1
        return Started(sent, payload_deadline, endpoint.name)

    async def invoke_again(self, session: LiveSession, payload: bytes) -> None:
        """A further invocation of the slot's session, where it started (on AgentCore the
        same microVM): it takes the pool's call rate, never a new session's start.
        Retried like a start; giving up raises SubmitFailed."""
        await self._call(session, lambda _: payload)

    async def _call(
        self, session: LiveSession, payload_for: Callable[[float], bytes]
    ) -> tuple[float, Mapping[str, Any] | None]:
        """Invoke the session where it runs, at the call rate; (when sent, the agent's reply)."""
        endpoint = self._queue.endpoints.get(session.endpoint or "")
        if endpoint is None or not session.maybe_started:
            raise SubmitFailed(f"session {session.session_id} is not running here")
        for attempt in range(self._cfg.max_retries + 1):
            await endpoint.pool.calls.acquire()
            self.invokes += 1
            sent = time.time()
            try:
                reply = await endpoint.runtime.invoke(session.session_id, payload_for(sent))
                return sent, reply
            except SessionCallError as e:
                self.invoke_errors[e.code] += 1
                if not e.retryable or attempt == self._cfg.max_retries:
                    raise SubmitFailed(f"invoking its session again: {e}") from None
            delay = backoff_delay(attempt, self._cfg.backoff_base, self._cfg.backoff_max, self._rng)
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    async def _start_warm(
        self,
        session: LiveSession,
        payload_for: Callable[[float], bytes],
        timeout: float,
        deadline: float,
    ) -> Started:
        """The rollout's invocation on its warm session. A reply that does not say the session
        was warm came from a session created anew (its warm one had ended): a cold start."""
        assert session.warm_since is not None
        sent, reply = await self._call(
            session, lambda now: payload_for(min(now + timeout, deadline))
        )
        self.warm_used += 1
        self.warm_idle_seconds += max(0.0, sent - session.warm_since)
        if reply is not None and not reply.get("warm"):
            self.warm_missed += 1
        return Started(sent, min(sent + timeout, deadline), session.endpoint or "")

    def warm(
        self,
        n: int,
        exp_id: str,
        *,
        start_deadline: float,
        environment: str | None = None,
        priority: int = 0,
    ) -> int:
        """Start `n` sessions of `exp_id` for `environment` ahead of their requests, each with
        the contract's warm-up invocation, behind every start of a lower `priority` and by
        `start_deadline`, each once it has a live slot; returns how many were scheduled: at
        most the live slots no other warm session holds or waits for."""
        room = self.max_live - self._warm.parked_total() - self._warm.pending_total()
        n = max(0, min(n, room))
        for _ in range(n):
            session = LiveSession(
                warm_session_id(exp_id), start_deadline, priority, environment=environment
            )
            self._warm.begun(session)
            task = asyncio.create_task(self._warm_one(session))
            self._warming.add(task)
            task.add_done_callback(self._warming.discard)
        return n

    async def _warm_one(self, session: LiveSession) -> None:
        slot = False
        try:
            await self._take_live_slot(
                session.start_deadline, session.priority, session.environment
            )
            slot = True
            await self.start(
                session, lambda _: WARM_UP_PAYLOAD, timeout=math.inf, deadline=math.inf
            )
        except BaseException as e:
            self._warm.failed(session)
            if slot:
                self._leave(session)
            if not isinstance(e, SubmitFailed):
                raise
            environment = session.environment or "any request"
            log.warning("warming a session for %s failed: %s", environment, e)
            return
        self.warm_started += 1
        self._warm.ready(session)
        # stopped once idle past warm_max_idle, if still parked
        loop = asyncio.get_running_loop()
        self._idle_timers[session.session_id] = loop.call_later(
            self._cfg.warm_max_idle, self._cool_one, session
        )

    def _cool_one(self, session: LiveSession) -> None:
        self._idle_timers.pop(session.session_id, None)
        if self._warm.withdraw(session):
            self.warm_stopped += 1
            self._leave(session)

    def warm_held(self, environment: str | None, steps: range) -> int:
        """Warm sessions of `environment` parked or under way, warmed for one of `steps`."""
        return self._warm.held(environment, steps)

    def cool(self) -> int:
        """Stop every parked warm session: no request will take them."""
        sessions = self._warm.drain()
        for session in sessions:
            self.warm_stopped += 1
            self._leave(session)
        return len(sessions)

    def _count_failed_start(self, endpoint: EndpointState, error: SessionCallError) -> None:
        self.invoke_errors[error.code] += 1
        if error.outage:
            self._outage_error(endpoint, error)
        else:
            endpoint.outage.answered()
        if error.throttled:
            self.throttles += 1
            endpoint.pool.starts.on_throttle()

    async def _stop(self, session_id: str, endpoint: EndpointState) -> None:
        """Best effort, where the session started: a failed stop is counted and logged, never
        raised (the session's idle timeout reclaims it). An endpoint declared down gets one
        attempt, not retries."""
        for attempt in range(self._cfg.max_retries + 1):
            await self._stops.acquire()
            await endpoint.pool.calls.acquire()
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

    def _outage_error(self, endpoint: EndpointState, error: SessionCallError) -> None:
        """Count it; while the endpoint is in doubt and sessions live there, probe it at the
        retry back-off, so that it is declared down within the retry budget even when no start
        or stop calls it: its running sessions' requests wait for that (`lost`)."""
        endpoint.outage.failed(error)
        if endpoint.probe is None or endpoint.probe.done():
            endpoint.probe = asyncio.create_task(self._probe(endpoint))

    async def _probe(self, endpoint: EndpointState) -> None:
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
            await endpoint.pool.calls.acquire()
            try:
                await endpoint.runtime.stop(f"{PROBE_SESSION_PREFIX}{uuid.uuid4().hex}")
            except SessionCallError as e:
                if e.outage:
                    endpoint.outage.failed(e)
                    continue
            return


def _assumed(pool: str, config: EngineConfig) -> RuntimeLimits:
    """A pool whose runtimes were not asked (a dispatcher built without limits, as in tests):
    `engine.dispatch`'s values, else AgentCore's published rates and a bound of 1,000."""
    d = config.dispatch
    return RuntimeLimits(d.start_rate or 25.0, 1_000.0, d.max_live_sessions or 1_000, pool)
