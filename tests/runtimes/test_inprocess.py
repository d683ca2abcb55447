"""`InProcessRuntime`: the conformance suite on `tests.agents.basic:app` called in this process,
the request the app sees, and the refusals it simulates."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from agentcore_rollout.runtimes import InProcessRuntime, SessionCallError
from agentcore_rollout.runtimes.inprocess import _post

from ..agents import basic, raw_asgi
from .conformance import Leftovers, Results, RuntimeConformance
from .conformance import results as results  # a fixture

pytestmark = pytest.mark.component


@pytest.fixture
async def made() -> AsyncIterator[list[InProcessRuntime]]:
    """The test's runtimes, closed after it."""
    runtimes: list[InProcessRuntime] = []
    yield runtimes
    for runtime in runtimes:
        await runtime.aclose()


@pytest.fixture
def make_runtime(
    made: list[InProcessRuntime], agent_endpoints: None
) -> Callable[..., InProcessRuntime]:
    """Runtimes of the basic agent, its results written to moto (`agent_endpoints`)."""

    def make(app: Any = basic.app, **kwargs: Any) -> InProcessRuntime:
        made.append(runtime := InProcessRuntime(app, **kwargs))
        return runtime

    return make


@pytest.fixture
def runtime(make_runtime: Callable[..., InProcessRuntime]) -> InProcessRuntime:
    return make_runtime()


@pytest.fixture
def broken_runtime(make_runtime: Callable[..., InProcessRuntime]) -> InProcessRuntime:
    """An app that answers every invocation, accepting none (it echoes the request)."""
    return make_runtime(raw_asgi.app)


@pytest.fixture
def leftovers(made: list[InProcessRuntime]) -> Leftovers:
    """The sessions this test's runtimes hold, not stopped."""

    async def live() -> list[str]:
        return sorted(sid for runtime in made for sid in runtime.live)

    return live


class TestConformance(RuntimeConformance):
    one_process_per_session = False  # one app serves every session, keeping them apart


async def test_the_app_gets_the_invocation_as_a_server_would_pass_it() -> None:
    sid = "s" * 40
    status, body = await _post(raw_asgi.app, sid, b'{"x": 1}')
    echoed = json.loads(body)
    assert status == 200 and echoed["body"] == '{"x": 1}'
    headers = dict(echoed["headers"])
    assert headers["x-amzn-bedrock-agentcore-runtime-session-id"] == sid
    assert headers["content-type"] == "application/json" and headers["content-length"] == "8"


async def test_refused_starts_started_nothing(
    make_runtime: Callable[..., InProcessRuntime], results: Results
) -> None:
    """`refuse_next` throttles, a session past `max_live_sessions` is refused as AgentCore's
    quota does: both retryable, nothing started; a stop makes room again."""
    runtime = make_runtime(max_live_sessions=1)
    first, second = results.session(), results.session()
    runtime.refuse_next()
    with pytest.raises(SessionCallError) as throttled:
        await runtime.invoke(first, results.payload(first, "r1", a=1, b=2))
    assert throttled.value.throttled and throttled.value.retryable
    assert not throttled.value.maybe_started and runtime.live == frozenset()

    await runtime.invoke(first, results.payload(first, "r1", a=1, b=2))
    await runtime.invoke(first, results.payload(first, "r2", a=1, b=2))  # no new start
    with pytest.raises(SessionCallError) as full:
        await runtime.invoke(second, results.payload(second, "r3", a=1, b=2))
    assert full.value.code == "ServiceQuotaExceededException"
    assert full.value.retryable and not full.value.throttled and not full.value.maybe_started

    assert [(await results.get(r)).status for r in ("r1", "r2")] == ["ok"] * 2
    await runtime.stop(first)
    await runtime.invoke(second, results.payload(second, "r3", a=1, b=2))
    assert (await results.get("r3")).status == "ok"
    assert (await runtime.limits()).max_live_sessions == 1
