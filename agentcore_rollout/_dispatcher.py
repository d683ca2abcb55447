"""RequestDispatcher: starts one sandbox session per rollout without breaking the quotas.

Three bounds hold at once:
- a start rate (token bucket, adapted down on throttling and back up on success),
- at most `ceil(start_rate * session_start_time)` starts in flight (Little's law), so a
  cold-start wave cannot pile up connections,
- at most `max_live_sessions` sessions alive; a slot frees only once the session is stopped,
  which runs behind the outcome's hand-off (`live_session`), never before it.

Stops have their own rate (`stop_rate`, with a second of burst), so a burst of results ending
together is stopped at once, and a stop never holds up anyone's outcome.

And it fails fast: when the runtime keeps failing with outage errors (unreachable, 5xx) for
longer than the retry budget, it is declared down, and every request waiting to start ends at
once with the cause, instead of each spending its own retries at the start rate. While down,
one attempt per `backoff_max` seconds probes whether it is back.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from ._limits import AdaptiveRate, Gauge, OrderedSlots, TokenBucket, backoff_delay
from ._sandbox import SandboxRuntime, SessionCallError
from .config import DEFAULT_STOP_RATE, DispatchConfig, EngineConfig

log = logging.getLogger("agentcore_rollout.dispatcher")

_T = TypeVar("_T")


class SubmitFailed(Exception):
    """The rollout could not be started: non-retryable error, retries spent, the runtime is
    down, or it waited too long to start. The message says which, with the last cause."""


@dataclass(frozen=True)
class Started:
    """A session the runtime accepted."""

    sent_at: float
    """When the accepted invocation was sent (unix seconds): the session's start."""
    deadline: float
    """The rollout's deadline written into that invocation (unix seconds)."""


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


class _Outage:
    """Tracks whether the runtime is down: outage errors with no answer in between, for longer
    than the retry budget."""

    def __init__(self, budget: float, probe_every: float) -> None:
        self._budget = budget
        self._probe_every = probe_every
        self._since: float | None = None
        self._next_probe = 0.0
        self.cause: SessionCallError | None = None
        self.declared = asyncio.Event()

    def failed(self, error: SessionCallError) -> None:
        now = time.monotonic()
        self._since = now if self._since is None else self._since
        self.cause = error
        if now - self._since >= self._budget and not self.declared.is_set():
            log.error("runtime down for %.1fs, failing queued starts: %s", self.down_for(), error)
            self.declared.set()
            self._next_probe = now + self._probe_every

    def answered(self) -> None:
        if self.declared.is_set():
            log.warning("runtime answers again")
        self._since, self.cause = None, None
        self.declared.clear()

    def down_for(self) -> float:
        return time.monotonic() - self._since if self._since is not None else 0.0

    def may_try(self) -> bool:
        """Up, or down and due for one probe."""
        if not self.declared.is_set():
            return True
        now = time.monotonic()
        if now < self._next_probe:
            return False
        self._next_probe = now + self._probe_every
        return True

    def refusal(self) -> SubmitFailed:
        return SubmitFailed(f"runtime down for {self.down_for():.1f}s: {self.cause}")


