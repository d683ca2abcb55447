"""The AgentCore Runtime emulator through the unmodified aiobotocore client: wire protocol,
error types, cold start (once, on a session's first invocation), idle timeout (judged by the
agent's ping), max lifetime, a stop racing an invocation."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import time

import aiohttp
import pytest
from aiobotocore.session import get_session
from botocore.config import Config
from botocore.exceptions import ClientError

from agentcore_rollout import Outcome, RolloutEngine, RolloutRequest
from agentcore_rollout.contract import CONTROL_KEY

from .conftest import RUNTIME_ARN, engine_config

pytestmark = pytest.mark.component


def _payload(channel, rid: str, sid: str, deadline: float, **user) -> bytes:
    control = {
        "exp_id": "exp1",
        "step": 0,
        "request_id": rid,
        "input_id": "g",
        "sample_index": 0,
        "session_id": sid,
        "result": {"bucket": channel.bucket, "key": f"rollouts/exp1/00000000/{rid}.json"},
        "deadline": deadline,
        "sig_key": "k" * 32,
    }
    return json.dumps({"a": 1, "b": 2, **user, CONTROL_KEY: control}).encode()


@pytest.fixture
async def client(emulator):
    emu = await emulator(idle_timeout=0.5, max_lifetime=2.0)
    cfg = Config(retries={"total_max_attempts": 1})
    async with get_session().create_client(
        "bedrock-agentcore", region_name="us-east-1", endpoint_url=emu.url, config=cfg
    ) as c:
        yield emu, c


async def test_invoke_reply_headers_and_errors(client, channel):
    emu, c = client
    sid = "s" * 40
    resp = await c.invoke_agent_runtime(
        agentRuntimeArn=RUNTIME_ARN,
        runtimeSessionId=sid,
        payload=_payload(channel, "r1", sid, time.time() + 30, mode="hang"),  # alive until stopped
    )
    assert resp["runtimeSessionId"] == sid
    assert json.loads(await resp["response"].read()) == {"status": "accepted", "request_id": "r1"}
    again = await c.invoke_agent_runtime(
        agentRuntimeArn=RUNTIME_ARN,
        runtimeSessionId=sid,
        payload=_payload(channel, "r1", sid, time.time() + 30, mode="hang"),
    )
    assert json.loads(await again["response"].read())["duplicate"] is True  # a retried invoke
    with pytest.raises(ClientError) as bad:
        await c.invoke_agent_runtime(
            agentRuntimeArn=RUNTIME_ARN, runtimeSessionId="t" * 40, payload=b'{"no": 1}'
        )
    assert bad.value.response["Error"]["Code"] == "RuntimeClientError"
    assert "_rollout" in bad.value.response["Error"]["Message"]
    with pytest.raises(ClientError) as missing:
        await c.stop_runtime_session(agentRuntimeArn=RUNTIME_ARN, runtimeSessionId="u" * 40)
    assert missing.value.response["Error"]["Code"] == "ResourceNotFoundException"
    await c.stop_runtime_session(agentRuntimeArn=RUNTIME_ARN, runtimeSessionId=sid)
    assert emu.sessions.stopped == [sid]


async def _until(predicate, guard: float = 60.0) -> float:
    """Poll `predicate` (sync or async) until true; the wall time then. `guard` bounds a hang."""
    give_up = time.monotonic() + guard
    while not (await r if inspect.isawaitable(r := predicate()) else r):
        assert time.monotonic() < give_up, "condition never met"
        await asyncio.sleep(0.02)
    return time.time()


def _gone(emu, sid: str):
    return _until(lambda: sid not in emu.sessions)


async def test_in_process_sessions_end_idle_or_at_their_max_lifetime(client, channel):
    emu, c = client  # idle_timeout 0.5 s, max_lifetime 2 s; a RolloutApp says busy per session
    idle, busy = "i" * 40, "b" * 40
    for sid, mode in ((idle, "ok"), (busy, "hang")):
        await c.invoke_agent_runtime(
            agentRuntimeArn=RUNTIME_ARN,
            runtimeSessionId=sid,
            payload=_payload(channel, sid[:8], sid, time.time() + 60, mode=mode),
        )
    sessions = dict(emu.sessions)  # a snapshot: an ended session leaves emu.sessions
    await _gone(emu, idle)
    assert busy in emu.sessions  # the busy one is kept alive past the idle timeout
    await _gone(emu, busy)
    assert [sessions[idle].ended, sessions[busy].ended] == ["idle timeout", "max lifetime"]
    assert emu.sessions.expired == [idle, busy] and emu.sessions.live.value == 0


async def test_a_new_session_waits_out_its_cold_start_on_its_first_invocation_only(
    emulator, channel
):
    """`cold_start` is added once, to the invocation that creates the session, before it
    reaches the agent; the session's next invocation is answered without it."""
    emu = await emulator(cold_start=0.6)
    cfg = Config(retries={"total_max_attempts": 1})
    sid = "c" * 40
    async with get_session().create_client(
        "bedrock-agentcore", region_name="us-east-1", endpoint_url=emu.url, config=cfg
    ) as c:
        took = []
        for rid in ("r1", "r2"):
            began = time.monotonic()
            resp = await c.invoke_agent_runtime(
                agentRuntimeArn=RUNTIME_ARN,
                runtimeSessionId=sid,
                payload=_payload(channel, rid, sid, time.time() + 30),
            )
            assert json.loads(await resp["response"].read())["status"] == "accepted"
            took.append(time.monotonic() - began)
    assert took[0] >= 0.6 and took[1] < 0.6, took
    assert emu.sessions.started == [sid]  # one session, created once


