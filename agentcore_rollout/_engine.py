"""RolloutEngine: a batch of prompts in, one terminal outcome per prompt out.

Each request lives one life, read top to bottom in `RolloutEngine._run`:
register with the buffer -> take a live-session slot -> open its gateway session -> start its
sandbox session -> wait for the buffer's delivery -> fetch the trace its result needs -> build
its outcome, once. Its session's stop runs behind the hand-off (the dispatcher's
`live_session`). Whatever happens, the request ends in exactly one `Outcome`, and no outcome is
invented: a failure carries no rewards.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Generator, Iterable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from botocore.exceptions import BotoCoreError, ClientError

from ._agentcore import AgentCoreRuntime
from ._aws import AwsClients
from ._batch import RolloutBatch, RolloutOutcome, RolloutRequest, RolloutStart, StaleResult
from ._buffer import Delivery, RolloutBuffer
from ._cost import rollout_cost
from ._dispatcher import Endpoint, LiveSession, RequestDispatcher, SubmitFailed
from ._gateway_admin import GatewayError, GatewaySession
from ._gateway_replicas import GatewayReplicas
from ._quotas import Limits, account_quotas, describe, published
from ._redact import get_logger, redact
from ._sandbox import SandboxRuntime
from ._stats import EngineStats
from .config import ConfigError, CostConfig, EngineConfig
from .contract import (
    CONTROL_KEY,
    INLINE_RESULT_MAX_BYTES,
    LLMSettings,
    Outcome,
    ResultTarget,
    RolloutControl,
    check_request,
    listing_prefix,
    new_run_secret,
    session_id,
    signing_key,
)

log = get_logger("agentcore_rollout.engine")

_T = TypeVar("_T")
_USAGE_WAIT = 2.0
"""Seconds an outcome without a result waits for its dropped gateway session's tokens."""


