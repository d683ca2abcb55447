"""What the engine relies on of a `SandboxRuntime`, checked against a real agent and real S3
(moto): any runtime runs it.

A test module subclasses `RuntimeConformance` and gives it four fixtures:

- `runtime`: a runtime whose sessions serve `tests.agents.basic:app`, writing their results
  with the endpoints of the `moto` fixture; closed after the test;
- `make_runtime`: `make_runtime(name=...)` makes more such runtimes (closed after the test);
- `broken_runtime`: one whose sessions cannot start (an image that is not there, an app that
  fails at once);
- `leftovers`: an async callable naming what this test's runtimes left running (containers,
  processes); none once every session is stopped or refused.

imports the `results` fixture from here, and says whether each session is a process of its
own (`one_process_per_session`, as AgentCore's microVMs are; False where one app serves every
session). The last check runs a batch through `RolloutEngine(config, runtimes=[runtime])`.
`tests/runtimes/test_inprocess.py` and `test_containers.py` are examples.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from agentcore_rollout import Outcome, RolloutEngine, RolloutRequest
from agentcore_rollout.contract import (
    CONTROL_KEY,
    WARM_UP_PAYLOAD,
    ResultTarget,
    RolloutControl,
    RolloutResult,
    decode_result,
    result_key,
    session_id,
    verify_result,
)
from agentcore_rollout.local.moto import MotoServer, ResultsChannel
from agentcore_rollout.runtimes import RuntimeLimits, SandboxRuntime, SessionCallError

from ..agents.basic import expected_reward
from ..conftest import REGION
from ..factories import flat_config

EXP = "conformance"
SIG_KEY = "c" * 64
RESULT_BOUND = 120.0
"""Seconds a result may take to arrive: a bound for a broken runtime, not a figure checked."""
STOP_AFTER = 10.0
"""A rollout left running writes its result this long after its invocation; its stop comes
well before (a warm session's invocation takes milliseconds)."""

Leftovers = Callable[[], Awaitable[list[str]]]


class Results:
    """Invocations of `tests.agents.basic:app`, and their results as the agent wrote them.
    Requests are named by the test (`r1`), their ids unique: an app serving many tests takes
    an id it has seen for a retry of that request, and starts nothing."""

    def __init__(self, moto: MotoServer, channel: ResultsChannel) -> None:
        self._s3 = moto.client("s3")
        self._channel = channel
        self._run = uuid.uuid4().hex[:12]

    def session(self) -> str:
        return session_id(EXP, 0, uuid.uuid4().hex)

    def payload(self, session: str, request_id: str, timeout: float = 60.0, **user: Any) -> bytes:
        """The invocation of one rollout of `session`, its deadline `timeout` from now."""
        request_id = self._id(request_id)
        control = RolloutControl(
            exp_id=EXP,
            step=0,
            request_id=request_id,
            input_id="conformance",
            sample_index=0,
            session_id=session,
            result=ResultTarget(bucket=self._channel.bucket, key=self._key(request_id)),
            deadline=time.time() + timeout,
            sig_key=SIG_KEY,
        )
        return json.dumps({**user, CONTROL_KEY: control.model_dump(mode="json")}).encode()

    async def get(self, request_id: str, bound: float = RESULT_BOUND) -> RolloutResult:
        """The request's result, verified, once written (failing after `bound` seconds)."""
        give_up = time.monotonic() + bound
        while (body := await self.find(request_id)) is None:
            assert time.monotonic() < give_up, f"no result for {request_id} in {bound:g}s"
            await asyncio.sleep(0.2)
        result = decode_result(body)
        verify_result(result, SIG_KEY)
        return result

    async def find(self, request_id: str) -> bytes | None:
        """The result's bytes if it is there now."""
        key = self._key(self._id(request_id))
        try:
            reply = await asyncio.to_thread(
                self._s3.get_object, Bucket=self._channel.bucket, Key=key
            )
        except self._s3.exceptions.NoSuchKey:
            return None
        return await asyncio.to_thread(reply["Body"].read)

    def _id(self, name: str) -> str:
        return f"{name}-{self._run}"

    def _key(self, request_id: str) -> str:
        return result_key(self._channel.prefix, EXP, 0, request_id)


@pytest.fixture
def results(moto: MotoServer, channel: ResultsChannel) -> Results:
    """Rollouts of the basic agent whose results go to a bucket of this test's own."""
    return Results(moto, channel)


class RuntimeConformance:
    """The checks. Subclass it in a test module that provides the fixtures above."""

    one_process_per_session = True

    async def test_a_session_starts_and_its_agent_accepts(
        self, runtime: SandboxRuntime, results: Results, leftovers: Leftovers
    ) -> None:
        sid = results.session()
        reply = await runtime.invoke(sid, results.payload(sid, "r1", a=3, b=4))
        assert reply is None or reply["status"] == "accepted"  # None: a runtime reading none
        result = await results.get("r1")
        assert (result.status, result.session_id) == ("ok", sid)
        assert result.rewards == expected_reward({"a": 3, "b": 4})
        await runtime.stop(sid)
        assert await leftovers() == []

    async def test_a_second_invoke_reaches_the_same_session(
        self, runtime: SandboxRuntime, results: Results
    ) -> None:
        """The agent tells which process ran a rollout: the same for a session's two, another
        for another session's where each session is a process of its own."""
        first, other = results.session(), results.session()
        await runtime.invoke(first, results.payload(first, "r1", mode="instance"))
        await runtime.invoke(first, results.payload(first, "r2", mode="instance"))
        await runtime.invoke(other, results.payload(other, "r3", mode="instance"))
        r1, r2, r3 = [await results.get(r) for r in ("r1", "r2", "r3")]
        assert r1.trajectory == r2.trajectory
        apart = r3.trajectory != r1.trajectory
        assert apart == self.one_process_per_session, (r1.trajectory, r3.trajectory)
        for sid in (first, other):
            await runtime.stop(sid)

    async def test_a_warmed_up_session_runs_its_rollout_where_it_warmed_up(
        self, runtime: SandboxRuntime, results: Results
    ) -> None:
        """The engine's warm sessions: the warm-up starts the session and nothing else, the
        rollout that follows says it found the session warm (the agent saw one session id
        both times). A runtime that reads no reply returns None: a cold start, not a
        failure."""
        sid = results.session()
        warmed = await runtime.invoke(sid, WARM_UP_PAYLOAD)
        reply = await runtime.invoke(sid, results.payload(sid, "r1", mode="instance"))
        if warmed is not None:
            assert warmed["warm"] is True
            assert reply is not None and reply.get("warm") is True, reply
        assert (await results.get("r1")).status == "ok"
        await runtime.stop(sid)

    async def test_stop_ends_a_session_and_leaves_the_others(
        self, runtime: SandboxRuntime, results: Results, leftovers: Leftovers
    ) -> None:
        """Two sessions each run a rollout that hangs until its deadline, when the agent writes
        a `timeout` result. The one stopped writes none; the other's comes, after the time
        the stopped one's would have."""
        stopped, kept = results.session(), results.session()
        for sid in (stopped, kept):  # started, so that their invocations below are quick
            await runtime.invoke(sid, results.payload(sid, f"warm-{sid}", mode="instance"))
        await runtime.invoke(
            kept, results.payload(kept, "kept", timeout=STOP_AFTER + 3, mode="hang")
        )
        invoked = time.time()
        await runtime.invoke(stopped, results.payload(stopped, "stopped", STOP_AFTER, mode="hang"))
        await runtime.stop(stopped)
        if time.time() - invoked > STOP_AFTER - 1:
            pytest.skip("invoking and stopping a warm session took seconds: nothing seen")
        await runtime.stop(stopped)  # again: not an error
        assert (await results.get("kept")).status == "timeout"
        assert await results.find("stopped") is None
        await runtime.stop(kept)
        assert await leftovers() == []

    async def test_stopping_an_unknown_session_is_not_an_error(
        self, runtime: SandboxRuntime, results: Results
    ) -> None:
        await runtime.stop(results.session())

    async def test_a_payload_the_agent_refuses_fails_for_good(
        self, runtime: SandboxRuntime, results: Results, leftovers: Leftovers
    ) -> None:
        """No control block: the agent answers 400. Its session exists (the agent answered),
        so the error says it may have started, and a stop ends it."""
        sid = results.session()
        with pytest.raises(SessionCallError) as raised:
            await runtime.invoke(sid, json.dumps({"a": 1}).encode())
        assert not raised.value.retryable
        assert raised.value.maybe_started
        await runtime.stop(sid)
        assert await leftovers() == []

    async def test_a_session_that_cannot_start_fails_as_a_session_call_error(
        self, broken_runtime: SandboxRuntime, results: Results, leftovers: Leftovers
    ) -> None:
        """Not retryable (trying again fails the same way). Whether it may have started says
        whether a stop is needed: if not, nothing is left; if so, the stop leaves nothing."""
        sid = results.session()
        with pytest.raises(SessionCallError) as raised:
            await broken_runtime.invoke(sid, results.payload(sid, "r1"))
        assert not raised.value.retryable and raised.value.code
        if raised.value.maybe_started:
            await broken_runtime.stop(sid)
        assert await leftovers() == []

    async def test_the_engine_runs_a_batch_on_it(
        self,
        runtime: SandboxRuntime,
        moto: MotoServer,
        channel: ResultsChannel,
        leftovers: Leftovers,
    ) -> None:
        """`RolloutEngine(config, runtimes=[runtime])`, no AgentCore in the config, the limits
        the runtime reports in force: every rollout ok with its reward, every session stopped
        once the engine closed."""
        config = flat_config(
            exp_id=EXP,
            region=REGION,
            bucket=channel.bucket,
            prefix=channel.prefix,
            queue_url=channel.queue_url,
            service_urls={"s3": moto.url, "sqs": moto.url},
            rollout_timeout=RESULT_BOUND,
            result_grace=2.0,
            wait_time=1,
        )
        assert not config.all_runtimes
        requests = [RolloutRequest({"a": i, "b": 2}, input_id=f"q{i}") for i in range(4)]
        async with RolloutEngine(config, runtimes=[runtime]) as engine:
            batch = await engine.rollout(requests)
            assert (await runtime.limits()).pool in engine.quotas  # the start-up line
        assert [o.outcome for o in batch.outcomes] == [Outcome.OK] * 4, batch.counts
        assert [o.reward for o in batch.outcomes] == [expected_reward(r.payload) for r in requests]
        assert await leftovers() == []

    async def test_limits_are_sane(self, runtime: SandboxRuntime) -> None:
        limits = await runtime.limits()
        assert isinstance(limits, RuntimeLimits)
        assert limits.start_rate > 0 and limits.call_rate > 0
        assert isinstance(limits.max_live_sessions, int) and limits.max_live_sessions >= 1
        assert isinstance(limits.pool, str) and limits.pool
        own = runtime.max_live_sessions
        assert own is None or 1 <= own <= limits.max_live_sessions

    async def test_names_are_what_the_engine_tells_runtimes_apart_by(
        self, runtime: SandboxRuntime, make_runtime: Callable[..., SandboxRuntime]
    ) -> None:
        """A name of its own, stable (the run journal names where sessions started by it),
        and one given is kept, so two runtimes of one kind can run side by side."""
        assert isinstance(runtime.name, str) and runtime.name
        assert make_runtime().name == runtime.name
        assert {make_runtime(name="a").name, make_runtime(name="b").name} == {"a", "b"}
        assert runtime.environment is None or isinstance(runtime.environment, str)
