"""RolloutBuffer: turns SQS notifications and S3 objects into deliveries for waiting requests.

S3 is the source of truth; SQS only says where to look. Notifications can be duplicated,
late, lost, foreign or malformed, so the buffer:
- long-polls, parses both notification forms, and deletes a message only after hand-off
  (in batches: a handled message waits up to `_DELETE_WINDOW` for others to share a call),
- after a receive that brought a partial batch, waits `_RECEIVE_GATHER` before the next,
  so at moderate traffic one call brings several messages,
- leaves messages that are not its own on the queue, hidden longer each time they come back
  (`_hidden_for`): a polluted queue costs a few receives per message, no S3 call,
- verifies every object (size, schema, signature, key) before a request sees it, and a
  result the agent's own message carries exactly as it would the object: one that passes
  needs no GetObject (the bucket's notification of it, which still comes, is a duplicate);
  one that fails is set aside unread, never an outcome, and the object in S3 decides,
- looks a request's key up in S3 directly when its deadline nears with no notification,
- remembers ended requests (per step, for a window of steps), so duplicates and late results
  are counted, never mixed in.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
from botocore.exceptions import BotoCoreError, ClientError

from ._batch import StaleResult
from ._limits import backoff_delay
from ._redact import get_logger
from .config import EngineConfig
from .contract import (
    INLINE_RESULT_MAX_BYTES,
    ContractError,
    ObjectRef,
    Outcome,
    ResultKey,
    RolloutResult,
    decode_result,
    normal_prefix,
    parse_notification,
    parse_result_key,
    result_key,
    verify_result,
)

log = get_logger("agentcore_rollout.buffer")

# keep: back after the visibility timeout; the others: see `_hidden_for`
_MessageFate = Literal[
    "delete", "release", "other_exp", "foreign", "malformed", "keep", "held", "forged"
]
_Handled = Literal["delete", "release", "held", "forged"]  # one result's fate
_MAX_BATCHES = 4  # received batches being downloaded at once, per poller
_CHECK_IN_THREAD_BYTES = 256 * 1024  # larger objects are checked off the event loop
_SQS_MAX_VISIBILITY = 12 * 3600  # counted from the receive
_SET_ASIDE_GROWTH = 4  # each return of a message nobody takes hides it this much longer
_POLLERS = 1  # one receive at a time suffices: 10 messages each, handled while the next is made
_FOREIGN_VISIBILITY = 2  # seconds: the engine it may be for takes it within a receive or two
_RECEIVE_GATHER = 0.05  # seconds: the next receive brings several, for 50 ms more latency at most
_DELETE_WINDOW = 0.5  # seconds: fills calls at tens of results/s; under any visibility timeout > 0
_DOWNLOADS = 16  # concurrent GetObjects: over a batch's 10, well within _aws's 64 connections
_INLINE_WAIT = 2.0
"""Seconds the bucket's notification of a result small enough to come inline is held, the
first time it is received before the agent's own message: that message usually follows
within milliseconds (moto notifies before the put returns; S3 later), and both are then
deleted in one call, with no GetObject. If it does not come, the notification is released
to come back at once, and the object is read."""


@dataclass(frozen=True)
class Delivery:
    """What the buffer hands to a waiting request: exactly one per request."""

    outcome: Outcome
    result: RolloutResult | None = None
    error: str | None = None
    handed_off_at: float = field(default_factory=time.time)
    via: Literal["notification", "lookup", "deadline"] = "notification"


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


class _Transient(Exception):
    """S3 could not be read right now; keep the message, it will come back."""


class RolloutBuffer:
    """Collects results for the requests registered with `expect`, and only those.

    Ended requests are remembered per step (to tell a duplicate or a late result from an
    unknown one) until their step falls out of the retained window: `advance(step)` forgets
    every step older than `step - max_staleness - 1` (so a request ended `stale` is still
    known), so a long run holds flat memory.
    """

    def __init__(self, s3: Any, sqs: Any, config: EngineConfig) -> None:
        self._s3 = s3
        self._sqs = sqs
        self._cfg = config
        self._prefix = normal_prefix(config.prefix)
        self._waiters: dict[str, _Waiter] = {}
        # step -> request_id -> the signing key of a request that ended without a result
        # (its result may still come, late), or None once nothing more is expected of it
        self._ended: dict[int, dict[str, str | None]] = {}
        self._stale: dict[int, list[StaleResult]] = {}
        self._step = 0
        self._window = config.limits.max_staleness + 1
        self._downloads = asyncio.Semaphore(_DOWNLOADS)
        self._pollers: list[asyncio.Task[None]] = []
        self._deletes = _Batched(sqs.delete_message_batch, config.queue_url, _DELETE_WINDOW)
        self._releases = _Batched(
            sqs.change_message_visibility_batch, config.queue_url, _DELETE_WINDOW
        )
        self._counts: Counter[str] = Counter()
        self._invalid: Counter[str] = Counter()
        self._rejected_inline: Counter[str] = Counter()

    # ----------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        self._pollers = [
            asyncio.create_task(self._poll(), name=f"rollout-buffer-poller-{i}")
            for i in range(_POLLERS)
        ]

    async def close(self) -> None:
        for w in self._waiters.values():  # held notifications come back for the next engine
            self._settle_held(w, False)
        for task in self._pollers:
            task.cancel()
        for task, ended in zip(
            self._pollers,
            await asyncio.gather(*self._pollers, return_exceptions=True),
            strict=True,
        ):
            if not isinstance(ended, asyncio.CancelledError | None):
                log.error("%s ended with %r", task.get_name(), ended)
        self._pollers = []
        await asyncio.gather(self._deletes.close(), self._releases.close())

    def stats(self) -> dict[str, Any]:
        """This buffer's share of `EngineStats`."""
        c = self._counts
        return {
            "step": self._step,
            "messages": c["messages"],
            "downloads": c["downloads"],
            "inline_results": c["inline_results"],
            "rejected_inline": self._rejected_inline,
            "duplicates": c["duplicates"],
            "unmatched": c["unmatched"],
            "late_results": c["late_results"],
            "foreign_messages": c["foreign_messages"],
            "malformed_messages": c["malformed_messages"],
            "test_events": c["test_events"],
            "unsettled_messages": self._deletes.failed + self._releases.failed,
            "s3_lookups": c["lookups"],
            "recovered_by_lookup": c["recovered_by_lookup"],
            "invalid_results": self._invalid,
            "handler_errors": c["handler_errors"],
            "tracked_requests": len(self._waiters) + sum(map(len, self._ended.values())),
        }

    # ----------------------------------------------------------------- steps

    def advance(self, step: int) -> None:
        """Make `step` the current policy version and forget what is out of the window."""
        self._step = step
        horizon = step - self._window
        for old in [s for s in self._ended if s < horizon]:
            del self._ended[old]
        for old in [s for s in self._stale if s < horizon]:
            del self._stale[old]

    def take_stale(self) -> list[StaleResult]:
        """Hand over (and forget) the results that arrived after their request had ended."""
        taken = [r for results in self._stale.values() for r in results]
        self._stale.clear()
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
        key = result_key(self._prefix, self._cfg.exp_id, step, request_id)
        self._counts["lookups"] += 1
        try:
            await self._s3.head_object(Bucket=self._cfg.bucket, Key=key)
        except (ClientError, BotoCoreError, OSError) as e:
            if not isinstance(e, ClientError) or e.response.get("Error", {}).get("Code") not in (
                "NoSuchKey",
                "404",
            ):
                log.warning("lookup of request_id=%s failed: %s", request_id, e)
            return False
        return True

    async def wait(
        self, request_id: str, deadline: float, lost: asyncio.Event | None = None
    ) -> Delivery:
        """Wait for the request's result. Near `deadline`, look in S3 directly; past the
        deadline plus grace, deliver a `timeout`. Once `lost` is set (the session's endpoint
        was declared down), the deadline is now: look in S3, wait the grace, give up."""
        w = self._waiters[request_id]
        limits = self._cfg.limits
        why = "no result by the deadline"
        try:
            lookup_at = deadline - limits.reconcile_before
            if lost is not None and await self._lost_first(w.future, lost, lookup_at):
                lookup_at, deadline = time.time(), time.time()
                why = "its runtime endpoint was declared down, and no result came"
            for until in (lookup_at, deadline + limits.result_grace):
                if not await self._wait_until(w.future, until):
                    await self._lookup(w)
                if w.future.done():
                    return w.future.result()
            return self._resolve(w, Delivery(Outcome.TIMEOUT, error=why, via="deadline"))
        finally:
            self._retire(w)

    async def look_up(self, request_id: str) -> Delivery | None:
        """Read a registered request's result straight from S3 now (resuming after a restart:
        the result may have been written while no engine listened). None if there is none."""
        w = self._waiters[request_id]
        for attempt in range(3):
            try:
                delivery = await self._verified(w.key, w.request_id, w.step, w.sig_key, "lookup")
            except _Transient as e:
                log.warning(
                    "lookup of request_id=%s failed (%s), attempt %d", request_id, e, attempt
                )
                await asyncio.sleep(backoff_delay(attempt, 0.5, 2.0))
                continue
            self._counts["lookups"] += 1
            return None if delivery is None else self._resolve(w, delivery)
        return None

    def cancel(self, request_id: str, reason: str = "cancelled") -> None:
        w = self._waiters.get(request_id)
        if w is not None:
            self._resolve(w, Delivery(Outcome.CANCELLED, error=reason, via="deadline"))
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
    async def _lost_first(
        future: asyncio.Future[Delivery], lost: asyncio.Event, when: float
    ) -> bool:
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

    @staticmethod
    async def _wait_until(future: asyncio.Future[Delivery], when: float) -> bool:
        try:
            await asyncio.wait_for(asyncio.shield(future), timeout=max(0.0, when - time.time()))
            return True
        except TimeoutError:
            return future.done()

    @staticmethod
    def _resolve(w: _Waiter, delivery: Delivery) -> Delivery:
        if not w.future.done():
            w.future.set_result(delivery)
        return w.future.result()

    # ----------------------------------------------------------------- polling

    async def _poll(self) -> None:
        """Receive, hand each batch to a task, receive again: receiving overlaps with
        downloading, and at most `_MAX_BATCHES` batches are in hand at once. The task group
        owns those tasks: cancelling the poller cancels and awaits them."""
        failures = 0
        batches = asyncio.Semaphore(_MAX_BATCHES)
        async with asyncio.TaskGroup() as in_hand:
            while True:
                await batches.acquire()
                try:
                    resp = await self._sqs.receive_message(
                        QueueUrl=self._cfg.queue_url,
                        MaxNumberOfMessages=10,
                        WaitTimeSeconds=self._cfg.results.wait_time,
                        VisibilityTimeout=self._cfg.results.visibility_timeout,
                        MessageSystemAttributeNames=["ApproximateReceiveCount"],
                    )
                    failures = 0
                except Exception as e:  # the poller must outlive any one bad call
                    batches.release()
                    log.warning("receive_message failed (%r); retrying", e)
                    await asyncio.sleep(backoff_delay(failures, 0.2, 10.0))
                    failures += 1
                    continue
                messages = resp.get("Messages", [])
                self._counts["messages"] += len(messages)
                in_hand.create_task(self._process(messages, batches.release))
                if 0 < len(messages) < 10:
                    # More are coming but not enough to fill a batch: let them gather, so
                    # the next call brings several (an empty long poll has waited already).
                    await asyncio.sleep(_RECEIVE_GATHER)

    async def _process(self, messages: list[dict[str, Any]], done: Callable[[], None]) -> None:
        """Handle one received batch, settling each message as soon as it is handled (so a
        message whose result was handed over is deleted even if the batch is cut short).
        Results carried inline go first: the bucket's notification of the same object, in
        the same batch, then finds it delivered and needs no GetObject."""
        try:
            parsed = [(m, _parsed(m)) for m in messages]
            parsed.sort(key=lambda mp: not _carries_result(mp[1]))
            await asyncio.gather(*(self._handle_and_settle(m, refs) for m, refs in parsed))
        finally:
            done()

    async def _handle_and_settle(
        self, message: dict[str, Any], parsed: list[ObjectRef] | Exception
    ) -> None:
        """Never raises (a bug must not stop the poller): a message whose handling failed is
        kept, and comes back."""
        try:
            fate = await self._handle(message, parsed)
        except Exception as e:
            log.error("handling message %s failed: %r", message.get("MessageId"), e)
            self._counts["handler_errors"] += 1
            return
        entry = {"ReceiptHandle": message["ReceiptHandle"]}
        if fate == "delete":
            self._deletes.add(entry)
        elif fate not in ("keep", "held"):
            self._releases.add(entry | {"VisibilityTimeout": self._hidden_for(fate, message)})

    def _hidden_for(self, fate: _MessageFate, message: dict[str, Any]) -> int:
        """Seconds a released message stays hidden, by whose it may be.

        Ours, not expected here (`release`): `_FOREIGN_VISIBILITY`, for another engine of this
        experiment. Another experiment's result (`other_exp`): that too the first two times, as
        its engine may share this queue and takes it within a receive or two; then 4x longer
        each time it comes back, as nobody is listening. No engine's (another bucket, outside
        the prefix, malformed): a visibility timeout, then 4x longer each time. A backlog
        nobody takes thus stops taking receives from results, yet is never deleted: a later
        owner, or a redrive policy, still gets it. A message whose carried result fails
        verification (`forged`) is set aside the same way. Capped at SQS's 12 h."""
        cfg = self._cfg.results
        if fate == "release":
            return _FOREIGN_VISIBILITY
        returns = _receive_count(message) - 1
        if fate == "other_exp":
            first, returns = _FOREIGN_VISIBILITY, max(0, returns - 1)
        else:
            first = cfg.visibility_timeout
        longest = _SQS_MAX_VISIBILITY - cfg.visibility_timeout  # handled within the timeout
        return min(longest, first * _SET_ASIDE_GROWTH ** min(returns, 8))  # 4**8 s > 12 h

    async def _handle(
        self, message: dict[str, Any], parsed: list[ObjectRef] | Exception
    ) -> _MessageFate:
        if isinstance(parsed, ContractError):
            # Not ours to destroy: another consumer of this queue may read it.
            self._counts["malformed_messages"] += 1
            log.warning("malformed message %s: %s", message.get("MessageId"), parsed)
            return "malformed"
        if isinstance(parsed, Exception):
            raise parsed
        if not parsed:
            self._counts["test_events"] += 1
            return "delete"
        keys = [(self._result_key(ref), ref) for ref in parsed]
        own = [(k, ref) for k, ref in keys if k is not None and k.exp_id == self._cfg.exp_id]
        if not own:  # no S3 call for what is not ours
            self._counts["foreign_messages"] += 1
            return "other_exp" if any(k for k, _ in keys) else "foreign"
        # a first receipt of a notification of one object may be held for its inline copy
        holdable = message["ReceiptHandle"] if len(own) == len(parsed) == 1 else None
        if _receive_count(message) > 1:
            holdable = None
        size = len(message["Body"])
        try:
            fates = [
                await self._ingest(key, "notification", ref, size, holdable) for key, ref in own
            ]
        except _Transient:
            return "keep"
        for fate in ("forged", "held"):
            if fate in fates:
                return fate
        if len(own) < len(parsed):  # partly ours: the rest's owner needs it soon
            self._counts["foreign_messages"] += 1
            return "release"
        # Ours, but nobody here expects it: another engine of this experiment on the same
        # queue, or one resuming after a restart, may. Let it come back for them.
        return "delete" if all(f == "delete" for f in fates) else "release"

    def _result_key(self, ref: ObjectRef) -> ResultKey | None:
        """The result key `ref` names in our bucket and prefix, of any experiment."""
        if ref.bucket != self._cfg.bucket:
            return None
        try:
            key = parse_result_key(ref.key)
        except ContractError:
            return None
        return key if key.prefix == self._prefix else None

    # ----------------------------------------------------------------- results

    async def _ingest(
        self,
        key: ResultKey,
        via: Literal["notification", "lookup"],
        ref: ObjectRef | None = None,
        size: int = 0,
        holdable: str | None = None,
    ) -> _Handled:
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
            result = self._inline_checked(key, ref.result, size, w.sig_key)
            if result is None:
                return "forged"
            self._resolve(w, Delivery(Outcome(result.status), result=result, via=via))
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
        if delivered:
            self._counts["duplicates"] += 1
            self._deletes.add({"ReceiptHandle": receipt})
        else:
            self._releases.add({"ReceiptHandle": receipt, "VisibilityTimeout": 0})

    def _may_come_inline(self, ref: ObjectRef) -> bool:
        """Whether the agent was told to send this object in its own message too."""
        small = ref.size is not None and ref.size <= INLINE_RESULT_MAX_BYTES
        return small and self._cfg.results.notify_directly

    def _inline_checked(
        self, key: ResultKey, result: RolloutResult, size: int, sig_key: str
    ) -> RolloutResult | None:
        """A result the agent's own message carried, checked as its object would be (size,
        the request it answers, signature); None, counted by reason, if it fails."""
        limit = self._cfg.results.max_result_bytes
        try:
            if size > limit:
                raise ContractError(f"message is {size} bytes, over the {limit} limit", "too_large")
            _check_identity(result, key.key, self._cfg.exp_id, key.step, key.request_id)
            verify_result(result, sig_key)
        except ContractError as e:
            self._rejected_inline[e.reason] += 1
            log.warning("inline result request_id=%s set aside: %s", key.request_id, e)
            return None
        self._counts["inline_results"] += 1
        return result

    async def _ingest_unclaimed(self, key: ResultKey, ref: ObjectRef | None, size: int) -> _Handled:
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
            result = self._inline_checked(key, ref.result, size, sig_key)
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
        self._stale.setdefault(key.step, []).append(
            StaleResult(
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
            body = await self._download(key)
            if body is None:
                return None
            check = (
                key,
                body,
                self._cfg.exp_id,
                step,
                request_id,
                sig_key,
                self._cfg.results.max_result_bytes,
            )
            if len(body) > _CHECK_IN_THREAD_BYTES:  # ~10 ms a MB: keep the loop handing off
                result = await asyncio.to_thread(_checked_result, *check)
            else:
                result = _checked_result(*check)
        except ContractError as e:
            self._invalid[e.reason] += 1
            log.warning("invalid result request_id=%s: %s", request_id, e)
            return Delivery(Outcome.INVALID_RESULT, error=str(e), via=via)
        return Delivery(Outcome(result.status), result=result, via=via)

    async def _download(self, key: str) -> bytes | None:
        async with self._downloads:
            self._counts["downloads"] += 1
            try:
                resp = await self._s3.get_object(Bucket=self._cfg.bucket, Key=key)
            except ClientError as e:
                if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                    return None
                raise _Transient(str(e)) from None
            except (BotoCoreError, OSError) as e:
                raise _Transient(str(e)) from None
            size, limit = resp.get("ContentLength") or 0, self._cfg.results.max_result_bytes
            async with resp["Body"] as stream:
                if size > limit:  # refuse before reading it into memory
                    raise ContractError(
                        f"result object is {size} bytes, over the {limit} limit", "too_large"
                    )
                try:
                    return await stream.read()
                except (BotoCoreError, OSError, aiohttp.ClientError) as e:
                    raise _Transient(str(e)) from None

    async def _lookup(self, w: _Waiter) -> None:
        """Read the request's key straight from S3, for when the notification is late or lost."""
        if w.future.done():
            return
        self._counts["lookups"] += 1
        try:
            await self._ingest(parse_result_key(w.key), via="lookup")
        except _Transient as e:
            log.warning("lookup of request_id=%s failed: %s", w.request_id, e)
        if w.future.done():
            self._counts["recovered_by_lookup"] += 1


def _checked_result(
    key: str, body: bytes, exp_id: str, step: int, request_id: str, sig_key: str, max_bytes: int
) -> RolloutResult:
    """Parse, validate and verify one object (pure CPU: may run in a worker thread)."""
    result = decode_result(body, max_bytes)
    _check_identity(result, key, exp_id, step, request_id)
    verify_result(result, sig_key)
    return result


def _check_identity(
    result: RolloutResult, key: str, exp_id: str, step: int, request_id: str
) -> None:
    if (result.exp_id, result.step, result.request_id) != (exp_id, step, request_id):
        raise ContractError(
            f"object at {key} is for {result.exp_id}/{result.step}/{result.request_id}",
            "wrong_object",
        )


def _parsed(message: dict[str, Any]) -> list[ObjectRef] | Exception:
    """What a message announces, or why it cannot be read (handled with the message)."""
    try:
        return parse_notification(message["Body"])
    except Exception as e:
        return e


def _carries_result(parsed: list[ObjectRef] | Exception) -> bool:
    return not isinstance(parsed, Exception) and any(ref.result is not None for ref in parsed)


def _receive_count(message: dict[str, Any]) -> int:
    return int(message.get("Attributes", {}).get("ApproximateReceiveCount", 1))


class _Batched:
    """Sends SQS entries ten to a call (DeleteMessageBatch, ChangeMessageVisibilityBatch). An
    entry waits at most `window` seconds for others to share its call (the message's
    visibility timeout covers the wait); ten waiting go at once. A failed entry is counted and
    logged: its message comes back after the visibility timeout, and is then recognized."""

    def __init__(self, call: Callable[..., Awaitable[Any]], queue_url: str | None, window: float):
        self._call = call
        self._queue_url = queue_url
        self._window = window
        self._waiting: list[dict[str, Any]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._calls: set[asyncio.Task[None]] = set()
        self.failed = 0

    def add(self, entry: dict[str, Any]) -> None:
        self._waiting.append(entry)
        if len(self._waiting) >= 10:
            self._send()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._window, self._send)

    def _send(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._waiting:
            chunk, self._waiting = self._waiting[:10], self._waiting[10:]
            task = asyncio.create_task(self._post(chunk))
            self._calls.add(task)
            task.add_done_callback(self._calls.discard)

    async def _post(self, chunk: list[dict[str, Any]]) -> None:
        entries = [{"Id": str(i), **entry} for i, entry in enumerate(chunk)]
        try:
            resp = await self._call(QueueUrl=self._queue_url, Entries=entries)
            failed = len((resp or {}).get("Failed") or [])
        except Exception as e:  # a task of our own: whatever it is, report it here
            log.warning("%s of %d messages failed: %r", self._call.__name__, len(chunk), e)
            failed = len(chunk)
        self.failed += failed

    async def close(self) -> None:
        """Send what waits and wait for every call under way."""
        self._send()
        await asyncio.gather(*self._calls, return_exceptions=True)
