"""RolloutEngine: a batch of prompts in, one terminal outcome per prompt out.

Each request runs through the same short life:
register with the buffer -> take a live-session slot -> start the session (dispatcher)
-> wait for the buffer's delivery -> hand the outcome over, while the session is stopped and
its slot released behind it.
Whatever happens, the request ends in exactly one `Outcome`, and no outcome is invented:
a failure carries no rewards.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import math
import re
import secrets
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Generator, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from botocore.exceptions import BotoCoreError, ClientError

from ._agentcore import AgentCoreRuntime
from ._aws import AwsClients
from ._batch import RolloutBatch, RolloutOutcome, RolloutRequest, StaleResult
from ._buffer import Delivery, RolloutBuffer
from ._dispatcher import RequestDispatcher, StartAttempts, SubmitFailed
from ._sandbox import SandboxRuntime
from ._stats import EngineStats
from .config import ConfigError, EngineConfig
from .contract import (
    CONTROL_KEY,
    ID_MAX,
    ID_PATTERN,
    SESSION_ID_MAX,
    LLMSettings,
    Outcome,
    ResultTarget,
    RolloutControl,
)

log = logging.getLogger("agentcore_rollout.engine")

_T = TypeVar("_T")


class RolloutHandle:
    """An awaitable for one submitted request; `cancel()` ends it as `cancelled`."""

    def __init__(
        self,
        task: asyncio.Task[RolloutOutcome],
        outcome: RolloutOutcome,
        end_unstarted: Callable[[], None],
    ) -> None:
        self._task = task
        self._outcome = outcome
        self._end_unstarted = end_unstarted
        self.request = outcome.request

    def __await__(self) -> Generator[Any, None, RolloutOutcome]:
        return self._wait().__await__()

    async def _wait(self) -> RolloutOutcome:
        try:
            return await asyncio.shield(self._task)
        except asyncio.CancelledError:
            if not self._task.cancelled():
                raise  # whoever awaits us was cancelled, not the rollout
            # Cancelled before it ever ran: nothing was dispatched, nothing to stop.
            self._end_unstarted()
            self._outcome.finished_at = time.time()
            return self._outcome

    def done(self) -> bool:
        return self._task.done()

    def cancel(self) -> None:
        self._task.cancel()


class RolloutEngine:
    """`async with RolloutEngine(config) as engine: batch = await engine.rollout(requests)`"""

    def __init__(
        self,
        config: EngineConfig,
        *,
        runtime: SandboxRuntime | None = None,
        step: int = 0,
    ) -> None:
        self.config = config
        self._step = step
        self._runtime = runtime
        self._clients = AwsClients(config)
        self._llm = LLMSettings(**config.llm.model_dump()) if config.llm is not None else None
        # Without a configured secret results are verifiable by this engine alone (no resume).
        self._run_secret = (config.run_secret or secrets.token_hex(32)).encode()
        # each running request's task, with what `set_step` may need to end it `stale`
        self._requests: dict[asyncio.Task[RolloutOutcome], tuple[RolloutOutcome, _Job]] = {}
        self._cleanups: set[asyncio.Task[Any]] = set()  # session stops, gateway closes
        self._gateway: Any = None
        self._dispatcher: RequestDispatcher
        self._buffer: RolloutBuffer

    async def __aenter__(self) -> RolloutEngine:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Check the bucket, queue and endpoints, then start polling for results. Pair it with
        `aclose()`, or use the engine as an async context manager."""
        self.config.require_targets()
        await self._clients.__aenter__()
        try:
            await self._preflight()
        except BaseException:
            await self._clients.__aexit__(None, None, None)
            raise
        runtime = self._runtime or AgentCoreRuntime(
            self._clients.agentcore, self.config.runtime_arn, self.config.qualifier
        )
        self._dispatcher = RequestDispatcher(runtime, self.config)
        self._buffer = RolloutBuffer(self._clients.s3, self._clients.sqs, self.config)
        self._buffer.advance(self._step)
        if self.config.gateway is not None:
            from .gateway.client import GatewayAdmin  # aiohttp's client only: a core dependency

            self._gateway = GatewayAdmin(self.config.gateway.url, self.config.gateway.admin_token)
        await self._buffer.start()

    async def aclose(self) -> None:
        """Cancel what runs (each ends `cancelled`), wait for the sessions' stops, close."""
        for task in list(self._requests):
            task.cancel()
        await asyncio.gather(*self._requests, return_exceptions=True)
        await asyncio.gather(*self._cleanups, return_exceptions=True)  # never cancelled
        await self._buffer.close()
        if self._gateway is not None:
            await self._gateway.close()
        await self._clients.__aexit__(None, None, None)

    async def _preflight(self) -> None:
        """Fail at once, in one line, on a missing bucket or queue or an unreachable endpoint,
        rather than after a batch of rollouts has nowhere to report."""
        cfg = self.config
        checks = [
            (  # ListBucket under the prefix: what the least-privilege trainer role may do
                "bucket",
                "s3",
                lambda: self._clients.s3.list_objects_v2(
                    Bucket=cfg.bucket, Prefix=_listing_prefix(cfg.prefix), MaxKeys=1
                ),
            ),
            (
                "queue_url",
                "sqs",
                lambda: self._clients.sqs.get_queue_attributes(
                    QueueUrl=cfg.queue_url, AttributeNames=["QueueArn"]
                ),
            ),
        ]
        for key, service, call in checks:
            try:
                await call()
            except ClientError as e:
                code = e.response.get("Error", {}).get("Code", "error")
                raise ConfigError(
                    f"config: engine.{key}: {getattr(cfg, key)!r} not found or no access ({code})"
                ) from None
            except (BotoCoreError, OSError) as e:
                where = getattr(cfg.endpoints, service) or f"the AWS {service} endpoint"
                raise ConfigError(f"config: cannot reach {where}: {e}") from None

    # ------------------------------------------------------------------ public API

    @property
    def step(self) -> int:
        """The policy version new requests are submitted with."""
        return self._step

    def set_step(self, step: int) -> None:
        """Move to a new policy version (after pushing its weights to the policy servers).

        Requests of the last `max_staleness` steps keep running and may still end `ok` (an
        off-policy trainer weighs them by importance); older ones still running end `stale`
        now, their sessions stopped. What the engine remembers of ended requests of older
        steps is dropped once they are out of the retained window."""
        if step < self._step:
            raise ValueError(f"step {step} is behind the engine's step {self._step}")
        self._step = step
        self._buffer.advance(step)
        oldest = step - self.config.max_staleness
        for task, (outcome, job) in list(self._requests.items()):
            if outcome.step < oldest and not task.done():
                job.stale = (
                    f"step {outcome.step} is {step - outcome.step} behind the current step "
                    f"{step} (engine.max_staleness={self.config.max_staleness})"
                )
                task.cancel()

    def stats(self) -> EngineStats:
        """A snapshot: sessions alive, starts in flight, retries, throttles, duplicates, ..."""
        return EngineStats(
            **self._dispatcher.stats(),
            **self._buffer.stats(),
            api_calls=self._clients.api_calls,
        )

    def take_stale(self) -> list[StaleResult]:
        """Results that arrived after their request had ended, since the last call."""
        return self._buffer.take_stale()

    def submit(
        self,
        request: RolloutRequest,
        *,
        step: int | None = None,
        timeout: float | None = None,
        deadline: float | None = None,
        on_start: Callable[[RolloutOutcome], None] | None = None,
    ) -> RolloutHandle:
        """Start one rollout. `step` is its policy version: the engine's current step (the
        default) or one of the `max_staleness` before it. `timeout` counts from its session's
        start (default: `rollout_timeout`);
        `deadline` (unix seconds) caps both its start and its run. `on_start(outcome)` is
        called once its session started (`started_at`, `deadline` and `gateway_session_id`
        set): what to journal to `resume` it after a restart.

        A malformed request (bad request_id, negative sample_index, payload that is not a JSON
        object), a request_id in use or a step out of that range is a ValueError, raised
        before anything is taken."""
        return self._submit(request, step, timeout, deadline, on_start)

    def resume(
        self,
        request: RolloutRequest,
        *,
        step: int,
        running_until: float | None = None,
        gateway_session_id: str | None = None,
        timeout: float | None = None,
        on_start: Callable[[RolloutOutcome], None] | None = None,
    ) -> RolloutHandle:
        """Take over a request an earlier engine of this experiment (same `exp_id` and
        `run_secret`) submitted, e.g. after a crash. If its result is in S3 it is delivered
        without invoking the agent again; if its session was started and `running_until` (the
        `deadline` the earlier engine journaled) has not passed, the engine waits for it;
        otherwise it is dispatched as `submit` would. `gateway_session_id` (journaled too)
        lets the gateway's trace be collected."""
        resumed = _Resumed(running_until, gateway_session_id)
        return self._submit(request, step, timeout, None, on_start, resumed)

    def _submit(
        self,
        request: RolloutRequest,
        step: int | None,
        timeout: float | None,
        deadline: float | None,
        on_start: Callable[[RolloutOutcome], None] | None,
        resumed: _Resumed | None = None,
    ) -> RolloutHandle:
        _check_request(request)
        step = self._step if step is None else step
        oldest = max(0, self._step - self.config.max_staleness)
        if not oldest <= step <= self._step:
            raise ValueError(
                f"step {step}: must be the engine's step {self._step} or, with "
                f"engine.max_staleness={self.config.max_staleness}, one no older than {oldest}"
            )
        submitted = time.time()
        cap = deadline if deadline is not None else math.inf
        queue_timeout = self.config.queue_timeout
        sig_key = _signing_key(self._run_secret, self.config.exp_id, request.request_id)
        job = _Job(
            sig_key=sig_key,
            result_key=self._buffer.expect(request.request_id, step=step, sig_key=sig_key),
            timeout=self.config.rollout_timeout if timeout is None else timeout,
            cap=cap,
            start_by=min(cap, submitted + queue_timeout if queue_timeout else math.inf),
            on_start=on_start,
            resumed=resumed,
        )
        outcome = RolloutOutcome(
            request,
            step,
            Outcome.CANCELLED,
            _session_id(self.config.exp_id, step, request.request_id),
            error="cancelled",
            submitted_at=submitted,
        )
        task = asyncio.create_task(self._run(outcome, job))
        self._requests[task] = (outcome, job)
        task.add_done_callback(self._requests.__delitem__)
        return RolloutHandle(task, outcome, lambda: self._end_cancelled(outcome, job))

    async def stream(
        self,
        requests: Iterable[RolloutRequest],
        *,
        step: int | None = None,
        timeout: float | None = None,
        deadline: float | None = None,
    ) -> AsyncIterator[RolloutOutcome]:
        """Yield outcomes as they complete; closing the iterator cancels what is left."""
        handles = [self.submit(r, step=step, timeout=timeout, deadline=deadline) for r in requests]
        waiting = {asyncio.ensure_future(h) for h in handles}
        try:
            while waiting:
                done, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                for finished in done:
                    yield finished.result()
        finally:
            for h in handles:
                h.cancel()
            await asyncio.gather(*waiting, return_exceptions=True)

    async def rollout(
        self,
        requests: Iterable[RolloutRequest],
        *,
        step: int | None = None,
        timeout: float | None = None,
        deadline: float | None = None,
    ) -> RolloutBatch:
        """Run a batch; outcomes come back in request order."""
        began, before = time.monotonic(), self.stats()
        step = self._step if step is None else step
        handles = [self.submit(r, step=step, timeout=timeout, deadline=deadline) for r in requests]
        outcomes = [await h for h in handles]
        return RolloutBatch(
            step=step,
            outcomes=outcomes,
            stats=self.stats().since(before),
            wall_time=time.monotonic() - began,
        )

    # ------------------------------------------------------------------ one request

    async def _run(self, outcome: RolloutOutcome, job: _Job) -> RolloutOutcome:
        request, session_id = outcome.request, outcome.session_id
        attempts = StartAttempts()
        decided = False  # a cancel that lands once the outcome is known changes nothing
        try:
            if job.resumed is not None:
                outcome.gateway_session_id = job.resumed.gateway_session_id
                delivery = await self._buffer.look_up(request.request_id)
                if delivery is not None:  # written while no engine listened: no new run
                    self._take(outcome, delivery)
                    return outcome
                if (job.resumed.running_until or 0) > time.time():  # still running: wait
                    attempts.maybe_started, attempts.deadline = True, job.resumed.running_until
                else:
                    outcome.gateway_session_id = None
            await self._dispatcher.take_live_slot(job.start_by)
            try:
                if not attempts.maybe_started:
                    await self._start(outcome, job, attempts)
                assert attempts.deadline is not None
                delivery = await self._buffer.wait(request.request_id, attempts.deadline)
                self._take(outcome, delivery)
                decided = True
            except SubmitFailed as e:
                self._end(outcome, Outcome.SUBMIT_FAILED, str(e))
                decided = True
                log.warning("submit_failed request_id=%s: %s", request.request_id, e)
            finally:
                # The outcome does not wait for the stop; the slot does.
                if attempts.maybe_started:  # a session that never started is not stopped
                    _owned(self._cleanups, self._dispatcher.stop_and_release(session_id))
                else:
                    self._dispatcher.release_live_slot()
        except SubmitFailed as e:  # no live slot in time
            self._end(outcome, Outcome.SUBMIT_FAILED, str(e))
            log.warning("submit_failed request_id=%s: %s", request.request_id, e)
        except asyncio.CancelledError:
            if not decided:
                self._end_cancelled(outcome, job)
        except Exception as e:  # a bug must end its request, not leave it hanging
            log.exception("request_id=%s failed inside the engine", request.request_id)
            if not decided:
                self._end(outcome, Outcome.SUBMIT_FAILED, f"engine error: {e!r}")
        finally:
            if outcome.gateway_session_id is not None and self._gateway is not None:
                closing = _owned(self._cleanups, self._close_gateway_session(outcome))
                while not closing.done():
                    try:
                        await asyncio.shield(closing)
                    except asyncio.CancelledError:
                        if not decided:
                            raise
                        # Too late to cancel: the outcome stands, and needs its trace.
                        asyncio.current_task().uncancel()  # type: ignore[union-attr]
            outcome.finished_at = time.time()
        return outcome

    async def _start(self, outcome: RolloutOutcome, job: _Job, attempts: StartAttempts) -> None:
        """Open the rollout's gateway session, then start its sandbox session."""
        gateway_session = await self._open_gateway_session(outcome.request)
        outcome.gateway_session_id = getattr(gateway_session, "session_id", None)
        await self._dispatcher.start(
            outcome.session_id,
            lambda until: self._payload(outcome, job, until, gateway_session),
            timeout=job.timeout,
            cap=job.cap,
            start_by=job.start_by,
            attempts=attempts,
        )
        outcome.started_at, outcome.deadline = attempts.sent_at, attempts.deadline
        if job.on_start is not None:
            job.on_start(outcome)

    def _end_cancelled(self, outcome: RolloutOutcome, job: _Job) -> None:
        """End a cancelled request: `stale` if `set_step` cancelled it, else `cancelled`."""
        if job.stale is not None:
            self._end(outcome, Outcome.STALE, job.stale)
        else:
            self._end(outcome, Outcome.CANCELLED, "cancelled")

    def _end(self, outcome: RolloutOutcome, ending: Outcome, error: str) -> None:
        """End a request that got no delivery."""
        self._buffer.cancel(outcome.request.request_id, error)
        outcome.outcome, outcome.error = ending, error

    async def _open_gateway_session(self, request: RolloutRequest) -> Any:
        if self._gateway is None:
            return None
        from .gateway.client import GatewayError

        gw = self.config.gateway
        assert gw is not None
        try:
            return await self._gateway.create_session(
                request.request_id,
                sampling=self._llm.sampling if self._llm else None,
                max_context=gw.max_context,
                max_turns=gw.max_turns,
            )
        except GatewayError as e:
            raise SubmitFailed(f"gateway: {e}") from None

    async def _close_gateway_session(self, outcome: RolloutOutcome) -> None:
        """Attach the trace of a rollout that produced a result; drop any other session. An
        `ok` whose trace is lost becomes `invalid_result`: a reward without its tokens is not
        a training sample."""
        from .gateway.client import GatewayError

        session_id = outcome.gateway_session_id
        try:
            if outcome.result is not None:
                outcome.trace = await self._gateway.finish_session(session_id)
            else:
                await self._gateway.drop_session(session_id)
            return
        except GatewayError as e:
            log.warning("gateway session of request_id=%s: %s", outcome.request.request_id, e)
            lost = e
        if outcome.outcome is Outcome.OK:
            outcome.outcome, outcome.result = Outcome.INVALID_RESULT, None
            outcome.error = f"trace lost: {lost}"

    @staticmethod
    def _take(outcome: RolloutOutcome, delivery: Delivery) -> None:
        outcome.outcome = delivery.outcome
        outcome.delivered_at = delivery.handed_off_at
        outcome.result = delivery.result
        outcome.error = delivery.error or (
            f"{delivery.result.error.type}: {delivery.result.error.message}"
            if delivery.result is not None and delivery.result.error is not None
            else None
        )

    def _payload(
        self, outcome: RolloutOutcome, job: _Job, deadline: float, gateway_session: Any
    ) -> bytes:
        cfg, llm, request = self.config, self._llm, outcome.request
        if gateway_session is not None:  # agents call the gateway with their session's key
            assert cfg.gateway is not None
            llm = LLMSettings(
                base_url=f"{(cfg.gateway.public_url or cfg.gateway.url).rstrip('/')}/v1",
                model=llm.model if llm else (gateway_session.model or "policy"),
                api_key=gateway_session.api_key,
                sampling=llm.sampling if llm else {},
            )
        control = RolloutControl(
            exp_id=cfg.exp_id,
            step=outcome.step,
            request_id=request.request_id,
            input_id=request.input_id,
            sample_index=request.sample_index,
            session_id=outcome.session_id,
            result=ResultTarget(
                bucket=cfg.bucket,
                key=job.result_key,
                queue_url=cfg.queue_url if cfg.notify_directly else None,
            ),
            llm=llm,
            deadline=deadline,
            sig_key=job.sig_key,
            max_result_bytes=cfg.max_result_bytes,
        )
        body = {**request.payload, CONTROL_KEY: control.model_dump(mode="json")}
        return json.dumps(body).encode()


