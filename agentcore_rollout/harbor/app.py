"""The agent wrapper: a RolloutApp inside the task's environment, serving one Harbor task per
rollout: the agent's invocation, then the verifier's (`verifier`).

The tests travel in the verifier's payload and reach the filesystem only then. The image's
record (`trusted`) is read once, here, before any agent runs, and the wrapper makes itself
undumpable before it starts one, so an agent, root or not, cannot read or write its memory or
environment. The steps of a rollout: docs/harbor.md#one-rollout."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..agent import AgentTimeout, RolloutApp, RolloutContext, RolloutOutput, VerifierError
from ..agent.allowlist import agent_env
from ..contract import AGENT_ARTIFACTS_KEY, ARTIFACTS_KEY, agent_request_id, artifacts_key
from . import artifacts, trusted
from ._process import Ran, RunAs, kill_all_but_this, run_group, seal, user_named
from .agents import AGENT_ENV, ENVIRONMENT_ENV, AgentRun, HarborAgent, agent_named
from .tasks import write_files
from .verifier import verify

app = RolloutApp()

WORKDIR = Path.cwd()
"""The image's WORKDIR, the task's working directory: the wrapper starts there (the layer
keeps it) and runs the agent and the tests there."""
SOLUTION_DIR = Path("/solution")
AGENT_LOG = Path("/logs/agent/output.txt")
MARGIN = 5.0
"""Seconds kept back from the rollout's deadline besides the verifier's timeout: the result
must still be written once the tests are done."""
TRUSTED = trusted.load()
"""The image's record, read as the wrapper starts, before any agent (None: an image built
before records were)."""


@app.rollout_entrypoint
async def rollout(payload: dict[str, Any], ctx: RolloutContext) -> RolloutOutput:
    """The agent's invocation, then (`phase: verify`) the verifier's: in this session once the
    agent is gone, or in a session of the verifier's environment."""
    seal()  # before any agent: its processes cannot read or write this one's memory
    if payload.get("phase") == "verify":
        return await _verify(payload, ctx)
    agent = _image_agent(payload)
    ran = await _run_agent(agent, payload, ctx, task_env(os.environ, payload))
    _agents_ran.add(ctx.request_id)
    if payload.get("verifier_mode") == "separate":
        return await _hand_over(payload, ctx, agent, ran)
    return RolloutOutput(
        rewards=None,  # the verifier's invocation brings the tests and the verdict
        trajectory={"agent": agent.name, "agent_output": ran.tail},
        metrics={"agent_seconds": ran.seconds, "agent_exit": float(ran.exit_code or 0)},
    )


_agents_ran: set[str] = set()
"""The request ids whose agent ran in this session: a verifier invoked again here checks its
agent's is one (a session that ended and was made anew under its id holds none of its work)."""


async def _verify(payload: dict[str, Any], ctx: RolloutContext) -> RolloutOutput:
    """The tests, run where the agent's work is: here, after every process but this one is
    gone, or (given the agent's artifacts) in a session of their own, once those are in place."""
    user = _user(payload.get("verifier_user"), "[verifier]", VerifierError)
    if AGENT_ARTIFACTS_KEY in payload:
        _check_environment(payload)
        body = await artifacts.fetch(payload[AGENT_ARTIFACTS_KEY])
        placed = await asyncio.to_thread(artifacts.unpack, body, payload.get("artifacts") or [])
        extra = {"artifact_files": float(len(placed))}
    elif agent_request_id(ctx.request_id) not in _agents_ran:
        raise VerifierError("the agent's session is gone: this session holds none of its work")
    else:
        started = time.monotonic()
        killed = await kill_all_but_this()
        extra = {"killed_processes": float(killed), "kill_seconds": time.monotonic() - started}
    verdict = await verify(
        payload.get("tests") or [],
        float(payload["verifier_timeout"]),
        {**task_env(os.environ, payload), **_as(user), **(payload.get("verifier_env") or {})},
        _workdir(payload, VerifierError),
        user=user,
        trusted=TRUSTED,
    )
    return RolloutOutput(
        rewards=verdict.rewards,
        trajectory={
            "verifier_output": verdict.output,
            "verifier_exit": verdict.exit_code,
            "verifier_trust": verdict.trust,
        },
        metrics={
            "verifier_seconds": verdict.seconds,
            "trust_check_seconds": verdict.check_seconds,
            **extra,
        },
    )


async def _hand_over(
    payload: dict[str, Any], ctx: RolloutContext, agent: HarborAgent, ran: Ran
) -> RolloutOutput:
    """The agent's session of a task with a separate verifier: its artifacts put beside the
    result, their digest in the result (which the SDK signs), no verdict of its own."""
    body = await asyncio.to_thread(artifacts.pack, payload.get("artifacts") or [])
    key = artifacts_key(ctx.result_key)
    await artifacts.put(ctx.result_bucket, key, body)
    handed = {"bucket": ctx.result_bucket, "key": key, "sha256": artifacts.digest(body)}
    return RolloutOutput(
        rewards=None,
        trajectory={
            "agent": agent.name,
            "agent_output": ran.tail,
            ARTIFACTS_KEY: handed | {"bytes": len(body)},
        },
        metrics={"agent_seconds": ran.seconds, "agent_exit": float(ran.exit_code or 0)},
    )


