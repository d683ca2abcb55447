"""RequestDispatcher: starts one sandbox session per rollout without breaking the quotas.

Three bounds hold at once:
- a start rate (token bucket, adapted down on throttling and back up on success),
- at most `ceil(start_rate * session_start_time)` starts in flight (Little's law), so a
  cold-start wave cannot pile up connections,
- at most `max_live_sessions` sessions alive; a slot frees only after the session is stopped
  (the engine stops it inside `live_slot`).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from ._limits import AdaptiveRate, Gauge, TokenBucket, backoff_delay
from ._sandbox import SandboxRuntime, SessionCallError
from .config import EngineConfig

log = logging.getLogger("agentcore_rollout.dispatcher")


class SubmitFailed(Exception):
    """The rollout could not be started: non-retryable error, retries spent, or deadline."""


class RequestDispatcher:
    def __init__(
        self, runtime: SandboxRuntime, config: EngineConfig, *, rng: random.Random | None = None
    ) -> None:
        self._runtime = runtime
        self._cfg = config
        self._rng = rng or random.Random()
        self.start_rate = AdaptiveRate(_bucket(config.start_rate))
        self.stop_rate = AdaptiveRate(_bucket(config.stop_rate or config.start_rate))
        self._starting_slots = asyncio.Semaphore(config.max_starting)
        self._live_slots = asyncio.Semaphore(config.max_live_sessions)
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
            "start_rate": self.start_rate.rate,
            "rate_cuts": self.start_rate.cuts,
            "invokes": self.invokes,
            "stops": self.stops,
            "throttles": self.throttles,
            "retries": self.retries,
            "invoke_errors": self.invoke_errors,
            "stop_errors": self.stop_errors,
        }

    @asynccontextmanager
    async def live_slot(self) -> AsyncIterator[None]:
        """Hold one of the `max_live_sessions` slots; the caller stops its session inside."""
        async with self._live_slots:
            with self.live:
                yield

    async def start(self, session_id: str, payload: bytes, deadline: float) -> float:
        """Invoke the runtime in a new session, retrying what is retryable until `deadline`.
        Returns when the accepted invocation was sent (unix seconds)."""
        for attempt in range(self._cfg.max_retries + 1):
            async with self._starting_slots:
                with self.starting:
                    await self.start_rate.acquire()
                    if time.time() >= deadline:
                        break
                    self.invokes += 1
                    sent = time.time()
                    try:
                        await self._runtime.invoke(session_id, payload)
                    except SessionCallError as e:
                        error = e
                    else:
                        self.start_rate.on_success()
                        return sent
            self.invoke_errors[error.code] += 1
            if not error.retryable:
                raise SubmitFailed(str(error))
            if error.throttled:
                self.throttles += 1
                self.start_rate.on_throttle()
            if attempt == self._cfg.max_retries:
                raise SubmitFailed(f"gave up after {attempt + 1} attempts: {error}")
            self.retries[error.code] += 1
            delay = backoff_delay(attempt, self._cfg.backoff_base, self._cfg.backoff_max, self._rng)
            log.debug("retrying session_id=%s in %.2fs after %s", session_id, delay, error)
            await asyncio.sleep(min(delay, max(0.0, deadline - time.time())))
        raise SubmitFailed("deadline passed before the session could be started")

    async def stop(self, session_id: str) -> None:
        """Best effort: a failed stop is counted and logged, never raised (the session's
        idle timeout reclaims it)."""
        for attempt in range(self._cfg.max_retries + 1):
            await self.stop_rate.acquire()
            self.stops += 1
            try:
                await self._runtime.stop(session_id)
            except SessionCallError as e:
                self.stop_errors[e.code] += 1
                if e.throttled:
                    self.stop_rate.on_throttle()
                if not e.retryable or attempt == self._cfg.max_retries:
                    log.warning("could not stop session_id=%s: %s", session_id, e)
                    return
                await asyncio.sleep(
                    backoff_delay(attempt, self._cfg.backoff_base, self._cfg.backoff_max, self._rng)
                )
            else:
                self.stop_rate.on_success()
                return


def _bucket(rate: float) -> TokenBucket:
    """A tenth of a second of burst lets the bucket make up for a late wake-up of the event
    loop (otherwise a busy loop loses rate it never gets back) without bunching starts."""
    return TokenBucket(rate, burst=max(1.0, rate / 10))