@dataclass(frozen=True)
class _Resumed:
    running_until: float | None
    gateway_session_id: str | None


@dataclass
class _Job:
    """What `_run` needs besides the outcome it fills in."""

    sig_key: str
    result_key: str
    timeout: float
    cap: float  # absolute deadline for both the start and the run (inf: none)
    start_by: float  # the session must have started by then (queue_timeout, cap)
    on_start: Callable[[RolloutOutcome], None] | None
    resumed: _Resumed | None
    stale: str | None = None  # why `set_step` ended it, if it did


def _check_request(request: RolloutRequest) -> None:
    """The checks the wire contract would make later, made before anything is taken."""
    rid = request.request_id
    if not isinstance(rid, str) or len(rid) > ID_MAX or not re.match(ID_PATTERN, rid):
        raise ValueError(
            f"request_id {rid!r}: 1-{ID_MAX} characters of letters, digits, '.', '_', '-'"
        )
    if not isinstance(request.input_id, str) or not request.input_id:
        raise ValueError(f"input_id {request.input_id!r}: must be a non-empty string")
    if isinstance(request.sample_index, bool) or not isinstance(request.sample_index, int):
        raise ValueError(f"sample_index {request.sample_index!r}: must be an integer")
    if request.sample_index < 0:
        raise ValueError(f"sample_index {request.sample_index}: must be >= 0")
    if not isinstance(request.payload, dict):
        raise ValueError(
            f"payload must be a dict (a JSON object), got {type(request.payload).__name__}"
        )
    if CONTROL_KEY in request.payload:
        raise ValueError(f"payload must not hold the {CONTROL_KEY!r} key: the engine writes it")
    try:
        json.dumps(request.payload, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"payload is not JSON: {e}") from None


def _listing_prefix(prefix: str) -> str:
    """`rollouts/` for prefix `rollouts`; no prefix lists from the root, as keys are written."""
    return f"{prefix.strip('/')}/" if prefix.strip("/") else ""


def _signing_key(run_secret: bytes, exp_id: str, request_id: str) -> str:
    """Derived, not stored: an engine with the same secret can verify results of requests an
    earlier engine submitted. The secret itself never leaves the engine."""
    return hmac.new(run_secret, f"{exp_id}/{request_id}".encode(), hashlib.sha256).hexdigest()


def _owned(tasks: set[asyncio.Task[Any]], work: Coroutine[Any, Any, _T]) -> asyncio.Task[_T]:
    """A task held in `tasks` until it ends (so it is never garbage-collected mid-run)."""
    task = asyncio.create_task(work)
    tasks.add(task)
    task.add_done_callback(tasks.discard)
    return task


def _session_id(exp_id: str, step: int, request_id: str) -> str:
    """Readable and unique; padded to AgentCore's 33-character minimum."""
    sid = f"{exp_id}-{step}-{request_id}"[-SESSION_ID_MAX:]
    return sid if len(sid) >= 33 else sid + "-" + "0" * (32 - len(sid))
