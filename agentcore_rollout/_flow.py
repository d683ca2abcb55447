"""Flow-control primitives: a token bucket, AIMD adaptation on throttling, jittered back-off,
slots handed out oldest first, and a gauge that remembers its peak (so tests and metrics can
show a bound held)."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import random
import time
from collections.abc import Callable


class TokenBucket:
    """`rate` tokens per second, holding at most `burst`. `acquire` waits its turn (FIFO).

    The rate can change while callers wait; the bucket picks up the new rate on its next
    refill, which is how `AdaptiveRate` slows starts down without draining anyone.
    """

    def __init__(
        self, rate: float, burst: float = 1.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("TokenBucket needs rate > 0 and burst >= 1")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._tokens = burst
        self._stamp = clock()
        self._lock = asyncio.Lock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now

    def try_acquire(self) -> bool:
        """Take a token if one is there, without waiting (a server refusing with 429)."""
        self._refill()
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    def ready_in(self) -> float:
        """Seconds until a token is there (0: now), taking nothing."""
        self._refill()
        return max(0.0, (1 - self._tokens) / self.rate)

    def take(self) -> None:
        """Take a token, due now or within a moment (a timer firing a hair early): the bucket
        may go a fraction below empty, which the next refill repays, so the rate holds."""
        self._refill()
        self._tokens -= 1

    async def acquire(self) -> None:
        async with self._lock:
            while True:
                if self.try_acquire():
                    return
                await asyncio.sleep((1 - self._tokens) / self.rate)


class AdaptiveRate:
    """Additive-increase, multiplicative-decrease control of a bucket's rate.

    A throttle halves the rate (at most once per `cooldown` seconds, so one burst of 429s
    counts once, and never below `floor`); each success adds back `ceiling / recover_steps`.
    """

    def __init__(
        self,
        bucket: TokenBucket,
        *,
        decrease: float = 0.5,
        recover_steps: int = 20,
        floor_fraction: float = 0.05,
        cooldown: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.bucket = bucket
        self.ceiling = bucket.rate
        self.floor = self.ceiling * floor_fraction
        self._decrease = decrease
        self._step = self.ceiling / recover_steps
        self._cooldown = cooldown
        self._clock = clock
        self._last_cut = -float("inf")
        self.cuts = 0

    @property
    def rate(self) -> float:
        return self.bucket.rate

    def on_throttle(self) -> None:
        now = self._clock()
        if now - self._last_cut >= self._cooldown:
            self.bucket.rate = max(self.floor, self.bucket.rate * self._decrease)
            self._last_cut = now
            self.cuts += 1

    def on_success(self) -> None:
        self.bucket.rate = min(self.ceiling, self.bucket.rate + self._step)

    async def acquire(self) -> None:
        await self.bucket.acquire()


def backoff_delay(attempt: int, base: float, cap: float, rng: random.Random | None = None) -> float:
    """Full-jitter exponential back-off: uniform in [0, min(cap, base * 2**attempt)]."""
    return (rng or random).uniform(0, min(cap, base * 2**attempt))


class Gauge:
    """A counter of things in flight that remembers the most it ever held."""

    def __init__(self) -> None:
        self.value = 0
        self.peak = 0

    def add(self) -> None:
        self.value += 1
        self.peak = max(self.peak, self.value)

    def remove(self) -> None:
        self.value -= 1

    def __enter__(self) -> Gauge:
        self.add()
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


class OrderedSlots:
    """`size` slots, a semaphore whose waiters are served lowest `priority` first, then in
    arrival order: the dispatcher passes a request's step, so a long rollout of an older step
    waiting for a slot is never overtaken by newer steps' requests (oldest-first admission)."""

    def __init__(self, size: int) -> None:
        self._free = size
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._arrivals = itertools.count()

    def locked(self) -> bool:
        """No slot is free to take at once."""
        return self._free == 0

    async def acquire(self, priority: int = 0) -> None:
        if self._free:  # free slots mean nobody waits: returns without yielding to the loop
            self._free -= 1
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (priority, next(self._arrivals), granted))
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self.release()  # granted in the same turn of the loop it was cancelled
            granted.cancel()  # a cancelled waiter is skipped when its turn comes
            raise

    def release(self) -> None:
        while self._waiters:
            granted = heapq.heappop(self._waiters)[2]
            if not granted.done():
                granted.set_result(None)  # the slot passes straight to the next waiter
                return
        self._free += 1
