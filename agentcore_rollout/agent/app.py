"""RolloutApp: the agent side of the contract, on top of bedrock-agentcore's app.

An invocation is acknowledged at once (`{"status": "accepted"}`) and the user's rollout runs
in the background, with `/ping` reporting HealthyBusy until it ends. Whatever the rollout
does (returns, raises, hangs past its deadline, gets cancelled), exactly one signed result
is written for the request.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bedrock_agentcore.runtime import BedrockAgentCoreApp
from pydantic import ValidationError
from starlette.exceptions import HTTPException

from .._engine.tracing import TRACEPARENT, child_span, current_headers, tracer
from ..contract import (
    ContractError,
    ErrorInfo,
    LLMSettings,
    Outcome,
    Rewards,
    RolloutControl,
    RolloutResult,
    Timings,
    check_json,
    first_error,
    is_warm_up,
    split_payload,
)
from .writer import ResultWriter

log = logging.getLogger("agentcore_rollout.agent")

_MAX_ERROR_CHARS = 2000


@dataclass(frozen=True)
class RolloutContext:
    """What a rollout function knows besides its payload. Not the signing key: the SDK signs
    the result itself, so the agent's own code never holds the key and cannot echo it."""

    exp_id: str
    step: int
    request_id: str
    input_id: str
    sample_index: int
    session_id: str
    deadline: float  # unix seconds
    llm: LLMSettings | None  # the policy to call; a result holding its api_key is refused too
    traceparent: str | None = None
    """The rollout's trace context (W3C), when the engine exports traces (OpenTelemetry)."""
    result_bucket: str = ""
    result_key: str = ""
    """Where its result goes: what it hands a verifier of its own goes beside it
    (`contract.artifacts_key`)."""

    @classmethod
    def of(cls, c: RolloutControl) -> RolloutContext:
        ids = (c.exp_id, c.step, c.request_id, c.input_id, c.sample_index, c.session_id)
        return cls(*ids, c.deadline, c.llm, c.traceparent, c.result.bucket, c.result.key)

    def time_left(self) -> float:
        return self.deadline - time.time()

    def trace_headers(self) -> dict[str, str]:
        """Headers for the agent's LLM client (`default_headers=`), so the gateway's turns
        join the rollout's trace: the current span's context when this process exports
        traces too, else the rollout's; none when the engine exports none."""
        if self.traceparent is None:
            return {}
        return current_headers() or {TRACEPARENT: self.traceparent}


@dataclass
class RolloutOutput:
    """What a rollout function returns (a dict with these keys works too)."""

    rewards: Rewards | None
    """None: no verdict of its own (an agent whose verifier runs in a session of its own)."""
    trajectory: dict[str, Any] | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    stop_reason: str | None = "done"


class VerifierError(Exception):
    """Raise it when what judges the rollout could not (its tests missing, crashing or out of
    time, no reward written): the rollout ends `verifier_error`, never a reward of 0, and no
    trainer trains it. The message (the verifier's last output, say) is the outcome's error."""


class AgentTimeout(Exception):
    """Raise it when the agent ran past a time limit of its own, shorter than the rollout's
    deadline: the rollout ends `timeout`, as one past its deadline does."""


RolloutFn = Callable[[dict[str, Any], RolloutContext], Awaitable[Any] | Any]


