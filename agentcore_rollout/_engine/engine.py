"""RolloutEngine: a batch of prompts in, one terminal outcome per prompt out.

The engine is the trainer's face: it starts the dispatcher, the buffer and the gateway
replicas, checks each request at submit and registers it (`Job`), keeps the task of each one
running, and moves the step. Each request's life, from its slot to its one `Outcome`, reads top
to bottom in `_request.RequestRunner.run`.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterable, Sequence
from typing import Any

from .._aws import AwsClients
from .._batch import LateResult, RolloutBatch, RolloutOutcome, RolloutRequest, RolloutStart
from .._dispatch.dispatcher import RequestDispatcher
from .._redact import get_logger
from .._results.buffer import RolloutBuffer
from .._stats import EngineStats
from ..config import EngineConfig
from ..contract import (
    ENVIRONMENT_KEY,
    VERIFIER_KEY,
    check_request,
    new_run_secret,
    session_id,
    signing_key,
    verifier_request_id,
)
from ..runtimes.base import SandboxRuntime
from .gateway_replicas import GatewayReplicas
from .request import Job, RequestRunner
from .startup import endpoints_and_limits, preflight, runtimes_of
from .tracing import flush as flush_spans
from .warming import WarmPlan, lead_time

log = get_logger("agentcore_rollout.engine")


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
        runtimes: Sequence[SandboxRuntime] = (),
        step: int = 0,
    ) -> None:
        self.config = config
        self._step = step
        self._runtimes = list(runtimes)
        self._clients = AwsClients(config)
        # Without a configured secret results are verifiable by this engine alone (no resume).
        self._run_secret = config.run_secret or new_run_secret()
        self._requests: dict[asyncio.Task[RolloutOutcome], Job] = {}  # each running request
        self._running: Counter[int] = Counter()  # running requests by step
        self._gateway: GatewayReplicas | None = None
        self._dispatcher: RequestDispatcher
        self._buffer: RolloutBuffer
        self._runner: RequestRunner
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
        self.config.require_targets(runtime_arn=not self._runtimes)
        await self._clients.__aenter__()
        try:
            await preflight(self._clients, self.config)
            runtimes = await runtimes_of(self._clients, self.config, self._runtimes)
            endpoints, pools, self.quotas = await endpoints_and_limits(
                runtimes, self.config.dispatch
            )
            log.info("%s", self.quotas)
        except BaseException:
            await self._clients.__aexit__(None, None, None)
            raise
        self._dispatcher = RequestDispatcher(endpoints, self.config, pools=pools)
        self._first = endpoints[0].name  # where a reclaimed session runs, as far as we know
        self._buffer = RolloutBuffer(self._clients.s3, self._clients.sqs, self.config)
        self._buffer.advance(self._step)
        if self.config.gateway is not None:
            self._gateway = GatewayReplicas(  # a dead replica is tried again at this cadence
                self.config.gateway.all_replicas,
                self.config.gateway.admin_token,
                retry_after=self.config.dispatch.backoff_max,
            )
        self._runner = RequestRunner(self.config, self._dispatcher, self._buffer, self._gateway)
        self._warm_plan = WarmPlan(
            self._step,
            lambda n, environment, step: self._top_up(n, environment, step, range(step, step + 1)),
            lambda n: lead_time(
                n, self._dispatcher.start_rate, self.config.dispatch.session_start_time
            ),
        )
        await self._buffer.start()

    async def aclose(self) -> None:
        """Cancel what runs (each ends `cancelled`), wait for the sessions' stops, close."""
        for task in list(self._requests):
            task.cancel()
        await asyncio.gather(*self._requests, return_exceptions=True)
        self._warm_plan.close()
        await self._dispatcher.aclose()  # the sessions' stops
        await self._runner.aclose()  # the gateway sessions' drops
        await self._buffer.close()
        if self._gateway is not None:
            await self._gateway.close()
        await self._clients.__aexit__(None, None, None)
        await flush_spans()  # the rollouts' trace spans, when OpenTelemetry is configured

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
        self._warm_plan.began(step)
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

    def warm(self, n: int, *, environment: str | None = None, step: int | None = None) -> int:
        """Have `n` sessions (of `environment`: a Harbor task's) started ahead of their
        requests, so that those start at the call rate, not at the new-session quota's pace.

        `step`: the step whose requests they are for. Ask as soon as `n` is known (at the
        start of the step before): they start so that the last is ready when `set_step(step)`
        comes, as far as the steps so far tell (`WarmPlan`; the first step's at once), and
        only requests of that step or later take them. None: at once, for
        any request (a pipelined trainer's pool). Tops up what is warm or warming already; each
        warm session serves one rollout, and one nobody takes is stopped after
        `engine.dispatch.warm_max_idle` seconds, or at `aclose`. Returns how many started now,
        within `engine.dispatch.warm` (None: none) and the free live slots."""
        cap = self.config.dispatch.warm
        if not cap:
            return 0
        environment = self._dispatcher.environment_of({ENVIRONMENT_KEY: environment})
        wanted = n if cap == "auto" else min(n, cap)
        if step is None:  # counted: all that a request of this step may take
            return self._top_up(wanted, environment, self._step, range(self._step + 1))
        return self._warm_plan.ask(wanted, environment, step)

    def _top_up(self, n: int, environment: str | None, step: int, counted: range) -> int:
        """Start warm-ups for `step` until `n` warmed for one of the steps `counted` are
        parked or under way; returns how many started."""
        queued = self.config.limits.queue_timeout
        return self._dispatcher.warm(
            n - self._dispatcher.warm_held(environment, counted),
            self.config.exp_id,
            start_deadline=time.time() + (queued if queued is not None else math.inf),
            environment=environment,
            priority=step,
        )

    def stats(self) -> EngineStats:
        """A snapshot: sessions alive, starts in flight, retries, throttles, duplicates, ..."""
        return EngineStats(
            **self._dispatcher.stats(),
            **self._buffer.stats(),
            api_calls=self._clients.api_calls,
        )

    def take_late(self) -> list[LateResult]:
        """Results that arrived after their request had ended, since the last call."""
        return self._buffer.take_late()

    def submit(
        self,
        request: RolloutRequest,
        *,
        step: int | None = None,
        timeout: float | None = None,
        deadline: float | None = None,
        on_start: Callable[[RolloutStart], None] | None = None,
    ) -> RolloutHandle:
        """Start one rollout. `step` is its policy version: the engine's current step (the default)
        or one of the `max_staleness` before it (with `stale_policy` `keep`, any earlier one: a late
        group member, a request re-issued after a restart). It must end `timeout` after its
        session's start (default: `rollout_timeout`), and no later than `deadline` (unix seconds),
        which also bounds the wait to start. `on_start(RolloutStart)` is called once its session
        started: what to journal to `resume` it after a restart.

        A malformed request (`contract.check_request`), a request_id in use or a step out of that
        range is a ValueError, raised before anything is taken."""
        job = self._job(request, step, timeout, deadline, on_start)
        return self._run(job)

    def resume(
        self,
        journaled: RolloutStart | RolloutRequest,
        *,
        step: int | None = None,
        timeout: float | None = None,
        on_start: Callable[[RolloutStart], None] | None = None,
    ) -> RolloutHandle:
        """Take over a request an earlier engine of this experiment (same `exp_id` and
        `run_secret`) submitted, e.g. after a crash: its `RolloutStart` as `on_start` gave it,
        or, if its session's start was never recorded, the request and its `step`. If its
        result is in S3 it is delivered without invoking the agent again; if its session
        started and its deadline has not passed, the engine waits for it, its cost counted
        from its `started_at`, its trace collected from its gateway session, and it is stopped
        on its runtime endpoint; otherwise it is dispatched as `submit` would."""
        if isinstance(journaled, RolloutStart):
            request, step, earlier = journaled.request, journaled.step, journaled
        elif step is None:
            raise ValueError("resume: a request without its RolloutStart needs its step")
        else:
            request, earlier = journaled, None
        job = self._job(request, step, timeout, None, on_start)
        job.resuming, job.earlier = True, earlier
        return self._run(job)

    async def reclaim(
        self, request: RolloutRequest, *, step: int, timeout: float | None = None
    ) -> RolloutHandle | None:
        """Take over a request an earlier engine of this experiment (same `exp_id` and
        `run_secret`) started under `step`, with no journal to say how far it got: a trainer
        that re-issues its requests after a restart. The gateway still holding the request's
        session (its trace) is what makes the earlier session's work worth taking:

        - its result is in S3: a handle that delivers it with its trace, invoking nothing;
        - the agent has taken turns in that session but written no result yet: its sandbox
          session is running (on the first runtime endpoint, as far as anyone knows: exact
          with one), and the handle waits for it (at most `timeout`, default
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
        stored = await self._buffer.stored(request.request_id, step)
        if not stored and (held is None or held.turns == 0):
            if held is not None and url is not None:
                await self._runner.drop_gateway_session(request.request_id, url, held.session_id)
            return None
        # Stored: nothing to wait for (a deadline of now); else its session runs: wait for it.
        wait = self.config.limits.rollout_timeout if timeout is None else timeout
        sid = session_id(self.config.exp_id, step, request.request_id)
        held_id = held.session_id if held is not None else None
        deadline = time.time() + (0.0 if stored else wait)
        earlier = RolloutStart(request, step, sid, None, deadline, held_id, url, self._first)
        job = self._job(request, step, timeout, None, None, checked_step=False)
        job.resuming, job.earlier = True, earlier
        return self._run(job)

    def _job(
        self,
        request: RolloutRequest,
        step: int | None,
        timeout: float | None,
        deadline: float | None,
        on_start: Callable[[RolloutStart], None] | None,
        *,
        checked_step: bool = True,
        in_session_of: str | None = None,
    ) -> Job:
        """Check the request and its step, and register it with the buffer (so no result
        arrives unclaimed): its job."""
        check_request(request.request_id, request.input_id, request.sample_index, request.payload)
        in_session = in_session_of is not None  # a verifier in its agent's session
        environment = None if in_session else self._dispatcher.environment_of(request.payload)
        # (its agent's session decides where it runs)
        cfg, submitted = self.config, time.time()
        step = self._step if step is None else step
        unbounded = cfg.limits.stale_policy == "keep" or not checked_step
        oldest = 0 if unbounded else self._step - cfg.limits.max_staleness
        if not max(0, oldest) <= step <= self._step:
            raise ValueError(
                f"step {step}: must be the engine's step {self._step} or, with engine.limits."
                f"max_staleness={cfg.limits.max_staleness}, one no older than {max(0, oldest)}"
            )
        verifier = request.payload.get(VERIFIER_KEY)
        if verifier is not None:  # its own request, checked and registered with the agent's
            own = verifier.get(ENVIRONMENT_KEY) is not None  # else: in the agent's session
            verifier = self._job(
                RolloutRequest(
                    verifier,
                    request.input_id,
                    request.sample_index,
                    verifier_request_id(request.request_id),
                ),
                step,
                timeout,
                deadline,
                None,
                checked_step=False,
                in_session_of=None if own else session_id(cfg.exp_id, step, request.request_id),
            )
            verifier.judges = True
        deadline = math.inf if deadline is None else deadline
        sig_key = signing_key(self._run_secret, cfg.exp_id, request.request_id)
        queue_timeout = cfg.limits.queue_timeout or math.inf
        return Job(
            request=request,
            step=step,
            session_id=in_session_of or session_id(cfg.exp_id, step, request.request_id),
            sig_key=sig_key,
            result_key=self._buffer.expect(request.request_id, step=step, sig_key=sig_key),
            timeout=cfg.limits.rollout_timeout if timeout is None else timeout,
            deadline=deadline,
            environment=environment,
            start_deadline=min(deadline, submitted + queue_timeout),
            submitted_at=submitted,
            on_start=on_start,
            prices=cfg.cost,
            verifier=verifier,
            in_session=in_session,
        )

    def _run(self, job: Job) -> RolloutHandle:
        """Run the job's life in a task the engine holds until it ends."""
        task = asyncio.create_task(self._runner.run(job))
        self._requests[task] = job
        self._running[job.step] += 1
        task.add_done_callback(self._ended)
        return RolloutHandle(
            task, job.request, lambda: self._runner.unresolved(job, asyncio.CancelledError())
        )

    def _ended(self, task: asyncio.Task[RolloutOutcome]) -> None:
        job = self._requests.pop(task)
        step = job.step
        self._warm_plan.request_ended(step, job.started_at)
        self._running[step] -= 1
        if not self._running[step]:
            del self._running[step]
            if step == self._step:  # the trainer's update begins: the next step is nearer
                self._warm_plan.ended(step)

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