class RequestDispatcher:
    """Starts and stops the sandbox sessions of rollouts within `engine.dispatch`'s bounds."""

    def __init__(
        self, runtime: SandboxRuntime, config: EngineConfig, *, rng: random.Random | None = None
    ) -> None:
        self._runtime = runtime
        self._cfg = cfg = config.dispatch
        self._rng = rng or random.Random()
        self._starts = AdaptiveRate(_bucket(cfg.start_rate))
        stops = cfg.stop_rate or max(cfg.start_rate, DEFAULT_STOP_RATE)
        self._stops = AdaptiveRate(TokenBucket(stops, burst=max(1.0, stops)))
        self._stopping: set[asyncio.Task[None]] = set()
        self._starting_slots = OrderedSlots(cfg.max_starting)
        self._live_slots = OrderedSlots(cfg.max_live_sessions)
        self._outage = _Outage(retry_budget(cfg), cfg.backoff_max)
        self.starting = Gauge()
        self.live = Gauge()
        self.invokes = self.stops = self.throttles = 0
        self.retries: Counter[str] = Counter()
        self.invoke_errors: Counter[str] = Counter()
        self.stop_errors: Counter[str] = Counter()

    def stats(self) -> dict[str, Any]:
        """This dispatcher's share of `EngineStats`."""
        return {
            "live_sessions": self.live.value,
            "starts_in_flight": self.starting.value,
            "peak_live_sessions": self.live.peak,
            "peak_starts_in_flight": self.starting.peak,
            "start_rate": self._starts.rate,
            "rate_cuts": self._starts.cuts,
            "invokes": self.invokes,
            "stops": self.stops,
            "throttles": self.throttles,
            "retries": self.retries,
            "invoke_errors": self.invoke_errors,
            "stop_errors": self.stop_errors,
            "runtime_down": self._outage.declared.is_set(),
        }

    @asynccontextmanager
    async def live_session(
        self, session_id: str, start_by: float, *, priority: int = 0
    ) -> AsyncIterator[LiveSession]:
        """Take one of the `max_live_sessions` slots (waiting until `start_by` at most, else
        SubmitFailed) for one session; waiters get slots, and then start slots, lowest `priority`
        first (the engine passes the request's step: oldest-first admission). Leaving frees it: at
        once if no session may have started, else once the session is stopped, which runs behind, at
        `stop_rate`, so the caller's outcome never waits for it and `max_live_sessions` bounds every
        session alive, stopping ones included."""
        await self._take_live_slot(start_by, priority)
        session = LiveSession(session_id, start_by, priority)
        try:
            yield session
        finally:
            if session.maybe_started:  # a task held until it ends, never collected mid-stop
                stopping = asyncio.create_task(self._stop_and_release(session_id))
                self._stopping.add(stopping)
                stopping.add_done_callback(self._stopping.discard)
            else:
                self._release_live_slot()

    async def aclose(self) -> None:
        """Wait for the stops under way (never cancelled: each frees a session's quota)."""
        await asyncio.gather(*self._stopping, return_exceptions=True)

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

    async def _stop_and_release(self, session_id: str) -> None:
        try:
            await self.stop(session_id)
        finally:
            self._release_live_slot()

    async def start(
        self,
        session: LiveSession,
        payload_for: Callable[[float], bytes],
        *,
        timeout: float,
        cutoff: float,
    ) -> Started:
        """Invoke the runtime in the slot's new session, retrying what is retryable.

        Each attempt's payload carries its own deadline, `min(now + timeout, cutoff)`, taken
        once the start-rate token is ours: time queued to start never eats into the rollout's
        timeout. Giving up (retries spent, runtime down, `start_by` passed) raises
        SubmitFailed."""
        error: SessionCallError | None = None
        for attempt in range(self._cfg.max_retries + 1):
            if not self._outage.may_try():
                raise self._outage.refusal()
            try:
                return await self._attempt(session, payload_for, timeout, cutoff, error)
            except SessionCallError as e:
                error = e
            self._count_failed_start(error)
            if not error.retryable:
                raise SubmitFailed(str(error))
            if attempt == self._cfg.max_retries:
                break
            self.retries[error.code] += 1
            delay = backoff_delay(attempt, self._cfg.backoff_base, self._cfg.backoff_max, self._rng)
            log.debug("retrying session_id=%s in %.2fs after %s", session.session_id, delay, error)
            await self._until(asyncio.sleep(delay), session.start_by, "a retry", error)
        raise SubmitFailed(f"gave up after {self._cfg.max_retries + 1} attempts: {error}")

    async def _attempt(
        self,
        session: LiveSession,
        payload_for: Callable[[float], bytes],
        timeout: float,
        cutoff: float,
        error: SessionCallError | None,
    ) -> Started:
        """One invocation, once a start slot and a start-rate token are ours."""
        if self._starting_slots.locked():  # only a wait needs the race (tasks cost ~20 us)
            wait = self._starting_slots.acquire(session.priority)
            await self._until(wait, session.start_by, "a start slot", error)
        else:
            await self._starting_slots.acquire()
        try:
            with self.starting:
                if not self._starts.bucket.take_if_free():
                    wait = self._starts.acquire()
                    await self._until(wait, session.start_by, "the start rate", error)
                sent = time.time()
                deadline = min(sent + timeout, cutoff)
                self.invokes += 1
                already, session.maybe_started = session.maybe_started, True
                first = session.sent_at is None
                session.sent_at = sent if first else session.sent_at
                try:
                    await self._runtime.invoke(session.session_id, payload_for(deadline))
                except SessionCallError as e:
                    session.maybe_started = already or e.maybe_started
                    if first and not e.maybe_started:
                        session.sent_at = None  # refused: this attempt created nothing
                    raise
        finally:
            self._starting_slots.release()
        self._outage.answered()
        self._starts.on_success()
        return Started(sent, deadline)

    def _count_failed_start(self, error: SessionCallError) -> None:
        self.invoke_errors[error.code] += 1
        if error.outage:
            self._outage.failed(error)
        else:
            self._outage.answered()
        if error.throttled:
            self.throttles += 1
            self._starts.on_throttle()

    async def stop(self, session_id: str) -> None:
        """Best effort: a failed stop is counted and logged, never raised (the session's
        idle timeout reclaims it). A runtime declared down gets one attempt, not retries."""
        for attempt in range(self._cfg.max_retries + 1):
            await self._stops.acquire()
            self.stops += 1
            try:
                await self._runtime.stop(session_id)
            except SessionCallError as e:
                self.stop_errors[e.code] += 1
                if e.outage:
                    self._outage.failed(e)
                if e.throttled:
                    self._stops.on_throttle()
                last = attempt == self._cfg.max_retries or self._outage.declared.is_set()
                if not e.retryable or last:
                    log.warning("could not stop session_id=%s: %s", session_id, e)
                    return
                await asyncio.sleep(
                    backoff_delay(attempt, self._cfg.backoff_base, self._cfg.backoff_max, self._rng)
                )
            else:
                self._outage.answered()
                self._stops.on_success()
                return

    async def _until(
        self,
        work: Awaitable[_T],
        start_by: float,
        what: str,
        cause: SessionCallError | None = None,
    ) -> _T:
        """Await `work` unless `start_by` passes or the runtime is declared down first."""
        task = asyncio.ensure_future(work)
        down = asyncio.ensure_future(self._outage.declared.wait())
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
            raise self._outage.refusal()
        last = f" (last error: {cause})" if cause is not None else ""
        raise SubmitFailed(f"not started in time: still waiting for {what}{last}")


def retry_budget(config: DispatchConfig) -> float:
    """The longest back-off one request can spend retrying: the sum of the capped delays."""
    return sum(
        min(config.backoff_max, config.backoff_base * 2**k) for k in range(config.max_retries)
    )


def _bucket(rate: float) -> TokenBucket:
    """A tenth of a second of burst lets the bucket make up for a late wake-up of the event
    loop (otherwise a busy loop loses rate it never gets back) without bunching starts."""
    return TokenBucket(rate, burst=max(1.0, rate / 10))
