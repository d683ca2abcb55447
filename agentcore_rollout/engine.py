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
from collections import Counter
from collections.abc import AsyncIterator, Callable, Generator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import uuid4

from botocore.exceptions import BotoCoreError, ClientError

from ._aws import AwsClients
from ._buffer import Delivery, RolloutBuffer
from ._dispatcher import RequestDispatcher, SubmitFailed
from .config import ConfigError, EngineConfig
from .contract import (
    CONTROL_KEY,
    SESSION_ID_MAX,
    LLMSettings,
    Outcome,
    ResultTarget,
    RolloutControl,
    RolloutResult,
)
from .sandbox import AgentCoreRuntime, SandboxRuntime

log = logging.getLogger("agentcore_rollout.engine")


@dataclass
class RolloutRequest:
    """One rollout: the user's JSON payload, its group (`input_id`) and index in the group."""

    payload: dict[str, Any]
    input_id: str
    sample_index: int = 0
    request_id: str = field(default_factory=lambda: uuid4().hex)


@dataclass
class RolloutOutcome:
    """The terminal outcome of one request; `result` is set only if the agent wrote one."""

    request: RolloutRequest
    step: int
    outcome: Outcome
    session_id: str
    result: RolloutResult | None = None
    error: str | None = None
    submitted_at: float = 0.0
    trace: dict[str, Any] | None = None
    """Exact token trace from the gateway (prompt ids, sampled ids, mask, log-probs)."""
    started_at: float | None = None
    delivered_at: float | None = None
    finished_at: float = 0.0

    @property
    def reward(self) -> float | None:
        return self.result.scalar_reward() if self.result is not None else None

    @property
    def latency(self) -> float:
        return self.finished_at - self.submitted_at

    def to_dict(self) -> dict[str, Any]:
        """One JSON line per request: what `rollouts.jsonl` holds."""
        return {
            "request_id": self.request.request_id,
            "input_id": self.request.input_id,
            "sample_index": self.request.sample_index,
            "step": self.step,
            "session_id": self.session_id,
            "outcome": str(self.outcome),
            "reward": self.reward,
            "error": self.error,
            "latency": round(self.latency, 4),
            "result": self.result.model_dump(mode="json", exclude={"sig"}) if self.result else None,
            "trace": self.trace,
        }


def quantiles(values: Sequence[float], qs: Iterable[float] = (0.5, 0.95, 0.99)) -> dict[str, float]:
    """Nearest-rank quantiles, keyed `p50`, `p95`, ...; empty input gives an empty dict."""
    ordered = sorted(values)
    if not ordered:
        return {}
    return {
        f"p{round(q * 100)}": ordered[
            min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
        ]
        for q in qs
    }


@dataclass
class RolloutBatch:
    """Outcomes in request order, with the figures a trainer logs."""

    step: int
    outcomes: list[RolloutOutcome]
    api_calls: dict[str, int]
    wall_time: float

    @property
    def counts(self) -> dict[str, int]:
        counted = Counter(str(o.outcome) for o in self.outcomes)
        return {str(k): counted.get(str(k), 0) for k in Outcome}

    @property
    def ok(self) -> list[RolloutOutcome]:
        return [o for o in self.outcomes if o.outcome is Outcome.OK]

    def latency(self) -> dict[str, float]:
        return quantiles([o.latency for o in self.outcomes])

    @property
    def reward_mean(self) -> float | None:
        return reward_mean(self.outcomes)

    @property
    def throughput(self) -> float:
        return len(self.outcomes) / self.wall_time if self.wall_time > 0 else 0.0

    @property
    def api_calls_per_rollout(self) -> float:
        return sum(self.api_calls.values()) / len(self.outcomes) if self.outcomes else 0.0

    def metrics(self) -> dict[str, float]:
        """A flat dict of numbers, ready for a trainer's logger."""
        out: dict[str, float] = {f"rollout/outcome/{k}": v for k, v in self.counts.items()}
        out |= {f"rollout/latency_{k}": v for k, v in self.latency().items()}
        if self.reward_mean is not None:
            out["rollout/reward_mean"] = self.reward_mean
        out["rollout/wall_time"] = self.wall_time
        out["rollout/throughput"] = self.throughput
        out["rollout/api_calls_per_rollout"] = self.api_calls_per_rollout
        return out


