"""Flow control: the dispatcher's bounds and reactions, with an in-process fake runtime
(pure logic; the same bounds are checked through the real wire in test_failures.py)."""

from __future__ import annotations

import asyncio
import math
import random
import time

import pytest

from agentcore_rollout import SessionCallError
from agentcore_rollout._dispatcher import RequestDispatcher, SubmitFailed
from agentcore_rollout._limits import AdaptiveRate, Gauge, TokenBucket, backoff_delay
from agentcore_rollout.config import EngineConfig


class FakeRuntime:
    def __init__(self, start_time: float = 0.0, errors: list[SessionCallError] | None = None):
        self.start_time = start_time
        self.errors = list(errors or [])
        self.in_flight = Gauge()
        self.invoked: list[str] = []
        self.stopped: list[str] = []

    async def invoke(self, session_id: str, payload: bytes) -> None:
        with self.in_flight:
            await asyncio.sleep(self.start_time)
            if self.errors:
                raise self.errors.pop(0)
            self.invoked.append(session_id)

    async def stop(self, session_id: str) -> None:
        self.stopped.append(session_id)


def _cfg(**kw) -> EngineConfig:
    base = dict(bucket="bkt", queue_url="q", runtime_arn="a", backoff_base=0.01, backoff_max=0.05)
    return EngineConfig(**(base | kw))


async def test_token_bucket_paces_to_its_rate():
    bucket = TokenBucket(rate=100.0)
    began = time.monotonic()
    for _ in range(31):
        await bucket.acquire()
    assert time.monotonic() - began >= 0.3 * 0.95  # 30 tokens after the first, at 100/s


def test_try_acquire_refuses_when_empty_and_refills():
    now = [0.0]
    bucket = TokenBucket(rate=2.0, burst=2.0, clock=lambda: now[0])
    assert [bucket.try_acquire() for _ in range(3)] == [True, True, False]
    now[0] = 0.5  # one token back at 2/s
    assert [bucket.try_acquire() for _ in range(2)] == [True, False]


def test_adaptive_rate_cuts_once_per_cooldown_and_recovers():
    now = [0.0]
    rate = AdaptiveRate(TokenBucket(10.0), cooldown=1.0, recover_steps=10, clock=lambda: now[0])
    rate.on_throttle()
    rate.on_throttle()  # same burst: ignored
    assert rate.rate == 5.0 and rate.cuts == 1
    now[0] = 2.0
    rate.on_throttle()
    assert rate.rate == 2.5
    for _ in range(100):
        rate.on_success()
    assert rate.rate == 10.0


def test_backoff_is_bounded_full_jitter():
    rng = random.Random(0)
    delays = [backoff_delay(a, 0.1, 1.0, rng) for a in range(10) for _ in range(50)]
    assert all(0 <= d <= 1.0 for d in delays)
    assert max(delays[:50]) <= 0.1


async def test_starts_in_flight_bounded_by_littles_law():
    cfg = _cfg(start_rate=200.0, session_start_time=0.05)
    runtime = FakeRuntime(start_time=0.1)
    d = RequestDispatcher(runtime, cfg)
    await asyncio.gather(*(d.start(f"s{i:040d}", b"{}", time.time() + 30) for i in range(40)))
    assert runtime.in_flight.peak == d.starting.peak == math.ceil(200 * 0.05) == 10


async def test_live_slots_bounded_and_released_on_error():
    d = RequestDispatcher(FakeRuntime(), _cfg(start_rate=1000.0, max_live_sessions=3))
    holders = Gauge()

    async def one(i: int) -> None:
        async with d.live_slot():
            with holders:
                await asyncio.sleep(0.01)
            if i % 2:
                raise RuntimeError("boom")

    results = await asyncio.gather(*(one(i) for i in range(12)), return_exceptions=True)
    assert holders.peak == 3 and d.live.peak == 3 and d.live.value == 0
    assert sum(isinstance(r, RuntimeError) for r in results) == 6


@pytest.mark.parametrize(
    ("error", "attempts", "fails"),
    [
        (SessionCallError("ThrottlingException", "slow", retryable=True, throttled=True), 3, False),
        (SessionCallError("ServiceQuotaExceededException", "full", retryable=True), 3, False),
        (SessionCallError("ValidationException", "bad", retryable=False), 1, True),
    ],
)
async def test_retry_policy(error, attempts, fails):
    runtime = FakeRuntime(errors=[error, error])
    d = RequestDispatcher(runtime, _cfg(start_rate=1000.0))
    if fails:
        with pytest.raises(SubmitFailed, match=error.code):
            await d.start("s" * 40, b"{}", time.time() + 10)
    else:
        await d.start("s" * 40, b"{}", time.time() + 10)
    stats = d.stats()
    assert stats["invokes"] == attempts
    assert stats["retries"] == ({} if fails else {error.code: 2})
    assert stats["throttles"] == (2 if error.throttled else 0)
    assert stats["rate_cuts"] == (1 if error.throttled else 0)


async def test_retries_exhausted_and_deadline():
    err = SessionCallError("InternalServerException", "x", retryable=True)
    d = RequestDispatcher(FakeRuntime(errors=[err] * 5), _cfg(start_rate=1000.0, max_retries=2))
    with pytest.raises(SubmitFailed, match="gave up after 3 attempts"):
        await d.start("s" * 40, b"{}", time.time() + 10)
    d = RequestDispatcher(FakeRuntime(), _cfg(start_rate=1000.0))
    with pytest.raises(SubmitFailed, match="deadline passed"):
        await d.start("s" * 40, b"{}", time.time() - 1)
