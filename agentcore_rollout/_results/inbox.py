"""The results queue, as the buffer reads it: long-polled, each message handed on and settled by its
fate.

SQS messages can be duplicated, late, foreign or malformed. A message is deleted only after
hand-off, in batches; after a partial receive the inbox waits briefly so one call brings several;
messages not its own stay on the queue, hidden longer each time they return, costing a few
receives and no S3 call."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from .._flow import backoff_delay
from .._redact import get_logger
from ..config import EngineConfig
from ..contract import (
    ContractError,
    ObjectRef,
    ResultKey,
    normal_prefix,
    parse_notification,
    parse_result_key,
)
from .objects import Transient

log = get_logger("agentcore_rollout.buffer")

# keep: back after the visibility timeout; the others: see `_hidden_for`
_MessageFate = Literal[
    "delete", "release", "other_exp", "foreign", "malformed", "keep", "held", "forged"
]
Handled = Literal["delete", "release", "held", "forged"]
"""What became of one result a message announced: its message deleted, released for another
engine, held for the result's inline copy, or set aside as a forgery."""
Ingest = Callable[[ResultKey, ObjectRef, int, "str | None"], Awaitable[Handled]]
"""The buffer's handler of one announced result: (its key, what the message said of it, the
message's size, the receipt to hold the message by, if it may be held)."""
_MAX_BATCHES = 4  # received batches being downloaded at once, per poller
_SQS_MAX_VISIBILITY = 12 * 3600  # counted from the receive
_SET_ASIDE_GROWTH = 4  # each return of a message nobody takes hides it this much longer
_POLLERS = 1  # one receive at a time suffices: 10 messages each, handled while the next is made
_FOREIGN_VISIBILITY = 2  # seconds: the engine it may be for takes it within a receive or two
_RECEIVE_GATHER = 0.05  # seconds: the next receive brings several, for 50 ms more latency at most
_DELETE_WINDOW = 0.5  # seconds: fills calls at tens of results/s; under any visibility timeout > 0


class Inbox:
    """Polls the results queue of `config` and hands each result that is ours to `ingest`."""

    def __init__(self, sqs: Any, config: EngineConfig, ingest: Ingest) -> None:
        self._sqs = sqs
        self._cfg = config
        self._prefix = normal_prefix(config.prefix)
        self._ingest = ingest
        self._pollers: list[asyncio.Task[None]] = []
        self._deletes = _Batched(sqs.delete_message_batch, config.queue_url, _DELETE_WINDOW)
        self._releases = _Batched(
            sqs.change_message_visibility_batch, config.queue_url, _DELETE_WINDOW
        )
        self._counts: Counter[str] = Counter()

    async def start(self) -> None:
        self._pollers = [
            asyncio.create_task(self._poll(), name=f"rollout-buffer-poller-{i}")
            for i in range(_POLLERS)
        ]

    async def close(self) -> None:
        """Stop polling; send the deletes and releases that wait."""
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
        """The inbox's share of `EngineStats`."""
        c = self._counts
        return {
            "messages": c["messages"],
            "foreign_messages": c["foreign_messages"],
            "malformed_messages": c["malformed_messages"],
            "test_events": c["test_events"],
            "unsettled_messages": self._deletes.failed + self._releases.failed,
            "handler_errors": c["handler_errors"],
        }

    def settle(self, receipt: str, *, delete: bool) -> None:
        """Delete a held message, or release it to come back at once."""
        if delete:
            self._deletes.add({"ReceiptHandle": receipt})
        else:
            self._releases.add({"ReceiptHandle": receipt, "VisibilityTimeout": 0})

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
            fates = [await self._ingest(key, ref, size, holdable) for key, ref in own]
        except Transient:
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