def _control(channel, rid: str, sid: str) -> dict:
    return json.loads(_payload(channel, rid, sid, time.time() + 120))[CONTROL_KEY]


@pytest.fixture
async def background(emulator):
    """`emu, client = await background(**config)`: an emulator whose sessions run the
    RL-Toolkit-style agent, one process each, and an unmodified aiobotocore client."""
    async with contextlib.AsyncExitStack() as stack:

        async def make(**overrides):
            emu = await emulator(app="tests.agents.background:app", mode="process", **overrides)
            cfg = Config(retries={"total_max_attempts": 1})
            c = await stack.enter_async_context(
                get_session().create_client(
                    "bedrock-agentcore", region_name="us-east-1", endpoint_url=emu.url, config=cfg
                )
            )
            return emu, c

        yield make


async def _invoke(c, channel, sid: str, **user) -> dict:
    payload = {**user, CONTROL_KEY: _control(channel, sid[:8], sid)}
    resp = await c.invoke_agent_runtime(
        agentRuntimeArn=RUNTIME_ARN, runtimeSessionId=sid, payload=json.dumps(payload).encode()
    )
    return json.loads(await resp["response"].read())


@pytest.mark.e2e  # waits out real idle timeouts and lifetimes (no injectable clock yet)
async def test_busy_in_the_background_counts_until_ping_says_idle_and_lifetime_caps_it(
    background, channel, moto
):
    """The agent acknowledges at once and says HealthyBusy while it works: the idle timeout
    counts from when its work ended, never from the invocation; the max lifetime ends a session
    busy or not."""
    emu, c = await background(idle_timeout=1.0, max_lifetime=12.0)
    worker, forever = "w" * 40, "f" * 40
    started = time.time()
    for sid, work in ((worker, 3.0), (forever, 600.0)):
        assert (await _invoke(c, channel, sid, work=work))["status"] == "accepted"
    sessions = dict(emu.sessions)  # a snapshot: an ended session leaves emu.sessions
    ended = await _gone(emu, worker)
    key = _control(channel, worker[:8], worker)["result"]["key"]
    written = moto.client("s3").get_object(Bucket=channel.bucket, Key=key)["Body"].read()
    finished = json.loads(written)["timings"]["finished"]  # its work was not cut short
    assert finished - started >= 3.0 and ended - finished >= 1.0  # idle counted from there
    assert sessions[worker].ended == "idle timeout" and forever in emu.sessions
    ended = await _gone(emu, forever)
    assert sessions[forever].ended == "max lifetime" and ended - started >= 12.0
    assert emu.sessions.expired == [worker, forever]


