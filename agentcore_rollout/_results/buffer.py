"""RolloutBuffer: turns the results its inbox announces and S3's objects into deliveries for
waiting requests.

S3 is the source of truth; SQS only says where to look, and a result can be announced twice,
late, or never. So every object is verified before a request sees it, a request's key is looked
up in S3 when its deadline nears without a notification, and ended requests are remembered for a
window of steps, so duplicates and late results are counted, never mixed in."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

from .._batch import LateResult
from .._flow import backoff_delay
from .._redact import get_logger
from ..config import EngineConfig
from ..contract import (
    INLINE_RESULT_MAX_BYTES,
    ContractError,
    ObjectRef,
    ResultKey,
    RolloutResult,
    normal_prefix,
    parse_result_key,
    result_key,
)
from .inbox import Handled, Inbox
from .objects import ResultObjects, Transient
from .verify import checked_inline

log = get_logger("agentcore_rollout.buffer")

_INLINE_WAIT = 2.0
"""Seconds the bucket's notification of a result small enough to come inline is held, the
first time it is received before the agent's own message: that message usually follows
within milliseconds (moto notifies before the put returns; S3 later), and both are then
deleted in one call, with no GetObject. If it does not come, the notification is released
to come back at once, and the object is read."""


@dataclass(frozen=True)
class Delivery:
    """What the buffer saw of one request, handed over exactly once: a verified `result`, an
    object at its key that failed verification (`invalid`: why), or no result (`missing`: why
    the buffer stopped waiting). Facts only: the engine's `_decide` makes them an outcome."""

    result: RolloutResult | None = None
    invalid: str | None = None
    missing: str | None = None
    handed_off_at: float = field(default_factory=time.time)
    via: Literal["notification", "lookup", "deadline", "cancel"] = "notification"


@dataclass
class _Waiter:
    request_id: str
    step: int
    key: str
    sig_key: str
    future: asyncio.Future[Delivery]
    busy: bool = False  # a download for it is under way
    held: str | None = None  # the receipt of its bucket notification, held for `_INLINE_WAIT`
    held_timer: asyncio.TimerHandle | None = None