async def _run_agent(
    agent: HarborAgent, payload: dict[str, Any], ctx: RolloutContext, env: dict[str, str]
) -> Ran:
    """The agent, as `[agent] user`, from start to the end of its process group, within its
    time; past it, `AgentTimeout`."""
    bound = min(float(payload["agent_timeout"]), _time_for_agent(payload, ctx))
    user = _user(payload.get("agent_user"), "[agent]", ValueError)
    workdir = _workdir(payload, ValueError)
    if agent.needs_solution:
        _write_solution(payload.get("solution") or [])
    with tempfile.TemporaryDirectory(prefix="agent-home-", ignore_cleanup_errors=True) as home:
        if user is not None:
            os.chown(home, user.uid, user.gid)
            env = {**env, "USER": user.name, "LOGNAME": user.name}
        run = AgentRun(
            instruction=payload["instruction"],
            llm=ctx.llm,
            workdir=workdir,
            home=Path(home),
            solution=SOLUTION_DIR,
            solution_env=dict(payload.get("solution_env") or {}),
            llm_headers=ctx.trace_headers(),
        )
        launch = agent.launch(run)
        ran = await run_group(
            launch.argv,
            cwd=workdir,
            env={**env, "HOME": home, **launch.env},
            timeout=bound,
            output=AGENT_LOG,
            user=user,
        )
    if ran.exit_code is None:
        why = f"agent {agent.name} ran past its {bound:g}s limit: its process group was killed"
        raise AgentTimeout(f"{why}; its output ended:\n{ran.tail[-1500:]}")
    return ran


def _user(name: Any, where: str, error: type[Exception]) -> RunAs | None:
    """The task's user for a phase; one the image lacks is one line (`error`)."""
    try:
        return user_named(None if name is None else str(name))
    except LookupError as e:
        raise error(f"{where} user: {e}") from None


def _as(user: RunAs | None) -> dict[str, str]:
    """The variables naming `user` (none for root)."""
    if user is None:
        return {}
    return {"USER": user.name, "LOGNAME": user.name, "HOME": user.home or "/"}


def _workdir(payload: dict[str, Any], error: type[Exception]) -> Path:
    """`[environment] workdir`, else the image's WORKDIR: a folder of the image."""
    if not payload.get("workdir"):
        return WORKDIR
    workdir = Path(str(payload["workdir"]))
    if not workdir.is_absolute() or not workdir.is_dir():
        raise error(f"[environment] workdir {str(workdir)!r} is not a folder of the task's image")
    return workdir


def _image_agent(payload: dict[str, Any]) -> HarborAgent:
    """The image's agent, once the payload is checked to be a task of the image's environment."""
    needed = ("instruction", "agent_timeout")
    if missing := [k for k in needed if k not in payload]:
        raise ValueError(f"not a Harbor task payload: no {', '.join(missing)}")
    _check_environment(payload)
    if AGENT_ENV not in os.environ:
        raise ValueError(f"no agent named in this image (${AGENT_ENV} is not set)")
    return agent_named(os.environ[AGENT_ENV])


def _check_environment(payload: dict[str, Any]) -> None:
    serves = os.environ.get(ENVIRONMENT_ENV)
    if serves and payload.get("environment") != serves:
        raise ValueError(
            f"task {payload.get('id')!r} is of environment {payload.get('environment')!r}, "
            f"this image serves {serves!r}"
        )


def _write_solution(files: list[dict[str, Any]]) -> None:
    shutil.rmtree(SOLUTION_DIR, ignore_errors=True)
    SOLUTION_DIR.mkdir(parents=True)
    write_files(files, SOLUTION_DIR)


def _time_for_agent(payload: dict[str, Any], ctx: RolloutContext) -> float:
    left = ctx.time_left() - float(payload.get("verifier_timeout", 0)) - MARGIN
    if left <= 0:
        raise AgentTimeout(
            f"no time for the agent: {ctx.time_left():.0f}s left before the deadline, the "
            f"verifier takes up to {payload['verifier_timeout']}s"
        )
    return left


def task_env(
    environ: Mapping[str, str], payload: Mapping[str, Any] | None = None
) -> dict[str, str]:
    """The environment the agent and the tests start from (`allowlist.agent_env`): the
    image's recorded ENV, the session's basics, TLS trust and credential-free proxies, and
    the task's `[environment] env`. The TLS trust variables (`NODE_EXTRA_CA_CERTS`, ...) stay:
    the gateway's CA is the agent's."""
    image = TRUSTED.env if TRUSTED is not None else None
    return agent_env(environ, image, (payload or {}).get("environment_env") or {})