@pytest.mark.e2e  # waits out real idle timeouts and lifetimes (no injectable clock yet)
async def test_rollouts_working_past_a_short_idle_timeout_end_ok(moto, channel, emulator):
    """Issue 19's case: 12 concurrent RL-Toolkit-style agents, each busy 5 s in the background
    after acknowledging, under a 2 s idle timeout and 4 data-plane calls/s: all `ok`, none
    expired."""
    emu = await emulator(
        app="tests.agents.background:app", mode="process", idle_timeout=2.0, data_plane_tps=4
    )
    reqs = [RolloutRequest({"work": 5.0, "reward": i / 10}, input_id=f"q{i}") for i in range(12)]
    cfg = engine_config(moto, channel, emu, rollout_timeout=90.0, max_retries=60)
    async with RolloutEngine(cfg) as engine:
        batch = await engine.rollout(reqs)
    assert [(o.outcome, o.reward) for o in batch.outcomes] == [
        (Outcome.OK, i / 10) for i in range(12)
    ]
    assert all(o.result.timings.finished - o.result.timings.received >= 5.0 for o in batch.outcomes)
    assert emu.counts["ThrottlingException"] > 0  # the starts were spread by the rate limit
    sessions = emu.sessions
    assert sessions.expired == [] and sorted(sessions.stopped) == sorted(sessions.started)
    assert len(emu.sessions.started) == 12


@pytest.mark.e2e  # waits out real idle timeouts and lifetimes (no injectable clock yet)
async def test_an_invocation_meeting_a_session_ending_gets_a_modelled_error(background, channel):
    """A stop racing an invocation: one that has not reached the agent is a retryable conflict
    (the retry gets a new session), one the agent holds says the session ended under it;
    never how the socket to a dying agent broke ("Can not write request body")."""
    emu, c = await background(cold_start=1.0, idle_timeout=60.0)
    early, held = "e" * 40, "h" * 40
    pending = asyncio.create_task(_invoke(c, channel, early))
    await _until(lambda: early in emu.sessions)  # attached, its agent still starting
    await c.stop_runtime_session(agentRuntimeArn=RUNTIME_ARN, runtimeSessionId=early)
    with pytest.raises(ClientError) as conflict:
        await pending
    error = conflict.value.response["Error"]
    assert error["Code"] == "RetryableConflictException" and "(stopped)" in error["Message"]
    assert (await _invoke(c, channel, early))["status"] == "accepted"  # the retry: a new session
    assert emu.sessions.started == [early, early]

    pending = asyncio.create_task(_invoke(c, channel, held, hold=60.0))
    await _until(lambda: _pings_busy(emu, held))  # the agent holds it
    await c.stop_runtime_session(agentRuntimeArn=RUNTIME_ARN, runtimeSessionId=held)
    with pytest.raises(ClientError) as cut:
        await pending
    error = cut.value.response["Error"]
    assert error["Code"] == "RuntimeClientError"
    assert error["Message"] == "session ended (stopped) during the invocation"


async def _pings_busy(emu, sid: str) -> bool:
    session = emu.sessions.get(sid)
    if session is None or not session.ready.is_set():
        return False
    async with aiohttp.ClientSession() as http:
        return await session.agent.busy(http)


async def test_a_start_waits_longer_while_more_agents_start_than_there_are_cores():
    """An agent that never answers `/ping`: alone, it has the timeout; with four times the
    cores starting at once, four times that, and the message says so and names the setting."""
    import os

    from agentcore_rollout.local.agents import ProcessAgent, ready_bound

    cores = max(1, os.cpu_count() or 1)
    assert ready_bound(60, 1) == ready_bound(60, cores) == 60
    assert ready_bound(60, 32) == 60 * max(1.0, 32 / cores)
    async with aiohttp.ClientSession() as http:
        for starting, bound in ((1, 0.3), (4 * cores, 1.2)):
            process = await asyncio.create_subprocess_exec("sleep", "30", start_new_session=True)
            agent = ProcessAgent(process, "http://127.0.0.1:1")  # nothing answers there
            began = time.monotonic()
            with pytest.raises(RuntimeError) as info:
                await agent.wait_ready(
                    http, 0.3, starting=lambda n=starting: n, setting="agent_ready_timeout"
                )
            assert bound <= time.monotonic() - began < bound + 1
            assert not agent.alive()  # terminated at the bound
            said = str(info.value)
            assert said.startswith(f"agent not healthy within {bound:.0f}s (GET /ping)")
            assert ("agents were starting at once" in said) == (starting > 1)
            assert said.endswith(
                "(agent_ready_timeout sets 0.3s a start, scaled by the starts per core)"
            )
