"""Flow control: the dispatcher's bounds and reactions, with an in-process fake runtime
(pure logic; the same bounds are checked through the real wire in test_failures.py)."""

from __future__ import annotations

import asyncio
import math
import random
import time

import pytest

from agentcore_rollout import SessionCallError
from agentcore_rollout._dispatch.dispatcher import PROBE_SESSION_PREFIX, RequestDispatcher, Started
from agentcore_rollout._dispatch.endpoints import SubmitFailed, retry_budget
from agentcore_rollout._dispatch.start_queue import LiveSession
from agentcore_rollout._flow import AdaptiveRate, Gauge, OrderedSlots, TokenBucket, backoff_delay
from agentcore_rollout.config import EngineConfig

from .factories import flat_config

pytestmark = pytest.mark.unit


class FakeRuntime:
    def __init__(self, start_time: float = 0.0, errors: list[SessionCallError] | None = None):
        self.start_time = start_time
        self.errors = list(errors or [])
        self.in_flight = Gauge()
        self.invoked: list[str] = []
        self.stopped: list[str] = []
        self.probes = 0  # the dispatcher's stops of a session that never existed

    async def invoke(self, session_id: str, payload: bytes) -> None:
        with self.in_flight:
            await asyncio.sleep(self.start_time)
            if self.errors:
                raise self.errors.pop(0)
            self.invoked.append(session_id)

    async def stop(self, session_id: str) -> None:
        if session_id.startswith(PROBE_SESSION_PREFIX):
            self.probes += 1
        else:
            self.stopped.append(session_id)


ARN = "arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/test_agent-abc123"


def _cfg(**kw) -> EngineConfig:
    base = dict(bucket="bkt", queue_url="q", runtime_arn=ARN, backoff_base=0.01, backoff_max=0.05)
    return flat_config(**(base | kw))


async def _start(
    d: RequestDispatcher,
    sid: str = "s" * 40,
    sessions: list[LiveSession] | None = None,
    *,
    timeout: float = 10.0,
    start_deadline: float = math.inf,
) -> Started:
    """Start one session in its own live slot; `sessions` gets the slot's LiveSession."""
    async with d.live_session(sid, start_deadline) as session:
        if sessions is not None:
            sessions.append(session)
        return await d.start(session, lambda _: b"{}", timeout=timeout, deadline=math.inf)


def _outage(code: str = "EndpointConnectionError") -> SessionCallError:
    return SessionCallError(code, "down", retryable=True, outage=True, maybe_started=False)


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
    await asyncio.gather(*(_start(d, f"s{i:040d}") for i in range(40)))
    peak = d.stats()["peak_starts_in_flight"]
    assert runtime.in_flight.peak == peak == math.ceil(200 * 0.05) == 10


async def test_live_slots_bounded_and_released_on_error():
    d = RequestDispatcher(FakeRuntime(), _cfg(start_rate=1000.0, max_live_sessions=3))
    holders = Gauge()

    async def one(i: int) -> None:
        async with d.live_session(f"s{i:040d}", math.inf):
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
            await _start(d)
    else:
        await _start(d)
    stats = d.stats()
    assert stats["invokes"] == attempts
    assert stats["retries"] == ({} if fails else {error.code: 2})
    assert stats["throttles"] == (2 if error.throttled else 0)
    assert stats["rate_cuts"] == (1 if error.throttled else 0)


async def test_retries_exhausted_and_not_started_in_time():
    err = SessionCallError("InternalServerException", "x", retryable=True)
    d = RequestDispatcher(FakeRuntime(errors=[err] * 5), _cfg(start_rate=1000.0, max_retries=2))
    with pytest.raises(SubmitFailed, match="gave up after 3 attempts: InternalServerException"):
        await _start(d)
    d = RequestDispatcher(FakeRuntime(start_time=0.2), _cfg(start_rate=1000.0, max_live_sessions=1))
    async with d.live_session("s" * 40, math.inf) as held:  # the only slot is taken
        d.adopt(held, "runtime")  # a session running on the (only) endpoint
        with pytest.raises(SubmitFailed, match=r"not started in time: .* live-session slot"):
            async with d.live_session("t" * 40, time.time() + 0.05):
                pass
        assert d.live.value == 1
    await d.aclose()  # the held session's stop, behind
    assert d.live.value == 0 and d.stats()["stops"] == 1


async def test_time_queued_for_the_start_rate_does_not_count_against_the_rollout():
    d = RequestDispatcher(FakeRuntime(), _cfg(start_rate=20.0))  # one start per 50 ms
    began = time.time()
    attempts = await asyncio.gather(*(_start(d, f"s{i:040d}", timeout=1.0) for i in range(10)))
    sent = sorted(a.sent_at for a in attempts)
    assert sent[-1] - began >= 0.3  # the last waited its turn ...
    assert all(a.deadline == a.sent_at + 1.0 for a in attempts)  # ... and still got its second


