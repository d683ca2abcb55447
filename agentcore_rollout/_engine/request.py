"""One request's life, read top to bottom: `RequestRunner.run`: a live-session slot, its gateway
session, its sandbox session, the buffer's delivery, the trace, the outcome, built once; its
session's stop runs behind the hand-off.

What happened is gathered as facts, and one pure function, `_decide`, turns them into the
`Outcome`: nothing else chooses one, and no outcome is invented (a failure carries no rewards)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from .._batch import RolloutOutcome, RolloutRequest, RolloutStart
from .._cost import rollout_cost
from .._dispatch.dispatcher import RequestDispatcher
from .._dispatch.endpoints import SubmitFailed
from .._dispatch.start_queue import LiveSession
from .._redact import get_logger, redact
from .._results.buffer import Delivery, RolloutBuffer
from ..config import CostConfig, EngineConfig
from ..contract import (
    AGENT_ARTIFACTS_KEY,
    ARTIFACTS_KEY,
    CONTROL_KEY,
    INLINE_RESULT_MAX_BYTES,
    VERIFIER_KEY,
    LLMSettings,
    Outcome,
    ResultTarget,
    RolloutControl,
    RolloutResult,
)
from .gateway_admin import GatewayError, GatewaySession
from .gateway_replicas import GatewayReplicas
from .tracing import UNTRACED, RolloutSpans, tracer

log = get_logger("agentcore_rollout.engine")

_T = TypeVar("_T")
_USAGE_WAIT = 2.0
"""Seconds an outcome without a result waits for its dropped gateway session's tokens."""


@dataclass
class Job:
    """One request: what was asked, fixed at submit, and what `run` learns on the way (when its
    session started, its deadline, its gateway session), from which its outcome is built once."""

    request: RolloutRequest
    step: int
    session_id: str
    sig_key: str
    result_key: str
    timeout: float
    deadline: float
    """Unix seconds. Until its session starts: the latest it may end (inf: none); once
    started, `min(start + timeout, that)`, as written into the invocation."""
    start_deadline: float  # its session must have started by then (queue_timeout, deadline)
    submitted_at: float
    environment: str | None  # where its session may start (`RequestDispatcher.environment_of`)
    on_start: Callable[[RolloutStart], None] | None
    prices: CostConfig
    resuming: bool = False  # an earlier engine submitted it: its result may be in S3
    earlier: RolloutStart | None = None  # that engine's start of its session, if known
    session: LiveSession | None = None  # its live-session slot, once it has one
    started_at: float | None = None
    running: bool = False  # its session started, here or (taken over) by the earlier engine
    gateway_session_id: str | None = None
    gateway_url: str | None = None  # the replica its gateway session is on
    stale: str | None = None  # why `set_step` ended it, if it did
    spans: RolloutSpans = UNTRACED  # its trace, when OpenTelemetry is configured
    verifier: Job | None = None
    """Its verifier, run once its agent's session ended ok: in a session of its own
    `environment`, or (`in_session`) invoked again in the agent's session."""
    verification: RolloutOutcome | None = None  # that verifier's outcome, once it ran
    in_session: bool = False  # a verifier invoked again in its agent's session
    judges: bool = False  # a verifier: no gateway session, ahead in the line for slots

    @property
    def admission(self) -> int:
        """Its place in the line for live slots: its step (oldest first), a verifier's just
        ahead of that step's agents, whose rollouts it finishes."""
        return self.step - 1 if self.judges else self.step

    def took_over(
        self, session_id: str | None, url: str | None, gateway: GatewayReplicas | None
    ) -> None:
        """Its gateway session is the earlier engine's, on the replica that engine recorded."""
        self.gateway_session_id = session_id
        if gateway is not None and url is not None and session_id is not None:
            self.gateway_url = url.rstrip("/")
            gateway.adopt(self.gateway_url, session_id)

    def outcome(
        self,
        outcome: Outcome,
        *,
        trace: dict[str, Any] | None = None,
        usage: dict[str, int] | None = None,
        verification: RolloutOutcome | None = None,
        **ended: Any,
    ) -> RolloutOutcome:
        """Its outcome, with its cost: tokens from its trace, else from the usage its dropped
        gateway session reported; its verifier's session's, if one ran, added."""
        finished = time.time()
        cost = rollout_cost(
            self.prices,
            self.sandbox_since(),
            finished,
            trace if trace is not None or usage is None else {"usage": usage},
        )
        own_session = self.verifier is not None and not self.verifier.in_session
        if verification is not None and verification.cost is not None and own_session:
            spent = verification.cost
            cost = replace(
                cost,
                sandbox_seconds=cost.sandbox_seconds + spent.sandbox_seconds,
                sandbox_usd=cost.sandbox_usd + spent.sandbox_usd,
            )
        if ended.get("error"):  # the one door every error takes into an outcome
            ended["error"] = redact(ended["error"])
        return RolloutOutcome(
            self.request,
            self.step,
            outcome,
            self.session_id,
            submitted_at=self.submitted_at,
            started_at=self.started_at,
            deadline=self.deadline if self.running else None,
            gateway_session_id=self.gateway_session_id,
            gateway_url=self.gateway_url,
            finished_at=finished,
            trace=trace,
            cost=cost,
            **ended,
        )

    def sandbox_since(self) -> float | None:
        """When its sandbox session may have begun to cost: the first invocation that may have
        created it (even if none was accepted), or for one taken over still running, its
        journaled start (else the takeover); None if none may have."""
        session = self.session
        first = session.sent_at if session is not None and session.maybe_started else None
        known = [t for t in (first, self.started_at) if t is not None]
        return min(known) if known else None


