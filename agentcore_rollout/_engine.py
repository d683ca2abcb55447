"""RolloutEngine: a batch of prompts in, one terminal outcome per prompt out.

Each request runs through the same short life:
register with the buffer -> take a live-session slot -> start the session (dispatcher)
-> wait for the buffer's delivery -> stop the session -> release the slot.
Whatever happens, the request ends in exactly one `Outcome`, and no outcome is invented:
a failure carries no rewards.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import secrets
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Generator, Iterable
from typing import Any, TypeVar

from botocore.exceptions import BotoCoreError, ClientError

from ._agentcore import AgentCoreRuntime
from ._aws import AwsClients
from ._batch import RolloutBatch, RolloutOutcome, RolloutRequest, StaleResult
from ._buffer import Delivery, RolloutBuffer
from ._dispatcher import RequestDispatcher, SubmitFailed
from ._sandbox import SandboxRuntime
from ._stats import EngineStats
from .config import ConfigError, EngineConfig
from .contract import (
    CONTROL_KEY,
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
        release: Callable[[], None],
    ) -> None:
        self._task = task
        self._outcome = outcome
        self._release = release
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
            self._release()
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
        self._requests: set[asyncio.Task[RolloutOutcome]] = set()
        self._cleanups: set[asyncio.Task[Any]] = set()  # session stops, gateway closes
        self._gateway: Any = None
        self._dispatcher: RequestDispatcher
        self._buffer: RolloutBuffer

    async def __aenter__(self) -> RolloutEngine:
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
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in list(self._requests):
            task.cancel()
        await asyncio.gather(*self._requests, return_exceptions=True)
        await asyncio.gather(*self._cleanups, return_exceptions=True)  # never cancelled
        await self._buffer.close()
        if self._gateway is not None:
            await self._gateway.close()
        await self._clients.__aexit__(*exc)

    async def _preflight(self) -> None:
        """Fail at once, in one line, on a missing bucket or queue or an unreachable endpoint,
        rather than after a batch of rollouts has nowhere to report."""
        cfg = self.config
        checks = [
            ("bucket", "s3", lambda: self._clients.s3.head_bucket(Bucket=cfg.bucket)),
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
        """Move to a new policy version. Results of older steps are then kept apart, and what
        the engine remembers of steps older than `retain_steps` before this one is dropped."""
        self._step = step
        self._buffer.advance(step)

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
        timeout: float | None = None,
        deadline: float | None = None,
    ) -> RolloutHandle:
        """Start one rollout now. `timeout` counts from dispatch (default: config);
        `deadline` (unix seconds) caps it. A request_id already in use is a ValueError."""
        timeout = self.config.rollout_timeout if timeout is None else timeout
        step = self._step
        sig_key = secrets.token_hex(32)
        result_key = self._buffer.expect(request.request_id, step=step, sig_key=sig_key)
        outcome = RolloutOutcome(
            request,
            step,
            Outcome.CANCELLED,
            _session_id(self.config.exp_id, step, request.request_id),
            error="cancelled",
            submitted_at=time.time(),
        )
        task = _owned(self._requests, self._run(outcome, sig_key, result_key, timeout, deadline))
        return RolloutHandle(task, outcome, lambda: self._buffer.cancel(request.request_id))

    async def stream(
        self,
        requests: Iterable[RolloutRequest],
        *,
        timeout: float | None = None,
        deadline: float | None = None,
    ) -> AsyncIterator[RolloutOutcome]:
        """Yield outcomes as they complete; closing the iterator cancels what is left."""
        handles = [self.submit(r, timeout=timeout, deadline=deadline) for r in requests]
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
        timeout: float | None = None,
        deadline: float | None = None,
    ) -> RolloutBatch:
        """Run a batch; outcomes come back in request order."""
        began, before = time.monotonic(), self.stats()
        handles = [self.submit(r, timeout=timeout, deadline=deadline) for r in requests]
        outcomes = [await h for h in handles]
        return RolloutBatch(
            step=self._step,
            outcomes=outcomes,
            stats=self.stats().since(before),
            wall_time=time.monotonic() - began,
        )

    # ------------------------------------------------------------------ one request

    async def _run(
        self,
        outcome: RolloutOutcome,
        sig_key: str,
        result_key: str,
        timeout: float,
        deadline: float | None,
    ) -> RolloutOutcome:
        request, session_id = outcome.request, outcome.session_id
        gateway_session = None
        decided = False  # a cancel that lands while the session is being stopped changes nothing
        try:
            async with self._dispatcher.live_slot():
                try:
                    # The deadline counts from dispatch (once a live slot is ours), so queueing
                    # for a slot does not eat into the agent's time.
                    until = min(time.time() + timeout, deadline or math.inf)
                    try:
                        gateway_session = await self._open_gateway_session(request)
                        payload = self._payload(
                            outcome, sig_key, result_key, until, gateway_session
                        )
                        outcome.started_at = await self._dispatcher.start(
                            session_id, payload, until
                        )
                    except SubmitFailed as e:
                        self._buffer.cancel(request.request_id, str(e))
                        outcome.outcome, outcome.error = Outcome.SUBMIT_FAILED, str(e)
                        decided = True
                        log.warning("submit_failed request_id=%s: %s", request.request_id, e)
                        return outcome
                    self._take(outcome, await self._buffer.wait(request.request_id, until))
                    decided = True
                    return outcome
                finally:
                    await self._uncancellable(self._dispatcher.stop(session_id))
        except asyncio.CancelledError:
            if not decided:
                self._buffer.cancel(request.request_id)
                outcome.outcome, outcome.error = Outcome.CANCELLED, "cancelled"
            return outcome
        except Exception as e:  # a bug must end its request, not leave it hanging
            log.exception("request_id=%s failed inside the engine", request.request_id)
            self._buffer.cancel(request.request_id, repr(e))
            if not decided:
                outcome.outcome, outcome.error = Outcome.SUBMIT_FAILED, f"engine error: {e!r}"
            return outcome
        finally:
            if gateway_session is not None:
                await self._uncancellable(self._close_gateway_session(gateway_session, outcome))
            outcome.finished_at = time.time()

    async def _uncancellable(self, work: Coroutine[Any, Any, _T]) -> _T:
        """Run cleanup to its end even if the request is cancelled meanwhile; the engine
        awaits it on close."""
        return await asyncio.shield(_owned(self._cleanups, work))

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

    async def _close_gateway_session(self, session: Any, outcome: RolloutOutcome) -> None:
        """Attach the trace of a rollout that produced a result; drop any other session."""
        from .gateway.client import GatewayError

        try:
            if outcome.result is not None:
                outcome.trace = await self._gateway.finish_session(session.session_id)
            else:
                await self._gateway.drop_session(session.session_id)
        except GatewayError as e:
            log.warning("gateway session of request_id=%s: %s", outcome.request.request_id, e)

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
        self,
        outcome: RolloutOutcome,
        sig_key: str,
        result_key: str,
        deadline: float,
        gateway_session: Any = None,
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
                key=result_key,
                queue_url=cfg.queue_url if cfg.notify_directly else None,
            ),
            llm=llm,
            deadline=deadline,
            sig_key=sig_key,
        )
        body = {**request.payload, CONTROL_KEY: control.model_dump(mode="json")}
        return json.dumps(body).encode()


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