def reward_mean(outcomes: Iterable[RolloutOutcome]) -> float | None:
    """Mean scalar reward of the outcomes that have one (failures have none)."""
    rewards = [o.reward for o in outcomes if o.reward is not None]
    return sum(rewards) / len(rewards) if rewards else None


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
        self.step = step
        self._runtime = runtime
        self._clients = AwsClients(config)
        self._pending: set[asyncio.Task[RolloutOutcome]] = set()
        self._gateway: Any = None
        self.dispatcher: RequestDispatcher
        self.buffer: RolloutBuffer

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
        self.dispatcher = RequestDispatcher(runtime, self.config)
        self.buffer = RolloutBuffer(self._clients.s3, self._clients.sqs, self.config)
        self.buffer.step = self.step
        if self.config.gateway is not None:
            from .gateway.client import GatewayAdmin  # needs the [gateway] extra

            self._gateway = GatewayAdmin(self.config.gateway.url, self.config.gateway.admin_token)
        await self.buffer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in list(self._pending):
            task.cancel()
        await asyncio.gather(*self._pending, return_exceptions=True)
        await self.buffer.close()
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

    @property
    def api_calls(self) -> dict[str, int]:
        return dict(self._clients.api_calls)

    def set_step(self, step: int) -> None:
        """Move to a new policy version; results of older steps are then kept apart."""
        self.step = step
        self.buffer.step = step

    # ------------------------------------------------------------------ public API

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
        submitted = time.time()
        sig_key = secrets.token_hex(32)
        self.buffer.expect(
            request.request_id,
            step=self.step,
            sig_key=sig_key,
            deadline=min(submitted + timeout, deadline or math.inf),
        )
        outcome = RolloutOutcome(
            request,
            self.step,
            Outcome.CANCELLED,
            _session_id(self.config.exp_id, self.step, request.request_id),
            error="cancelled",
            submitted_at=submitted,
        )
        task = asyncio.create_task(self._run(outcome, sig_key, timeout, deadline))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return RolloutHandle(task, outcome, lambda: self.buffer.cancel(request.request_id))

    async def stream(
        self,
        requests: Iterable[RolloutRequest],
        *,
        timeout: float | None = None,
        deadline: float | None = None,
    ) -> AsyncIterator[RolloutOutcome]:
        """Yield outcomes as they complete; closing the iterator cancels what is left."""
        handles = [self.submit(r, timeout=timeout, deadline=deadline) for r in requests]
        try:
            for next_done in asyncio.as_completed(handles):
                yield await next_done
        finally:
            for h in handles:
                h.cancel()

    async def rollout(
        self,
        requests: Iterable[RolloutRequest],
        *,
        timeout: float | None = None,
        deadline: float | None = None,
    ) -> RolloutBatch:
        """Run a batch; outcomes come back in request order."""
        began = time.monotonic()
        calls_before = Counter(self._clients.api_calls)
        handles = [self.submit(r, timeout=timeout, deadline=deadline) for r in requests]
        outcomes = [await h for h in handles]
        calls = Counter(self._clients.api_calls)
        calls.subtract(calls_before)
        return RolloutBatch(
            step=self.step,
            outcomes=outcomes,
            api_calls={k: v for k, v in calls.items() if v},
            wall_time=time.monotonic() - began,
        )

    # ------------------------------------------------------------------ one request

    async def _run(
        self, outcome: RolloutOutcome, sig_key: str, timeout: float, deadline: float | None
    ) -> RolloutOutcome:
        request, step, session_id = outcome.request, outcome.step, outcome.session_id
        gateway_session = None
        decided = False  # a cancel that lands while the session is being stopped changes nothing
        try:
            async with self.dispatcher.live_session(session_id):
                # The deadline counts from dispatch (once a live slot is ours), so queueing
                # for a slot does not eat into the agent's time.
                until = min(time.time() + timeout, deadline or math.inf)
                self.buffer.expect_deadline(request.request_id, until)
                try:
                    gateway_session = await self._open_gateway_session(request)
                    payload = self._payload(
                        request, step, session_id, sig_key, until, gateway_session
                    )
                    await self.dispatcher.start(session_id, payload, until)
                except SubmitFailed as e:
                    self.buffer.cancel(request.request_id, str(e))
                    outcome.outcome, outcome.error = Outcome.SUBMIT_FAILED, str(e)
                    decided = True
                    log.warning("submit_failed request_id=%s: %s", request.request_id, e)
                    return outcome
                outcome.started_at = time.time()
                self._take(outcome, await self.buffer.wait(request.request_id))
                decided = True
                return outcome
        except asyncio.CancelledError:
            if not decided:
                self.buffer.cancel(request.request_id)
                outcome.outcome, outcome.error = Outcome.CANCELLED, "cancelled"
            return outcome
        finally:
            if gateway_session is not None:
                await asyncio.shield(self._close_gateway_session(gateway_session, outcome))
            outcome.finished_at = time.time()

    async def _open_gateway_session(self, request: RolloutRequest) -> Any:
        if self._gateway is None:
            return None
        from .gateway.client import GatewayError

        gw = self.config.gateway
        assert gw is not None
        sampling = self.config.llm.sampling if self.config.llm else None
        try:
            return await self._gateway.create_session(
                request.request_id,
                sampling=sampling,
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
        request: RolloutRequest,
        step: int,
        session_id: str,
        sig_key: str,
        deadline: float,
        gateway_session: Any = None,
    ) -> bytes:
        cfg = self.config
        llm = LLMSettings(**cfg.llm.model_dump()) if cfg.llm is not None else None
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
            step=step,
            request_id=request.request_id,
            input_id=request.input_id,
            sample_index=request.sample_index,
            session_id=session_id,
            result=ResultTarget(
                bucket=cfg.bucket,
                key=self.buffer.result_key(request.request_id),
                queue_url=cfg.queue_url if cfg.notify_directly else None,
            ),
            llm=llm,
            deadline=deadline,
            sig_key=sig_key,
        )
        body = {**request.payload, CONTROL_KEY: control.model_dump(mode="json")}
        return json.dumps(body).encode()


def _session_id(exp_id: str, step: int, request_id: str) -> str:
    """Readable and unique; padded to AgentCore's 33-character minimum."""
    sid = f"{exp_id}-{step}-{request_id}"[-SESSION_ID_MAX:]
    return sid if len(sid) >= 33 else sid + "-" + "0" * (32 - len(sid))