@dataclass(frozen=True)
class Trace:
    """What the gateway kept of a delivered result's turns."""

    turns: dict[str, Any] | None = None
    lost: str | None = None
    """Why a gateway that should hold them does not (None: held, or no gateway)."""
    replica_lost: bool = False
    """The replica itself died: no tokens, whatever the agent made of it."""


def _decide(
    delivery: Delivery | None,
    *,
    failure: BaseException | None = None,
    stale: str | None = None,
    trace: Trace = Trace(),
    verification: RolloutOutcome | None = None,
    verified: bool = False,
) -> tuple[Outcome, RolloutResult | None, str | None]:
    """The outcome, the result it keeps and the error it reports, from what happened: no
    delivery because of `failure` (a `SubmitFailed`, a cancel, `stale` if `set_step` made it,
    or a bug), else the buffer's delivery, what the gateway kept of its turns and, for a
    rollout `verified` by a verifier of its own, that verifier's outcome: its rewards are the
    rollout's, and any way it failed to judge (or never ran) is `verifier_error`."""
    if delivery is None:
        if isinstance(failure, SubmitFailed):
            return Outcome.SUBMIT_FAILED, None, str(failure)
        if isinstance(failure, asyncio.CancelledError):
            if stale is not None:
                return Outcome.STALE, None, stale
            return Outcome.CANCELLED, None, "cancelled"
        return Outcome.ENGINE_ERROR, None, f"engine error: {failure!r}"
    if delivery.missing is not None:
        return Outcome.TIMEOUT, None, delivery.missing
    result = delivery.result
    if result is None:
        return Outcome.INVALID_RESULT, None, delivery.invalid
    outcome = Outcome(result.status)
    error = f"{result.error.type}: {result.error.message}" if result.error is not None else None
    if trace.lost is not None and trace.replica_lost:
        said = f" (the agent's result: {outcome.value}: {error})" if error else ""
        return Outcome.INVALID_RESULT, None, f"{trace.lost}{said}"
    if trace.lost is not None and outcome is Outcome.OK:  # a reward without its tokens
        return Outcome.INVALID_RESULT, None, trace.lost
    if not verified or outcome is not Outcome.OK:
        return outcome, result, error
    if verification is None:  # a restart found the agent's result: its session is gone
        return Outcome.VERIFIER_ERROR, _judged(result, None), "verifier: never ran"
    judged, verdict = verification.outcome, verification.result
    if judged is Outcome.OK and verdict is not None:
        return Outcome.OK, _judged(result, verdict), None
    if judged in (Outcome.CANCELLED, Outcome.STALE):
        return judged, None, verification.error
    said = (
        verification.error
        if judged is Outcome.VERIFIER_ERROR
        else f"{judged.value}: {verification.error}"
    )
    return Outcome.VERIFIER_ERROR, _judged(result, verdict), f"verifier: {said}"


def _judged(agent: RolloutResult, verifier: RolloutResult | None) -> RolloutResult:
    """The agent's result with its verifier's verdict: the verifier's rewards (none if it
    could not judge), both trajectories and metrics (the verifier's keys over the agent's)."""
    if verifier is None:
        return agent.model_copy(update={"rewards": None})
    trajectory = {**(agent.trajectory or {}), **(verifier.trajectory or {})}
    rewards = verifier.rewards if verifier.status == "ok" else None
    return agent.model_copy(
        update={
            "rewards": rewards,
            "trajectory": trajectory,
            "metrics": {**agent.metrics, **verifier.metrics},
        }
    )