class RolloutBuffer:
    """Collects results for the requests registered with `expect`, and only those.

    Ended requests are remembered per step (to tell a duplicate or a late result from an
    unknown one) until their step falls out of the retained window: `advance(step)` forgets
    every step older than `step - max_staleness - 1` (so a request ended `stale` is still
    known), so a long run holds flat memory.
    """

    def __init__(self, s3: Any, sqs: Any, config: EngineConfig) -> None:
        self._objects = ResultObjects(s3, config)
        self._inbox = Inbox(sqs, config, self._ingest)
        self._cfg = config
        self._prefix = normal_prefix(config.prefix)
        self._waiters: dict[str, _Waiter] = {}
        # step -> request_id -> the signing key of a request that ended without a result
        # (its result may still come, late), or None once nothing more is expected of it
        self._ended: dict[int, dict[str, str | None]] = {}
        self._late: dict[int, list[LateResult]] = {}
        self._step = 0
        self._window = config.limits.max_staleness + 1
        self._counts: Counter[str] = Counter()
        self._invalid: Counter[str] = Counter()
        self._rejected_inline: Counter[str] = Counter()

    # ----------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        await self._inbox.start()

    async def close(self) -> None:
        for w in self._waiters.values():  # held notifications come back for the next engine
            self._settle_held(w, False)
        await self._inbox.close()

    def stats(self) -> dict[str, Any]:
        """This buffer's share of `EngineStats`."""
        c = self._counts
        return {
            **self._inbox.stats(),
            "step": self._step,
            "downloads": self._objects.downloads,
            "inline_results": c["inline_results"],
            "rejected_inline": self._rejected_inline,
            "duplicates": c["duplicates"],
            "unmatched": c["unmatched"],
            "late_results": c["late_results"],
            "s3_lookups": c["lookups"],
            "recovered_by_lookup": c["recovered_by_lookup"],
            "invalid_results": self._invalid,
            "tracked_requests": len(self._waiters) + sum(map(len, self._ended.values())),
        }

    # ----------------------------------------------------------------- steps

    def advance(self, step: int) -> None:
        """Make `step` the current policy version and forget what is out of the window."""
        self._step = step
        horizon = step - self._window
        for old in [s for s in self._ended if s < horizon]:
            del self._ended[old]
        for old in [s for s in self._late if s < horizon]:
            del self._late[old]

    def take_late(self) -> list[LateResult]:
        """Hand over (and forget) the results that arrived after their request had ended."""
        taken = [r for results in self._late.values() for r in results]
        self._late.clear()
        return taken

    # ----------------------------------------------------------------- requests

    def expect(self, request_id: str, *, step: int, sig_key: str) -> str:
        """Register a request before it is dispatched, so no result can arrive unclaimed.
        Returns the key its result must be written to."""
        if request_id in self._waiters or any(request_id in e for e in self._ended.values()):
            raise ValueError(f"request_id {request_id!r} is already in use")
        key = result_key(self._prefix, self._cfg.exp_id, step, request_id)
        future = asyncio.get_running_loop().create_future()
        self._waiters[request_id] = _Waiter(request_id, step, key, sig_key, future)
        return key

    async def stored(self, request_id: str, step: int) -> bool:
        """Whether S3 holds an object at the request's key (unchecked: `look_up` reads and
        verifies it). A transient error counts as not stored: the caller runs it anew."""
        self._counts["lookups"] += 1
        return await self._objects.exists(
            result_key(self._prefix, self._cfg.exp_id, step, request_id)
        )

    async def wait(
        self, request_id: str, deadline: float, lost: asyncio.Event | None = None
    ) -> Delivery:
        """Wait for the request's result. `reconcile_before` the deadline, look in S3
        directly, and again after `result_grace` past it; then deliver that none came. Once
        `lost` is set (the session's endpoint was declared down), the deadline is now."""
        w = self._waiters[request_id]
        limits = self._cfg.limits
        why = "no result by the deadline"
        try:
            early = deadline - limits.reconcile_before
            if lost is not None and await _lost_first(w.future, lost, early):
                early = deadline = time.time()
                why = "its runtime endpoint was declared down, and no result came"
            for until in (early, deadline + limits.result_grace):
                if not await _wait_until(w.future, until):
                    await self._reconcile(w)
                if w.future.done():
                    return w.future.result()
            return self._resolve(w, Delivery(missing=why, via="deadline"))
        finally:
            self._retire(w)

    async def look_up(self, request_id: str) -> Delivery | None:
        """Read a registered request's result straight from S3 now (resuming after a restart:
        the result may have been written while no engine listened). None if there is none."""
        w = self._waiters[request_id]
        for attempt in range(3):
            try:
                delivery = await self._verified(w.key, w.request_id, w.step, w.sig_key, "lookup")
            except Transient as e:
                log.warning(
                    "lookup of request_id=%s failed (%s), attempt %d", request_id, e, attempt
                )
                await asyncio.sleep(backoff_delay(attempt, 0.5, 2.0))
                continue
            self._counts["lookups"] += 1
            return None if delivery is None else self._resolve(w, delivery)
        return None

    def cancel(self, request_id: str, reason: str = "cancelled") -> None:
        """Stop waiting for a request the engine ended (`reason`: why): no result, `via`
        `cancel`."""
        w = self._waiters.get(request_id)
        if w is not None:
            self._resolve(w, Delivery(missing=reason, via="cancel"))
            self._retire(w)

    def _retire(self, w: _Waiter) -> None:
        if self._waiters.pop(w.request_id, None) is None:
            return
        delivery = w.future.result() if w.future.done() and not w.future.cancelled() else None
        self._settle_held(w, delivery is not None and delivery.result is not None)
        if w.step < self._step - self._window:
            return  # already out of the window: nothing to remember it for
        late_key = w.sig_key if delivery is None or delivery.result is None else None
        self._ended.setdefault(w.step, {})[w.request_id] = late_key

    @staticmethod
    def _resolve(w: _Waiter, delivery: Delivery) -> Delivery:
        if not w.future.done():
            w.future.set_result(delivery)
        return w.future.result()

    # ----------------------------------------------------------------- results

    async def _ingest(
        self,
        key: ResultKey,
        ref: ObjectRef | None = None,
        size: int = 0,
        holdable: str | None = None,
        via: Literal["notification", "lookup"] = "notification",
    ) -> Handled:
        """Route one announced result (`ref`: what the notification said of it, the result
        itself if it came inline, `size` bytes of message; `holdable`: the receipt of a
        notification that may be held for the inline copy). `release` if no request here,
        waiting or ended, expects it."""
        w = self._waiters.get(key.request_id)
        if w is None:
            return await self._ingest_unclaimed(key, ref, size)
        if w.future.done() or w.busy:
            self._counts["duplicates"] += 1
            return "delete"
        if ref is not None and ref.result is not None:
            result = self._accept_inline(key, ref.result, size, w.sig_key)
            if result is None:
                return "forged"
            self._resolve(w, Delivery(result, via=via))
            return "delete"
        if holdable and w.held is None and ref is not None and self._may_come_inline(ref):
            w.held = holdable
            w.held_timer = asyncio.get_running_loop().call_later(
                _INLINE_WAIT, self._settle_held, w, False
            )
            return "held"
        w.busy = True
        try:
            delivery = await self._verified(key.key, w.request_id, w.step, w.sig_key, via)
        finally:
            w.busy = False
        if delivery is not None:
            self._resolve(w, delivery)
        return "delete"

    def _settle_held(self, w: _Waiter, delivered: bool) -> None:
        """Delete a held notification whose result was delivered (a duplicate now); release
        any other to come back at once (its inline copy is overdue, or its request ended
        without a result: it is read like any late one)."""
        receipt, w.held = w.held, None
        if w.held_timer is not None:
            w.held_timer.cancel()
            w.held_timer = None
        if receipt is None:
            return
        self._counts["duplicates"] += delivered
        self._inbox.settle(receipt, delete=delivered)

    def _may_come_inline(self, ref: ObjectRef) -> bool:
        """Whether the agent was told to send this object in its own message too."""
        small = ref.size is not None and ref.size <= INLINE_RESULT_MAX_BYTES
        return small and self._cfg.results.notify_directly

    def _accept_inline(
        self, key: ResultKey, result: RolloutResult, size: int, sig_key: str
    ) -> RolloutResult | None:
        """A result the agent's own message carried, checked as its object would be (size,
        the request it answers, signature); None, counted by reason, if it fails."""
        limit = self._cfg.results.max_result_bytes
        try:
            checked_inline(result, key, size, self._cfg.exp_id, sig_key, limit)
        except ContractError as e:
            self._rejected_inline[e.reason] += 1
            log.warning("inline result request_id=%s set aside: %s", key.request_id, e)
            return None
        self._counts["inline_results"] += 1
        return result

    async def _ingest_unclaimed(self, key: ResultKey, ref: ObjectRef | None, size: int) -> Handled:
        """A result nobody waits for: a duplicate, a late one (kept apart), or unknown."""
        ended = self._ended.get(key.step, {})
        if key.request_id not in ended:
            self._counts["unmatched"] += 1
            return "release"
        sig_key = ended[key.request_id]
        if sig_key is None:
            self._counts["duplicates"] += 1
            return "delete"
        if ref is not None and ref.result is not None:
            result = self._accept_inline(key, ref.result, size, sig_key)
            if result is None:
                return "forged"  # the object in S3, or its notification, may still come
            ended[key.request_id] = None
        else:
            ended[key.request_id] = None  # whatever this turns out to be, it is the only one
            delivery = await self._verified(
                key.key, key.request_id, key.step, sig_key, "notification"
            )
            result = None if delivery is None else delivery.result
        if result is None:
            return "delete"
        self._counts["late_results"] += 1
        self._late.setdefault(key.step, []).append(
            LateResult(
                request_id=key.request_id,
                step=key.step,
                reward=result.scalar_reward(),
            )
        )
        return "delete"

    async def _verified(
        self,
        key: str,
        request_id: str,
        step: int,
        sig_key: str,
        via: Literal["notification", "lookup"],
    ) -> Delivery | None:
        """Download and check one object. None if it does not exist (yet)."""
        try:
            result = await self._objects.read(key, step, request_id, sig_key)
        except ContractError as e:
            self._invalid[e.reason] += 1
            log.warning("invalid result request_id=%s: %s", request_id, e)
            return Delivery(invalid=str(e), via=via)
        return None if result is None else Delivery(result, via=via)

    async def _reconcile(self, w: _Waiter) -> None:
        """Read a waiting request's key straight from S3 (`reconcile_before` its deadline, and
        after the grace), for when the notification is late or lost."""
        if w.future.done():
            return
        self._counts["lookups"] += 1
        try:
            await self._ingest(parse_result_key(w.key), via="lookup")
        except Transient as e:
            log.warning("lookup of request_id=%s failed: %s", w.request_id, e)
        if w.future.done():
            self._counts["recovered_by_lookup"] += 1


async def _lost_first(future: asyncio.Future[Delivery], lost: asyncio.Event, when: float) -> bool:
    """Wait for the result, `lost` or `when`; whether `lost` came first."""
    lost_wait = asyncio.ensure_future(lost.wait())
    try:
        await asyncio.wait(
            {asyncio.shield(future), lost_wait},
            timeout=max(0.0, when - time.time()),
            return_when=asyncio.FIRST_COMPLETED,
        )
    finally:
        lost_wait.cancel()
    return lost.is_set() and not future.done()


async def _wait_until(future: asyncio.Future[Delivery], when: float) -> bool:
    try:
        await asyncio.wait_for(asyncio.shield(future), timeout=max(0.0, when - time.time()))
        return True
    except TimeoutError:
        return future.done()