class RolloutHandle:
    """An awaitable for one submitted request; `cancel()` ends it as `cancelled`."""

    def __init__(
        self,
        task: asyncio.Task[RolloutOutcome],
        request: RolloutRequest,
        end_unstarted: Callable[[], Awaitable[RolloutOutcome]],
    ) -> None:
        self._task = task
        self._end_unstarted = end_unstarted
        self._unstarted: RolloutOutcome | None = None
        self.request = request

    def __await__(self) -> Generator[Any, None, RolloutOutcome]:
        return self._wait().__await__()

    async def _wait(self) -> RolloutOutcome:
        try:
            return await asyncio.shield(self._task)
        except asyncio.CancelledError:
            if not self._task.cancelled():
                raise  # whoever awaits us was cancelled, not the rollout
            # Cancelled before it ever ran: nothing was dispatched, nothing to stop.
            if self._unstarted is None:  # no gateway session yet: ends without a wait
                self._unstarted = await self._end_unstarted()
            return self._unstarted

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
        # Without a configured secret results are verifiable by this engine alone (no resume).
        self._run_secret = config.run_secret or new_run_secret()
        self._requests: dict[asyncio.Task[RolloutOutcome], _Job] = {}  # each running request
        self._cleanups: set[asyncio.Task[Any]] = set()  # gateway sessions being dropped
        self._gateway: GatewayReplicas | None = None
        self._dispatcher: RequestDispatcher
        self._buffer: RolloutBuffer
        self.quotas = ""
        """Once started: the quotas in force in each account and region, and where each came
        from (Service Quotas, the published defaults and why, or `engine.dispatch`), in one
        line, as logged at start-up."""

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
            endpoints = await self._endpoints()
            accounts = await self._accounts()
        except BaseException:
            await self._clients.__aexit__(None, None, None)
            raise
        self._dispatcher = RequestDispatcher(endpoints, self.config, accounts=accounts)
        self._buffer = RolloutBuffer(self._clients.s3, self._clients.sqs, self.config)
        self._buffer.advance(self._step)
        if self.config.gateway is not None:
            self._gateway = GatewayReplicas(  # a dead replica is tried again at this cadence
                self.config.gateway.all_replicas,
                self.config.gateway.admin_token,
                retry_after=self.config.dispatch.backoff_max,
            )
        await self._buffer.start()

    async def _endpoints(self) -> list[Endpoint]:
        """One per runtime endpoint (`engine.runtimes`, or `runtime_arn` + `qualifier`), each
        with its own live bound and its account; a runtime given to the engine is the one."""
        cfg = self.config
        targets = cfg.all_runtimes
        if self._runtime is not None:
            if len(targets) > 1:
                raise ConfigError("engine.runtimes: a runtime given to the engine is one endpoint")
            return [Endpoint(targets[0].name if targets else "runtime", self._runtime)]
        endpoints = []
        for t in targets:
            client = await self._clients.agentcore_in(
                t.region, t.data_plane_url or cfg.service_urls.agentcore
            )
            runtime = AgentCoreRuntime(client, t.arn, t.qualifier)
            endpoints.append(Endpoint(t.name, runtime, t.max_live_sessions, t.account))
        return endpoints

    async def _accounts(self) -> dict[str, Limits]:
        """Each account's limits: `engine.dispatch`'s values, else its quotas, read from Service
        Quotas where it answers, else the published ones; said in one line at start-up."""
        cfg = self.config
        if self._runtime is not None:  # not necessarily AgentCore's: nobody to ask
            quotas = {"": published(cfg.region, "a runtime given to the engine")}
        else:
            quotas = await account_quotas(self._clients, cfg)
        self.quotas = describe(quotas, cfg.dispatch)
        log.info("%s", self.quotas)
        return {account: Limits.of(q, cfg.dispatch) for account, q in quotas.items()}

    async def aclose(self) -> None:
        """Cancel what runs (each ends `cancelled`), wait for the sessions' stops, close."""
        for task in list(self._requests):
            task.cancel()
        await asyncio.gather(*self._requests, return_exceptions=True)
        await self._dispatcher.aclose()  # the sessions' stops
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
                    Bucket=cfg.bucket, Prefix=listing_prefix(cfg.prefix), MaxKeys=1
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
                where = getattr(self._clients, service).meta.endpoint_url
                raise ConfigError(redact(f"config: cannot reach {where}: {e}")) from None

    # ------------------------------------------------------------------ public API

    @property
    def step(self) -> int:
        """The policy version new requests are submitted with."""
        return self._step

    def set_step(self, step: int) -> None:
        """Move to a new policy version (after pushing its weights to the policy servers).

        Requests of the last `max_staleness` steps keep running and may still end `ok` (an
        off-policy trainer weighs them by importance). With `stale_policy` `end`, older ones
        still running end `stale` now, their sessions stopped; with `keep`, they run on (their
        turns resume under the new weights) and the trainer decides what of them trains. What
        the engine remembers of ended requests of older steps is dropped once they are out of
        the retained window."""
        if step < self._step:
            raise ValueError(f"step {step} is behind the engine's step {self._step}")
        self._step = step
        self._buffer.advance(step)
        if self.config.limits.stale_policy == "keep":
            return
        oldest = step - self.config.limits.max_staleness
        for task, job in list(self._requests.items()):
            if job.step < oldest and not task.done():
                job.stale = (
                    f"step {job.step} is {step - job.step} behind the current step "
                    f"{step} (engine.limits.max_staleness={self.config.limits.max_staleness})"
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
        cutoff: float | None = None,
        on_start: Callable[[RolloutStart], None] | None = None,
    ) -> RolloutHandle:
        """Start one rollout. `step` is its policy version: the engine's current step (the default)
        or one of the `max_staleness` before it (with `stale_policy` `keep`, any earlier one: a late
        group member, a request re-issued after a restart). Its deadline is `timeout` after its
        session's start (default: `rollout_timeout`), and no later than `cutoff` (unix seconds),
        which also bounds the wait to start. `on_start(RolloutStart)` is called once its session
        started: what to journal to `resume` it after a restart.

        A malformed request (`contract.check_request`), a request_id in use or a step out of that
        range is a ValueError, raised before anything is taken."""
        return self._submit(request, step, timeout, cutoff, on_start)

    def resume(
        self,
        request: RolloutRequest,
        *,
        step: int,
        deadline: float | None = None,
        started_at: float | None = None,
        gateway_session_id: str | None = None,
        gateway_url: str | None = None,
        endpoint: str | None = None,
        timeout: float | None = None,
        on_start: Callable[[RolloutStart], None] | None = None,
    ) -> RolloutHandle:
        """Take over a request an earlier engine of this experiment (same `exp_id` and
        `run_secret`) submitted, e.g. after a crash. If its result is in S3 it is delivered
        without invoking the agent again; if its session started and its `deadline` (as the
        earlier engine's `RolloutStart` had it) has not passed, the engine waits for it, its
        cost counted from `started_at` (the same `RolloutStart`'s; None: from the takeover);
        otherwise it is dispatched as `submit` would. `gateway_session_id` and `gateway_url`
        (from the same `RolloutStart`; no URL: the first replica, where every session was before
        there were several) let the gateway's trace be collected; a session still running is
        stopped on its `endpoint` (None: the first runtime endpoint)."""
        resumed = _Resumed(deadline, started_at, gateway_session_id, gateway_url, endpoint)
        return self._submit(request, step, timeout, None, on_start, resumed)

    async def reclaim(
        self, request: RolloutRequest, *, step: int, timeout: float | None = None
    ) -> RolloutHandle | None:
        """Take over a request an earlier engine of this experiment (same `exp_id` and
        `run_secret`) started under `step`, with no journal to say how far it got: a trainer
        that re-issues its requests after a restart. The gateway still holding the request's
        session (its trace) is what makes the earlier session's work worth taking:

        - its result is in S3: a handle that delivers it with its trace, invoking nothing;
        - the agent has taken turns in that session but written no result yet: its sandbox
          session is running, and the handle waits for it (at most `timeout`, default
          `rollout_timeout`, from now: its own deadline is earlier);
        - otherwise None, and the request must run anew. An untouched gateway session (its
          sandbox session may never have started) is dropped, so a late agent cannot sample
          into it. Without a gateway, only a result already in S3 is taken.

        The step is not checked against `max_staleness`: the earlier engine accepted it."""
        check_request(request.request_id, request.input_id, request.sample_index, request.payload)
        held, url = None, None
        if self._gateway is not None:
            found = await self._gateway.session_of(request.request_id)  # asks every replica
            if found is None:
                return None  # a result without its trace trains nothing: run it anew
            url, held = found
        gateway_session_id = held.session_id if held is not None else None
        if await self._buffer.stored(request.request_id, step):
            resumed = _Resumed(None, None, gateway_session_id, url, None)
        elif held is not None and held.turns > 0:
            wait = self.config.limits.rollout_timeout if timeout is None else timeout
            resumed = _Resumed(time.time() + wait, None, gateway_session_id, url, None)
        else:
            if held is not None and url is not None:
                await self._gateway_dropped(request.request_id, url, held.session_id)
            return None
        return self._submit(request, step, timeout, None, None, resumed, checked_step=False)

    def _submit(
        self,
        request: RolloutRequest,
        step: int | None,
        timeout: float | None,
        cutoff: float | None,
        on_start: Callable[[RolloutStart], None] | None,
        resumed: _Resumed | None = None,
        checked_step: bool = True,
    ) -> RolloutHandle:
        check_request(request.request_id, request.input_id, request.sample_index, request.payload)
        step = self._step if step is None else step
        limits = self.config.limits
        unbounded = limits.stale_policy == "keep" or not checked_step
        oldest = 0 if unbounded else self._step - limits.max_staleness
        if not max(0, oldest) <= step <= self._step:
            raise ValueError(
                f"step {step}: must be the engine's step {self._step} or, with engine.limits."
                f"max_staleness={limits.max_staleness}, one no older than {max(0, oldest)}"
            )
        job = self._job(request, step, timeout, cutoff, on_start, resumed)
        task = asyncio.create_task(self._run(job))
        self._requests[task] = job
        task.add_done_callback(self._requests.__delitem__)
        return RolloutHandle(task, request, lambda: self._unresolved(job, *job.why_cancelled()))

    def _job(
        self,
        request: RolloutRequest,
        step: int,
        timeout: float | None,
        cutoff: float | None,
        on_start: Callable[[RolloutStart], None] | None,
        resumed: _Resumed | None,
    ) -> _Job:
        """Register the request with the buffer (so no result arrives unclaimed): its job."""
        cfg, submitted = self.config, time.time()
        cutoff = math.inf if cutoff is None else cutoff
        sig_key = signing_key(self._run_secret, cfg.exp_id, request.request_id)
        queued_until = (
            submitted + cfg.limits.queue_timeout if cfg.limits.queue_timeout else math.inf
        )
        return _Job(
            request=request,
            step=step,
            session_id=session_id(cfg.exp_id, step, request.request_id),
            sig_key=sig_key,
            result_key=self._buffer.expect(request.request_id, step=step, sig_key=sig_key),
            timeout=cfg.limits.rollout_timeout if timeout is None else timeout,
            cutoff=cutoff,
            start_by=min(cutoff, queued_until),
            submitted_at=submitted,
            on_start=on_start,
            resumed=resumed,
            prices=cfg.cost,
        )

    async def stream(
        self,
        requests: Iterable[RolloutRequest],
        *,
        step: int | None = None,
        timeout: float | None = None,
        cutoff: float | None = None,
    ) -> AsyncIterator[RolloutOutcome]:
        """Yield outcomes as they complete; closing the iterator cancels what is left."""
        handles = [self.submit(r, step=step, timeout=timeout, cutoff=cutoff) for r in requests]
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
        cutoff: float | None = None,
    ) -> RolloutBatch:
        """Run a batch; outcomes come back in request order."""
        began, before = time.monotonic(), self.stats()
        step = self._step if step is None else step
        handles = [self.submit(r, step=step, timeout=timeout, cutoff=cutoff) for r in requests]
        outcomes = [await h for h in handles]
        return RolloutBatch(
            step=step,
            outcomes=outcomes,
            stats=self.stats().since(before),
            wall_time=time.monotonic() - began,
        )

    # ------------------------------------------------------------------ one request

    async def _run(self, job: _Job) -> RolloutOutcome:
        """One request's life, start to outcome (see the module's docstring)."""
        try:
            delivery = await self._deliver(job)
        except SubmitFailed as e:
            log.warning("submit_failed request_id=%s: %s", job.request.request_id, e)
            ending = self._unresolved(job, Outcome.SUBMIT_FAILED, str(e))
        except asyncio.CancelledError:
            ending = self._unresolved(job, *job.why_cancelled())
        except Exception as e:  # a bug must end its request, not leave it hanging
            log.exception("request_id=%s failed inside the engine", job.request.request_id)
            ending = self._unresolved(job, Outcome.SUBMIT_FAILED, f"engine error: {e!r}")
        else:
            ending = self._decided(job, delivery)
        # Decided: a cancel from here on changes nothing; the outcome waits for its tokens.
        return await _despite_cancel(ending)

    async def _deliver(self, job: _Job) -> Delivery:
        """The buffer's delivery, once the request's session ran; resuming, what the earlier
        engine's session wrote, or waits to write."""
        rid, resumed = job.request.request_id, job.resumed
        if resumed is not None and (found := await self._buffer.look_up(rid)) is not None:
            job.took_over(await self._with_its_session(rid, resumed), self._gateway)
            return found
        async with self._dispatcher.live_session(
            job.session_id, job.start_by, priority=job.step
        ) as session:
            job.session = session
            if resumed is not None and (resumed.deadline or 0) > time.time():
                self._dispatcher.adopt(session, resumed.endpoint)  # still running: wait
                job.started_at = resumed.started_at
                session.sent_at = resumed.started_at or time.time()  # where its cost begins
                job.deadline = resumed.deadline
                job.took_over(resumed, self._gateway)
            else:
                await self._start(job, session)
            assert job.deadline is not None
            return await self._buffer.wait(rid, job.deadline, self._dispatcher.lost(session))

    async def _with_its_session(self, request_id: str, resumed: _Resumed) -> _Resumed:
        """A result written by a session whose start the earlier engine never recorded (it
        died while the invocation was in flight): its gateway session, found by request id,
        holds the trace. Not found, the result ends `invalid_result` (`_decided`)."""
        if self._gateway is None or resumed.gateway_session_id is not None:
            return resumed
        found = await self._gateway.session_of(request_id)
        if found is None:
            return resumed
        url, held = found
        return replace(resumed, gateway_session_id=held.session_id, gateway_url=url)

    async def _start(self, job: _Job, session: LiveSession) -> None:
        """Open the rollout's gateway session, then start its sandbox session."""
        gateway_session = await self._open_gateway_session(job)
        started = await self._dispatcher.start(
            session,
            lambda deadline: self._payload(job, deadline, gateway_session),
            timeout=job.timeout,
            cutoff=job.cutoff,
        )
        job.started_at, job.deadline = started.sent_at, started.deadline
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

    async def _decided(self, job: _Job, delivery: Delivery) -> RolloutOutcome:
        """The outcome of a delivered request. A result's trace is fetched first: an `ok`
        whose trace is lost ends `invalid_result` (a reward without its tokens is not a
        training sample)."""
        outcome, result, error = delivery.outcome, delivery.result, delivery.error
        if error is None and result is not None and result.error is not None:
            error = f"{result.error.type}: {result.error.message}"
        trace = usage = None
        if result is None:
            usage = await self._dropped_usage(job)
        elif self._gateway is not None and job.gateway_session_id is None:
            if outcome is Outcome.OK:  # a reward without its tokens is not a training sample
                outcome, result = Outcome.INVALID_RESULT, None
                error = "trace lost: no gateway session holds this request's turns"
        elif job.gateway_session_id is not None and job.gateway_url is not None:
            assert self._gateway is not None
            try:
                trace = await self._gateway.finish(job.gateway_url, job.gateway_session_id)
            except GatewayError as e:
                log.warning("gateway session of request_id=%s: %s", job.request.request_id, e)
                if e.status == 0:  # the replica died: whatever the agent made of it, no tokens
                    said = f" (the agent's result: {outcome.value}: {error})" if error else ""
                    outcome, result = Outcome.INVALID_RESULT, None
                    error = f"gateway replica {job.gateway_url} lost its trace: {e}{said}"
                elif outcome is Outcome.OK:
                    outcome, result, error = Outcome.INVALID_RESULT, None, f"trace lost: {e}"
        return job.outcome(
            outcome,
            result=result,
            error=error,
            trace=trace,
            usage=usage,
            delivered_at=delivery.handed_off_at,
        )

    async def _unresolved(self, job: _Job, outcome: Outcome, error: str) -> RolloutOutcome:
        """The outcome of a request that got no delivery: the buffer stops waiting for it."""
        self._buffer.cancel(job.request.request_id, error)
        usage = await self._dropped_usage(job)
        return job.outcome(outcome, error=error, usage=usage)

    async def _dropped_usage(self, job: _Job) -> dict[str, int] | None:
        """Drop the request's gateway session, if it has one: its tokens so far, if the gateway
        answers within `_USAGE_WAIT` s. The drop itself goes on regardless (awaited at close),
        so a gateway that hangs delays an outcome by that much at most, its tokens unknown.
        A request of this engine that never opened one spent none."""
        session_id, url = job.gateway_session_id, job.gateway_url
        if self._gateway is None:
            return None
        if session_id is None or url is None:
            return None if job.resumed is not None else {}  # a usage of no tokens
        task = asyncio.create_task(self._gateway_dropped(job.request.request_id, url, session_id))
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)
        done, _ = await asyncio.wait({task}, timeout=_USAGE_WAIT)
        return task.result() if done else None

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

    async def _open_gateway_session(self, job: _Job) -> GatewaySession | None:
        """Open the rollout's session on the least-loaded replica that answers."""
        if self._gateway is None:
            return None
        gw, llm = self.config.gateway, self.config.llm
        assert gw is not None
        try:
            job.gateway_url, session = await self._gateway.open(
                job.request.request_id,
                sampling=llm.sampling if llm else None,
                max_context=gw.max_context,
                max_turns=gw.max_turns,
            )
        except GatewayError as e:
            raise SubmitFailed(f"gateway: {e}") from None
        job.gateway_session_id = session.session_id
        return session

    def _payload(self, job: _Job, deadline: float, gateway_session: GatewaySession | None) -> bytes:
        cfg, llm, request = self.config, self.config.llm, job.request
        if gateway_session is not None:  # agents call their session's replica with its key
            assert self._gateway is not None and job.gateway_url is not None
            llm = LLMSettings(
                base_url=f"{self._gateway.agent_url(job.gateway_url).rstrip('/')}/v1",
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
        )
        return json.dumps(
            {**request.payload, CONTROL_KEY: control.model_dump(mode="json")}
        ).encode()