async def test_a_runtime_that_stays_down_fails_queued_starts_at_once():
    cfg = _cfg(start_rate=5.0, max_retries=20, backoff_base=0.02, backoff_max=0.1)
    runtime = FakeRuntime(errors=[_outage()] * 1000)
    d = RequestDispatcher(runtime, cfg)
    budget = retry_budget(cfg.dispatch)  # 1.86 s: each request alone could retry this long
    records: list[LiveSession] = []
    began = time.monotonic()
    results = await asyncio.gather(
        *(_start(d, f"s{i:040d}", records) for i in range(30)), return_exceptions=True
    )
    took = time.monotonic() - began
    assert all(isinstance(r, SubmitFailed) for r in results)
    assert sum("runtime down for" in str(r) for r in results) >= 25
    assert all("EndpointConnectionError" in str(r) for r in results)  # the cause, not a timeout
    # At 5 starts/s the 30 requests' retries alone would take minutes; they end near the budget.
    assert took < 3 * budget
    assert d.stats()["runtime_down"] is True
    assert not any(r.maybe_started for r in records)  # refused connections started nothing


async def test_a_probe_finds_the_runtime_back():
    cfg = _cfg(start_rate=1000.0, max_retries=3, backoff_base=0.01, backoff_max=0.05)
    runtime = FakeRuntime(errors=[_outage()] * 1000)
    d = RequestDispatcher(runtime, cfg)
    for _ in range(100):  # the back-off is jittered: fail until the outage outlasts the budget
        with pytest.raises(SubmitFailed):
            await _start(d)
        if d.stats()["runtime_down"]:
            break
    assert d.stats()["runtime_down"] is True
    runtime.errors.clear()
    await asyncio.sleep(cfg.dispatch.backoff_max)  # one probe per backoff_max while down
    started = await _start(d)
    assert started.sent_at is not None and d.stats()["runtime_down"] is False


async def test_maybe_started_follows_what_the_attempts_did():
    refused = SessionCallError("ThrottlingException", "slow", retryable=True, maybe_started=False)
    cut_off = SessionCallError("ReadTimeoutError", "no answer", retryable=False, outage=True)
    d = RequestDispatcher(FakeRuntime(errors=[refused, cut_off]), _cfg(start_rate=1000.0))
    record: list[LiveSession] = []
    with pytest.raises(SubmitFailed, match="ReadTimeoutError"):
        await _start(d, sessions=record)
    await d.aclose()
    assert record[0].maybe_started and d.stats()["stops"] == 1  # so it was stopped
    d = RequestDispatcher(FakeRuntime(errors=[refused]), _cfg(start_rate=1000.0, max_retries=0))
    record = []
    with pytest.raises(SubmitFailed):
        await _start(d, sessions=record)
    await d.aclose()
    assert not record[0].maybe_started and d.stats()["stops"] == 0


async def test_ordered_slots_serve_lowest_priority_first_and_skip_cancelled_waiters():
    slots, order = OrderedSlots(1), []
    await slots.acquire()

    async def take(name: str, priority: int) -> None:
        await slots.acquire(priority)
        order.append(name)

    waiters = {n: asyncio.create_task(take(n, p)) for n, p in [("b", 2), ("a", 1), ("gone", 0)]}
    await asyncio.sleep(0)
    waiters["gone"].cancel()
    await asyncio.sleep(0)
    slots.release()
    await asyncio.sleep(0)
    slots.release()
    await asyncio.gather(waiters["a"], waiters["b"])
    assert order == ["a", "b"] and slots.locked()
    granted = asyncio.create_task(slots.acquire(0))
    await asyncio.sleep(0)
    slots.release()  # granted and cancelled in the same turn: the slot comes back
    granted.cancel()
    await asyncio.gather(granted, return_exceptions=True)
    assert not slots.locked()
    await slots.acquire()
    assert slots.locked()


class _EarlyTimer:
    """A timer that fires 2 ms before the time its `when()` reports, as uvloop's may (its
    clock is libuv's, cached per loop turn, in whole milliseconds)."""

    def __init__(self, call_at, when: float, callback, *args) -> None:
        self._when = when
        self._handle = call_at(when - 0.002, callback, *args)

    def when(self) -> float:
        return self._when

    def cancel(self) -> None:
        self._handle.cancel()


async def test_a_timer_that_fires_early_still_wakes_the_waiters(monkeypatch):
    """Under uvloop (Ray's loop for async actors when it is installed, as vLLM and SGLang
    install it), the dispatcher once took its fired timer for a pending one and stalled."""
    runtime = FakeRuntime()
    d = RequestDispatcher(runtime, _cfg(start_rate=200.0))  # a token every 5 ms: timed waits
    loop = asyncio.get_running_loop()
    call_at = loop.call_at

    def early_for_the_dispatcher(when, callback, *args, **kw):
        if getattr(callback, "__self__", None) is d._queue:  # its start queue's timer
            return _EarlyTimer(call_at, when, callback, *args)
        return call_at(when, callback, *args, **kw)

    monkeypatch.setattr(loop, "call_at", early_for_the_dispatcher)
    starts = asyncio.gather(*(_start(d, f"s{i:040d}") for i in range(40)))
    await asyncio.wait_for(starts, timeout=10.0)
    assert len(runtime.invoked) == 40
