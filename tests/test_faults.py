"""The fault matrix, through the real wire: a part of the stack dies mid-run, and still every
request ends in exactly one outcome, within a bound, with nothing left running.

Each case kills or restarts a real process (the runtime emulator, moto, the gateway, a policy
worker) or shares a real queue between two engines."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentcore_rollout import (
    Outcome,
    RolloutEngine,
    RolloutOutcome,
    RolloutRequest,
    SandboxRuntime,
    SessionCallError,
)
from agentcore_rollout._aws import AwsClients
from agentcore_rollout._dispatch.dispatcher import PROBE_SESSION_PREFIX
from agentcore_rollout._dispatch.endpoints import retry_budget
from agentcore_rollout._results import inbox as _inbox
from agentcore_rollout.local.config import LocalConfig
from agentcore_rollout.local.moto import MotoServer, provision_results_channel
from agentcore_rollout.local.stack import LocalStack
from agentcore_rollout.runtimes.agentcore import AgentCoreRuntime
from agentcore_rollout.serving.process import ServiceProcess

from .agents.basic import expected_reward
from .conftest import RUNTIME_ARN, agent_env, engine_config
from .factories import flat_config

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent
MATH_ROWS = [
    json.loads(line)
    for line in (ROOT / "examples/math_agent/data/train.jsonl").read_text().splitlines()
    if line.strip()
]


def _requests(n: int, **fields: object) -> list[RolloutRequest]:
    return [RolloutRequest({"a": i, "b": 1, **fields}, input_id=f"q{i}") for i in range(n)]


async def _emulator_process(moto: MotoServer) -> ServiceProcess:
    """The runtime emulator as a process of its own (so it can be killed), its agents inside
    it, writing to `moto`."""
    emulator = ServiceProcess(
        "runtime emulator",
        "agentcore_rollout.local.runtime",
        "tests.agents.basic:app",
        *("--mode", "in_process", "--runtime-arn", RUNTIME_ARN),
        env=agent_env(moto),
    )
    await asyncio.to_thread(emulator.start)
    return emulator


def _alive(pid: int | None) -> bool:
    """Running (a zombie, killed but not yet reaped, is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


async def _collect(
    stream: AsyncIterator[RolloutOutcome], fault_after: int, fault
) -> tuple[list[RolloutOutcome], float]:
    """All outcomes of `stream`; `fault()` runs once `fault_after` have come back `ok`.
    Returns the outcomes and when the fault happened (monotonic)."""
    outcomes: list[RolloutOutcome] = []
    faulted_at = 0.0
    async for outcome in stream:
        outcomes.append(outcome)
        if not faulted_at and sum(o.outcome is Outcome.OK for o in outcomes) >= fault_after:
            await fault()
            faulted_at = time.monotonic()
    return outcomes, faulted_at


def _one_each(outcomes: list[RolloutOutcome], requests: list[RolloutRequest]) -> None:
    assert sorted(o.request.request_id for o in outcomes) == sorted(r.request_id for r in requests)
    assert all(isinstance(o.outcome, Outcome) for o in outcomes)


async def test_runtime_killed_fails_the_rest_fast_with_the_cause(moto, channel):
    emulator = await _emulator_process(moto)
    cfg = engine_config(
        moto,
        channel,
        emulator,
        start_rate=4.0,
        rollout_timeout=3.0,
        result_grace=0.5,
        reconcile_before=0.5,
        max_retries=8,
        backoff_base=0.05,
        backoff_max=0.5,
    )
    budget = retry_budget(cfg.dispatch)  # 2.75 s: what one request may spend retrying
    requests = _requests(40, sleep=0.2)

    async def kill() -> None:
        os.kill(emulator.pid, signal.SIGKILL)

    try:
        async with AwsClients(cfg) as clients:
            runtime = _Recording(
                AgentCoreRuntime(
                    await clients.agentcore_in(cfg.region, cfg.service_urls.agentcore), RUNTIME_ARN
                )
            )
            async with RolloutEngine(cfg, runtimes=[runtime]) as engine:
                outcomes, killed_at = await _collect(engine.stream(requests), 4, kill)
                ended_at = time.monotonic()
                stats = engine.stats()
    finally:
        await asyncio.to_thread(emulator.stop)
    _one_each(outcomes, requests)
    failed = [o for o in outcomes if o.outcome is Outcome.SUBMIT_FAILED]
    assert len(failed) >= 20  # at 4 starts/s most were still queued
    assert all("EndpointConnectionError" in (o.error or "") for o in failed), failed[0].error
    # Every request still open at the kill ends within 3x the retry budget: the queued ones
    # fail as soon as the runtime is declared down, the running ones at their own deadline.
    assert ended_at - killed_at < 3 * budget
    assert stats.runtime_down
    # A session whose every start attempt was refused (it never existed), or that was never
    # even tried once the runtime was declared down, is not stopped.
    never_started = {
        sid for sid, errors in runtime.invoked.items() if errors == {"EndpointConnectionError"}
    }
    assert never_started and not never_started & set(runtime.stopped)
    assert set(runtime.stopped) <= set(runtime.invoked) and len(runtime.invoked) < len(requests)


class _Recording(SandboxRuntime):
    """A `SandboxRuntime` that notes, per session, how its calls ended."""

    def __init__(self, runtime: SandboxRuntime) -> None:
        self._runtime = runtime
        self.name = runtime.name
        self.limits = runtime.limits
        self.invoked: dict[str, set[str]] = {}  # session -> error codes ("" for accepted)
        self.stopped: list[str] = []  # sessions, not the dispatcher's probes of an endpoint

    async def invoke(self, session_id: str, payload: bytes) -> None:
        codes = self.invoked.setdefault(session_id, set())
        try:
            await self._runtime.invoke(session_id, payload)
        except SessionCallError as e:
            codes.add(e.code)
            raise
        codes.add("")

    async def stop(self, session_id: str) -> None:
        if not session_id.startswith(PROBE_SESSION_PREFIX):
            self.stopped.append(session_id)
        await self._runtime.stop(session_id)


async def test_moto_restarted_mid_run_every_request_still_ends():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    moto = MotoServer(port=port)
    await asyncio.to_thread(moto.start)

    def provision() -> object:
        return provision_results_channel(
            moto.client("s3"), moto.client("sqs"), bucket="restart", prefix="rollouts", queue="rq"
        )

    channel = await asyncio.to_thread(provision)
    # Agents in a process of their own: their S3 clients must not outlive this moto.
    emu = await _emulator_process(moto)
    timeout, grace = 6.0, 1.0
    cfg = engine_config(
        moto, channel, emu, start_rate=4.0, rollout_timeout=timeout, result_grace=grace
    )
    requests = _requests(24, sleep=0.3)

    back: list[float] = []  # when the channel was back (epoch s, as started_at is)

    async def restart() -> None:  # state is lost, as a crash loses it; the channel comes back
        await asyncio.to_thread(moto.stop)
        await asyncio.to_thread(moto.start)
        await asyncio.to_thread(provision)
        back.append(time.time())

    try:
        async with RolloutEngine(cfg) as engine:
            outcomes, _ = await _collect(engine.stream(requests), 4, restart)
    finally:
        await asyncio.to_thread(emu.stop)
        await asyncio.to_thread(moto.stop)
    _one_each(outcomes, requests)
    ok = [o for o in outcomes if o.outcome is Outcome.OK]
    assert all(o.reward == expected_reward(o.request.payload) for o in ok)
    # Results written while moto was down are lost with its state (how many depends on how
    # long the restart took, so on the machine's load); every session started once the
    # channel was back ends ok.
    after = [o for o in outcomes if o.started_at is not None and o.started_at > back[0]]
    assert after and all(o.outcome is Outcome.OK for o in after), [o.error for o in after]
    assert len(ok) >= 4 + len(after)
    # Nothing waits past its own deadline plus the grace (plus a little for the stop).
    assert all(
        o.finished_at <= o.deadline + grace + 2.0 for o in outcomes if o.deadline is not None
    )


@pytest.fixture
async def math_stack(request) -> AsyncIterator[LocalStack]:
    """The local stack with the example math agent (in-process agents, to keep it light)."""
    workers = request.param
    name = f"faults-{workers}"
    config = LocalConfig(mode="in_process", policy_workers=workers, bucket=name, queue=name)
    stack = LocalStack(config)
    async with stack:
        yield stack
    children = [w.pid for w in stack.workers] + [stack.moto.pid]
    assert not any(_alive(pid) for pid in children)


def _math_requests(n: int) -> list[RolloutRequest]:
    return [
        RolloutRequest(row, input_id=row["id"], sample_index=k)
        for row in MATH_ROWS
        for k in range(n)
    ]


@pytest.mark.parametrize("math_stack", [1], indirect=True)
async def test_gateway_killed_no_ok_without_its_trace(math_stack):
    cfg = math_stack.engine_config(
        flat_config(exp_id="gw-kill", start_rate=6.0, rollout_timeout=20.0, result_grace=1.0)
    )
    requests = _math_requests(3)
    gateway_pid = math_stack.gateways[0].pid

    async def kill() -> None:
        os.kill(gateway_pid, signal.SIGKILL)

    async with RolloutEngine(cfg) as engine:
        outcomes, _ = await _collect(engine.stream(requests), 2, kill)
    _one_each(outcomes, requests)
    ok = [o for o in outcomes if o.outcome is Outcome.OK]
    assert ok and all(o.trace is not None and o.trace["samples"] for o in ok)
    lost = [o for o in outcomes if o.outcome is not Outcome.OK]
    assert lost, "the kill changed nothing"
    assert all(o.reward is None for o in lost)
    limits = cfg.limits
    assert all(o.latency < limits.rollout_timeout + limits.result_grace + 10 for o in outcomes)


@pytest.mark.parametrize("math_stack", [2], indirect=True)
async def test_policy_worker_killed_every_request_ends_and_ok_keeps_its_trace(math_stack):
    cfg = math_stack.engine_config(
        flat_config(exp_id="worker-kill", start_rate=6.0, rollout_timeout=20.0, result_grace=1.0)
    )
    requests = _math_requests(3)
    worker_pid = math_stack.workers[0].pid

    async def kill() -> None:
        os.kill(worker_pid, signal.SIGKILL)

    async with RolloutEngine(cfg) as engine:
        outcomes, _ = await _collect(engine.stream(requests), 2, kill)
    _one_each(outcomes, requests)
    ok = [o for o in outcomes if o.outcome is Outcome.OK]
    assert len(ok) >= 2 and all(o.trace is not None and o.trace["samples"] for o in ok)
    limits = cfg.limits
    assert all(o.latency < limits.rollout_timeout + limits.result_grace + 10 for o in outcomes)


async def test_two_engines_on_one_queue_with_different_exp_ids(
    moto, channel, emulator, monkeypatch
):
    monkeypatch.setattr(_inbox, "_FOREIGN_VISIBILITY", 0)  # the other's back at once, for it
    emu = await emulator()
    first, second = _requests(12, sleep=0.1), _requests(12, sleep=0.1)
    cfg_a = engine_config(moto, channel, emu, exp_id="exp-a")
    cfg_b = engine_config(moto, channel, emu, exp_id="exp-b")
    async with RolloutEngine(cfg_a) as a, RolloutEngine(cfg_b) as b:
        batch_a, batch_b = await asyncio.gather(a.rollout(first), b.rollout(second))
        released = a.stats().foreign_messages + b.stats().foreign_messages
    for batch in (batch_a, batch_b):
        assert batch.counts["ok"] == 12, [o.error for o in batch.outcomes]
        assert all(o.reward == expected_reward(o.request.payload) for o in batch.outcomes)
    assert released > 0  # they did see each other's notifications, and let them be