@dataclass(frozen=True)
class _Resumed:
    deadline: float | None
    started_at: float | None  # when the earlier engine sent its invocation (None: unknown)
    gateway_session_id: str | None
    gateway_url: str | None  # the replica holding it; None: the first (journals of one)
    endpoint: str | None  # where its session started (None: the first)


@dataclass
class _Job:
    """One request's life: what was asked, fixed at submit, and what `_run` learns on the way
    (when its session started, its deadline, its gateway session), from which its outcome is
    built once."""

    request: RolloutRequest
    step: int
    session_id: str
    sig_key: str
    result_key: str
    timeout: float
    cutoff: float  # unix seconds: the request starts and ends by then (inf: none)
    start_by: float  # the session must have started by then (queue_timeout, cutoff)
    submitted_at: float
    on_start: Callable[[RolloutStart], None] | None
    resumed: _Resumed | None
    prices: CostConfig
    session: LiveSession | None = None  # its live-session slot, once it has one
    started_at: float | None = None
    deadline: float | None = None
    gateway_session_id: str | None = None
    gateway_url: str | None = None  # the replica its gateway session is on
    stale: str | None = None  # why `set_step` ended it, if it did

    def took_over(self, resumed: _Resumed, gateway: GatewayReplicas | None) -> None:
        """Its gateway session is the earlier engine's, on the replica that engine recorded."""
        self.gateway_session_id = resumed.gateway_session_id
        if gateway is not None and self.gateway_session_id is not None:
            self.gateway_url = (resumed.gateway_url or gateway.urls[0]).rstrip("/")
            gateway.adopt(self.gateway_url, self.gateway_session_id)

    def why_cancelled(self) -> tuple[Outcome, str]:
        """`stale` if `set_step` cancelled it, else `cancelled`."""
        return (
            (Outcome.STALE, self.stale)
            if self.stale is not None
            else (Outcome.CANCELLED, "cancelled")
        )

    def outcome(
        self,
        outcome: Outcome,
        *,
        trace: dict[str, Any] | None = None,
        usage: dict[str, int] | None = None,
        **ended: Any,
    ) -> RolloutOutcome:
        """Its outcome, with its cost: tokens from its trace, else from the usage its dropped
        gateway session reported."""
        finished = time.time()
        if ended.get("error"):  # the one door every error takes into an outcome
            ended["error"] = redact(ended["error"])
        return RolloutOutcome(
            self.request,
            self.step,
            outcome,
            self.session_id,
            submitted_at=self.submitted_at,
            started_at=self.started_at,
            deadline=self.deadline,
            gateway_session_id=self.gateway_session_id,
            gateway_url=self.gateway_url,
            finished_at=finished,
            trace=trace,
            cost=rollout_cost(
                self.prices,
                self.sandbox_since(),
                finished,
                trace if trace is not None or usage is None else {"usage": usage},
            ),
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