class RolloutApp(BedrockAgentCoreApp):
    """`app = RolloutApp()`, then decorate `async def rollout(payload, ctx)` with
    `@app.rollout_entrypoint`, and serve it like any AgentCore app (port 8080).

    Rollouts start (`_accept`) and end (their done callbacks) on the base app's worker loop,
    the one thread that changes `_tasks`, `_seen` and `_sessions`; a method other threads may
    call (`cancel_session`, `session_busy`) hands its work to that loop or only reads.
    """

    def __init__(self, *, writer: ResultWriter | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not self.debug:  # one line per task start/stop is noise at rollout scale
            self.logger.setLevel(logging.WARNING)
        self._fn: RolloutFn | None = None
        self._writer = writer or ResultWriter()
        self._tasks: dict[str, asyncio.Task[None]] = {}  # running; strong refs against GC
        self._seen: set[str] = set()  # every request_id accepted, to recognise retried invokes
        self._sessions: dict[str, set[str]] = {}  # session_id -> its running request_ids
        self._warmed: set[str] = set()  # sessions a warm-up invocation started
        self.entrypoint(self._accept)

    def rollout_entrypoint(self, fn: RolloutFn) -> RolloutFn:
        self._fn = fn
        return fn

    def session_busy(self, session_id: str) -> bool:
        """Callable from any thread: one atomic read, at worst a moment out of date."""
        return bool(self._sessions.get(session_id))

    def cancel_session(self, session_id: str) -> None:
        """Cancel a session's rollouts without writing results, as a stopped session would
        end. Callable from any thread: the cancellation runs on the worker loop, so the
        session's set is never iterated while a rollout starting or ending changes it."""
        if self._worker_loop is not None:  # None: no rollout was ever accepted
            self._worker_loop.call_soon_threadsafe(self._cancel_session, session_id)

    def _cancel_session(self, session_id: str) -> None:
        self._warmed.discard(session_id)
        for request_id in self._sessions.pop(session_id, ()):
            self._tasks[request_id].cancel()  # its done callback runs later, not in this loop

    async def _accept(self, payload: dict[str, Any], context: Any = None) -> dict[str, Any]:
        if self._fn is None:
            raise HTTPException(500, "no @rollout_entrypoint registered")
        if is_warm_up(payload):  # a session started ahead of its rollout: nothing to run yet
            self._warmed.add(str(getattr(context, "session_id", None)))
            return {"status": "accepted", "warm": True}
        try:
            user, control = split_payload(payload)
        except ContractError as e:
            raise HTTPException(400, str(e)) from None
        rid = control.request_id
        said = {"warm": True} if control.session_id in self._warmed else {}
        if rid in self._seen:  # a retried invoke whose first attempt did arrive
            return {"status": "accepted", "request_id": rid, "duplicate": True, **said}
        self._seen.add(rid)
        received = time.time()
        task_id = self.add_async_task("rollout", {"request_id": rid})
        running = self._sessions.setdefault(control.session_id, set())
        task = asyncio.create_task(self._run(user, control, received))
        self._tasks[rid] = task
        running.add(rid)

        def finished(_: asyncio.Task[None]) -> None:
            self.complete_async_task(task_id)
            self._tasks.pop(rid, None)
            running.discard(rid)
            if not running and self._sessions.get(control.session_id) is running:
                del self._sessions[control.session_id]

        task.add_done_callback(finished)
        return {"status": "accepted", "request_id": rid, **said}

    async def _run(self, user: dict[str, Any], control: RolloutControl, received: float) -> None:
        ctx = RolloutContext.of(control)
        started = time.time()
        work = asyncio.ensure_future(self._call(user, ctx))
        try:
            # Not wait_for: a rollout that swallows cancellation must not delay the result.
            done, _ = await asyncio.wait({work}, timeout=max(0.0, ctx.time_left()))
        except asyncio.CancelledError:
            work.cancel()
            return  # the session was stopped: like a killed microVM, nothing is written
        if not done:
            work.cancel()
        timings = Timings(received=received, started=started, finished=time.time())
        try:
            result = _build(control, _fields(work), timings)
        except Exception as e:  # output that breaks even being read, e.g. a raising __str__
            why = f"{type(e).__name__} while reading the rollout's output"
            result = _build(control, _invalid(why), timings)
        try:
            await self._writer.write(result, control)
        except Exception as e:  # S3 unreachable: the engine will report a timeout
            log.error(
                "no result written for request_id=%s: %s: %s",
                control.request_id,
                type(e).__name__,
                next(iter(str(e).splitlines()), ""),
            )

    async def _call(self, user: dict[str, Any], ctx: RolloutContext) -> Any:
        """The rollout function; when this process exports traces, in an `agent.rollout`
        span, the child of the rollout's, so the spans the agent makes join its trace."""
        spans = tracer("agentcore-rollout-agent") if ctx.traceparent is not None else None
        if spans is None:  # looked up per rollout: an agent may configure it after import
            return await self._call_fn(user, ctx)
        named = {"rollout.request_id": ctx.request_id, "rollout.session_id": ctx.session_id}
        with child_span(spans, "agent.rollout", ctx.traceparent, named):
            return await self._call_fn(user, ctx)

    async def _call_fn(self, user: dict[str, Any], ctx: RolloutContext) -> Any:
        assert self._fn is not None
        if inspect.iscoroutinefunction(self._fn):
            return await self._fn(user, ctx)
        return await asyncio.to_thread(self._fn, user, ctx)


def _fields(work: asyncio.Future[Any]) -> dict[str, Any]:
    """The result fields for how `work` ended: past its deadline (the watchdog has just asked
    it to cancel, so it is not done yet), cancelled by itself, raised, or returned."""
    if not work.done():
        return _failure(
            Outcome.TIMEOUT, "deadline", "DeadlineExceeded", "rollout ran past its deadline"
        )
    if work.cancelled():
        return _failure(
            Outcome.CANCELLED, "cancelled", "CancelledError", "rollout cancelled itself"
        )
    if isinstance(e := work.exception(), VerifierError):
        return _failure(Outcome.VERIFIER_ERROR, "verifier_error", "VerifierError", str(e))
    if isinstance(e, AgentTimeout):
        return _failure(Outcome.TIMEOUT, "agent_timeout", "AgentTimeout", str(e))
    if e is not None:
        return _failure(Outcome.AGENT_ERROR, "error", type(e).__name__, str(e))
    return _output_fields(work.result())


def _output_fields(output: Any) -> dict[str, Any]:
    if isinstance(output, RolloutOutput):
        output = dict(vars(output))  # shallow: a trajectory can be large
    if not isinstance(output, Mapping) or "rewards" not in output:
        return _invalid("rollout must return RolloutOutput or a dict with 'rewards'")
    if unknown := set(output) - {"rewards", "trajectory", "metrics", "stop_reason"}:
        return _invalid(f"unknown output keys {sorted(unknown)}")
    return {"status": Outcome.OK, "stop_reason": "done", **output}


def _failure(status: Outcome, stop_reason: str, type_: str, message: str) -> dict[str, Any]:
    # An exception's message may hold a lone surrogate, which no UTF-8 result can carry.
    message = message[:_MAX_ERROR_CHARS].encode("utf-8", "backslashreplace").decode()
    error = ErrorInfo(type=type_, message=message)
    return {"status": status, "stop_reason": stop_reason, "error": error}


def _invalid(why: str) -> dict[str, Any]:
    return _failure(Outcome.AGENT_ERROR, "error", "InvalidOutput", why)


def _build(control: RolloutControl, fields: dict[str, Any], timings: Timings) -> RolloutResult:
    ids = ("exp_id", "step", "request_id", "input_id", "session_id")
    base = {name: getattr(control, name) for name in ids} | {"timings": timings}
    try:
        # Numbers first, so a NaN reward reads `rewards: non-finite number nan`, not pydantic's
        # error for each branch of the Rewards union. The trajectory is the writer's to check.
        check_json({k: v for k, v in fields.items() if k in ("rewards", "metrics")})
        return RolloutResult.model_validate({**base, **fields})
    except ContractError as e:
        why = str(e)
    except ValidationError as e:
        why = first_error(e)
    return RolloutResult.model_validate({**base, **_invalid(why)})