class RequestRunner:
    """Runs requests' lives against the engine's dispatcher, buffer and gateway replicas."""

    def __init__(
        self,
        config: EngineConfig,
        dispatcher: RequestDispatcher,
        buffer: RolloutBuffer,
        gateway: GatewayReplicas | None,
    ) -> None:
        self._cfg = config
        self._dispatcher = dispatcher
        self._buffer = buffer
        self._gateway = gateway
        self._cleanups: set[asyncio.Task[Any]] = set()  # gateway sessions being dropped
        self._tracer = tracer("agentcore-rollout-engine")  # None: OTel not configured

    async def run(self, job: Job) -> RolloutOutcome:
        """One request's life, start to outcome (see the module's docstring), traced."""
        if self._tracer is not None:
            job.spans = RolloutSpans(self._tracer, _span_attributes(job), job.submitted_at)
        try:
            outcome = await self._run(job)
        except BaseException:  # cancelled outright: its spans still end, unlabelled
            job.spans.ended(None)
            raise
        job.spans.ended(outcome)
        return outcome

    async def _run(self, job: Job) -> RolloutOutcome:
        try:
            delivery = await self._deliver(job)
            if job.verifier is not None and not job.verifier.in_session:
                job.verification = await self._verify(job, delivery)
        except SubmitFailed as e:
            log.warning("submit_failed request_id=%s: %s", job.request.request_id, e)
            ending = self.unresolved(job, e)
        except asyncio.CancelledError as e:
            ending = self.unresolved(job, e)
        except Exception as e:  # a bug must end its request, not leave it hanging
            log.exception("request_id=%s failed inside the engine", job.request.request_id)
            ending = self.unresolved(job, e)
        else:
            ending = self._delivered(job, delivery)
        finally:
            if job.verifier is not None and job.verification is None:  # it never ran
                self._buffer.cancel(job.verifier.request.request_id, "its agent's session failed")
        # Decided: a cancel from here on changes nothing; the outcome waits for its tokens.
        return await _despite_cancel(ending)

    async def _verify(self, job: Job, delivery: Delivery) -> RolloutOutcome | None:
        """Its verifier's life, once the agent's session ended `ok` (else None): a session of
        the verifier's environment, told where the agent's artifacts are, that must end by
        the rollout's deadline."""
        verifier, result = job.verifier, delivery.result
        assert verifier is not None
        if result is None or result.status != "ok":
            return None
        handed = (result.trajectory or {}).get(ARTIFACTS_KEY)
        payload = {**verifier.request.payload, AGENT_ARTIFACTS_KEY: handed}
        verifier.request = replace(verifier.request, payload=payload)
        verifier.deadline = job.deadline
        verifier.start_deadline = min(verifier.start_deadline, job.deadline)
        verifier.resuming = job.resuming
        return await self._run(verifier)

    async def _verify_in_session(
        self, job: Job, session: LiveSession, delivery: Delivery
    ) -> RolloutOutcome | None:
        """Its verifier in the agent's own session, once the agent's session ended `ok` (else
        None): a second invocation there, after the agent and all it started are gone, so
        what the verifier brings (the tests) was never in the session while the agent ran."""
        verifier, result = job.verifier, delivery.result
        assert verifier is not None
        if result is None or result.status != "ok":
            return None
        verifier.session, verifier.session_id = session, session.session_id
        verifier.deadline = job.deadline
        verifier.started_at, verifier.running = time.time(), True
        try:
            await self._dispatcher.invoke_again(
                session, self._payload(verifier, job.deadline, None, None)
            )
        except SubmitFailed as e:
            return await self.unresolved(verifier, e)
        lost = self._dispatcher.lost(session)
        found = await self._buffer.wait(verifier.request.request_id, job.deadline, lost)
        return await self._delivered(verifier, found)

    async def _deliver(self, job: Job) -> Delivery:
        """The buffer's delivery, once the request's session ran; resuming, what the earlier
        engine's session wrote, or waits to write."""
        rid, earlier = job.request.request_id, job.earlier
        if job.resuming and (found := await self._buffer.look_up(rid)) is not None:
            job.took_over(*await self._its_gateway_session(job), self._gateway)
            return found
        # An earlier session still running is taken over under its own id (a warm one's too),
        # never given one of this engine's warm sessions.
        adopting = earlier is not None and earlier.deadline > time.time()
        async with self._dispatcher.live_session(
            earlier.session_id if earlier is not None and adopting else job.session_id,
            job.start_deadline,
            priority=job.admission,
            environment=job.environment,
            warm=not adopting,
        ) as session:
            job.session, job.session_id = session, session.session_id  # a warm one's own id
            if earlier is not None and earlier.deadline > time.time():
                self._dispatcher.adopt(session, earlier.endpoint)  # still running: wait
                job.started_at = earlier.started_at
                session.sent_at = earlier.started_at or time.time()  # where its cost begins
                job.deadline, job.running = earlier.deadline, True
                job.took_over(earlier.gateway_session_id, earlier.gateway_url, self._gateway)
            else:
                await self._start(job, session)
            delivery = await self._buffer.wait(rid, job.deadline, self._dispatcher.lost(session))
            if job.verifier is not None and job.verifier.in_session:
                job.verification = await self._verify_in_session(job, session, delivery)
            return delivery

    async def _its_gateway_session(self, job: Job) -> tuple[str | None, str | None]:
        """The gateway session (id, replica) holding the turns of a result an earlier engine's
        session wrote: as that engine recorded it, or, when it never recorded the start (it
        died while the invocation was in flight), found by request id. Not found, the result
        ends `invalid_result` (`_decide`)."""
        earlier = job.earlier
        if earlier is not None and earlier.gateway_session_id is not None:
            return earlier.gateway_session_id, earlier.gateway_url
        if self._gateway is None:
            return None, None
        found = await self._gateway.session_of(job.request.request_id)
        return (None, None) if found is None else (found[1].session_id, found[0])

    async def _start(self, job: Job, session: LiveSession) -> None:
        """Open the rollout's gateway session, then start its sandbox session."""
        gateway_session = await self._open_gateway_session(job)
        started = await self._dispatcher.start(
            session,
            lambda deadline: self._payload(job, deadline, gateway_session, job.spans.attempt()),
            timeout=job.timeout,
            deadline=job.deadline,
        )
        job.spans.started(started.endpoint)
        job.started_at, job.deadline, job.running = started.sent_at, started.deadline, True
        if job.on_start is not None:
            job.on_start(
                RolloutStart(
                    job.request,
                    job.step,
                    job.session_id,
                    started.sent_at,
                    started.deadline,
                    job.gateway_session_id,
                    job.gateway_url,
                    started.endpoint,
                )
            )

    async def _delivered(self, job: Job, delivery: Delivery) -> RolloutOutcome:
        """The outcome of a delivered request: a result's trace is fetched first (a reward
        without its tokens is not a training sample); without a result, its gateway session
        is dropped for its tokens so far."""
        trace, usage = Trace(), None
        job.spans.delivered(delivery)
        if delivery.result is None:
            usage = await self._dropped_usage(job)
        else:
            trace = await self._trace(job)
        verification = job.verification
        outcome, result, error = _decide(
            delivery, trace=trace, verification=verification, verified=job.verifier is not None
        )
        return job.outcome(
            outcome,
            result=result,
            error=error,
            trace=trace.turns,
            usage=usage,
            verification=verification,
            delivered_at=delivery.handed_off_at,
        )

    async def unresolved(self, job: Job, failure: BaseException) -> RolloutOutcome:
        """The outcome of a request that got no delivery: the buffer stops waiting for it."""
        outcome, _, error = _decide(None, failure=failure, stale=job.stale)
        self._buffer.cancel(job.request.request_id, error or str(outcome))
        usage = await self._dropped_usage(job)
        return job.outcome(outcome, error=error, usage=usage)

    async def _trace(self, job: Job) -> Trace:
        """The request's turns, from the replica holding its gateway session."""
        if self._gateway is None or job.judges:
            return Trace()
        if job.gateway_session_id is None or job.gateway_url is None:
            return Trace(lost="trace lost: no gateway session holds this request's turns")
        try:
            return Trace(await self._gateway.finish(job.gateway_url, job.gateway_session_id))
        except GatewayError as e:
            log.warning("gateway session of request_id=%s: %s", job.request.request_id, e)
            if e.status == 0:  # the replica died
                return Trace(
                    lost=f"gateway replica {job.gateway_url} lost its trace: {e}", replica_lost=True
                )
            return Trace(lost=f"trace lost: {e}")

    async def _dropped_usage(self, job: Job) -> dict[str, int] | None:
        """Drop the request's gateway session, if it has one: its tokens so far, if the gateway
        answers within `_USAGE_WAIT` s. The drop itself goes on regardless (awaited at close),
        so a gateway that hangs delays an outcome by that much at most, its tokens unknown.
        A request of this engine that never opened one spent none."""
        session_id, url = job.gateway_session_id, job.gateway_url
        if self._gateway is None or job.judges:
            return None
        if session_id is None or url is None:
            return None if job.resuming else {}  # a usage of no tokens
        task = self.drop_gateway_session(job.request.request_id, url, session_id)
        done, _ = await asyncio.wait({task}, timeout=_USAGE_WAIT)
        return task.result() if done else None

    def drop_gateway_session(
        self, request_id: str, url: str, session_id: str
    ) -> asyncio.Task[dict[str, int] | None]:
        """Drop a gateway session in a task `aclose` awaits: its usage, None if unknown."""
        task = asyncio.create_task(self._gateway_dropped(request_id, url, session_id))
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)
        return task

    async def _gateway_dropped(
        self, request_id: str, url: str, session_id: str
    ) -> dict[str, int] | None:
        assert self._gateway is not None
        try:
            return await self._gateway.drop(url, session_id)
        except GatewayError as e:
            log.warning("gateway session of request_id=%s: %s", request_id, e)
        except Exception:  # a cleanup's bug must not fail the request's outcome
            log.exception("dropping the gateway session of request_id=%s", request_id)
        return None

    async def aclose(self) -> None:
        """Wait for the gateway sessions being dropped (never cancelled)."""
        await asyncio.gather(*self._cleanups, return_exceptions=True)

    async def _open_gateway_session(self, job: Job) -> GatewaySession | None:
        """Open the rollout's session on the least-loaded replica that answers."""
        if self._gateway is None or job.judges:
            return None
        gw, llm = self._cfg.gateway, self._cfg.llm
        assert gw is not None
        try:
            job.gateway_url, session = await self._gateway.open(
                job.request.request_id,
                sampling=llm.sampling if llm else None,
                max_context=gw.max_context,
                max_turns=gw.max_turns,
                traceparent=job.spans.traceparent,
            )
        except GatewayError as e:
            raise SubmitFailed(f"gateway: {e}") from None
        job.gateway_session_id = session.session_id
        return session

    def _payload(
        self,
        job: Job,
        deadline: float,
        gateway_session: GatewaySession | None,
        traceparent: str | None,
    ) -> bytes:
        cfg, llm, request = self._cfg, self._cfg.llm, job.request
        if gateway_session is not None:  # agents call their session's replica with its key
            assert self._gateway is not None and job.gateway_url is not None
            agents = self._gateway.agent_url(job.gateway_url, gateway_session)
            llm = LLMSettings(
                base_url=f"{agents}/v1",
                model=llm.model if llm else (gateway_session.model or "policy"),
                api_key=gateway_session.api_key,
                sampling=llm.sampling if llm else {},
            )
        control = RolloutControl(
            exp_id=cfg.exp_id,
            step=job.step,
            request_id=request.request_id,
            input_id=request.input_id,
            sample_index=request.sample_index,
            session_id=job.session_id,
            result=ResultTarget(
                bucket=cfg.bucket,
                key=job.result_key,
                queue_url=cfg.queue_url if cfg.results.notify_directly else None,
                inline_max_bytes=INLINE_RESULT_MAX_BYTES if cfg.results.notify_directly else 0,
            ),
            llm=llm,
            deadline=deadline,
            sig_key=job.sig_key,
            max_result_bytes=cfg.results.max_result_bytes,
            traceparent=traceparent,
        )
        untraced = None if traceparent else {"traceparent"}  # as agents before it know it
        block = control.model_dump(mode="json", exclude=untraced)
        payload = {k: v for k, v in request.payload.items() if k != VERIFIER_KEY}
        return json.dumps({**payload, CONTROL_KEY: block}).encode()


def _span_attributes(job: Job) -> dict[str, Any]:
    request = job.request
    return {
        "rollout.request_id": request.request_id,
        "rollout.input_id": request.input_id,
        "rollout.sample_index": request.sample_index,
        "rollout.step": job.step,
        "rollout.session_id": job.session_id,
    }


async def _despite_cancel(work: Coroutine[Any, Any, _T]) -> _T:
    """Finish `work` even if this task is cancelled meanwhile: what it decides stands."""
    task = asyncio.ensure_future(work)
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():
                raise
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
    return task.result()
