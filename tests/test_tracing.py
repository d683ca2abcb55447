"""One OpenTelemetry trace per rollout, through the real wire: the engine's aiobotocore client,
the AgentCore emulator running the agent, moto S3 -> SQS, the gateway and the toy policy on
loopback, the OpenAI SDK sending the agent's turns. The process's tracer provider is the SDK's
with an in-memory exporter, and `OTEL_EXPORTER_OTLP_ENDPOINT` is set so the code sees tracing
configured. Not configured, a batch imports no `opentelemetry` at all."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web
from openai import AsyncOpenAI

from agentcore_rollout import Outcome, RolloutEngine, RolloutRequest
from agentcore_rollout._engine.tracing import RolloutSpans, configured
from agentcore_rollout._results.buffer import Delivery
from agentcore_rollout.contract import ContractError, RolloutControl, split_payload
from agentcore_rollout.gateway import Gateway, GatewayAdmin, GatewayError, SGLangBackend
from agentcore_rollout.local.policy import CharRenderer, PolicyServer
from agentcore_rollout.serving.server import Server

from .conftest import ROOT, engine_config
from .factories import make_outcome

pytestmark = pytest.mark.component

_ENGINE_SPANS = {"queue", "session.start", "agent", "result", "handoff"}


@pytest.fixture(scope="module")
def exporter() -> Any:
    """The process's SDK tracer provider (set once: OpenTelemetry allows no second), exporting
    to memory as well."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        with pytest.MonkeyPatch.context() as env:  # the SDK reads it once, here: a provider
            env.delenv("OTEL_SDK_DISABLED", raising=False)  # made under it never records
            provider = TracerProvider()
        trace.set_tracer_provider(provider)
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return memory


@pytest.fixture
def spans(exporter: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")  # never reached
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    exporter.clear()
    yield exporter
    exporter.clear()


def _by_trace(finished: Any) -> dict[int, list[Any]]:
    traces: dict[int, list[Any]] = {}
    for span in finished:
        traces.setdefault(span.context.trace_id, []).append(span)
    return traces


def _one(spans: list[Any], name: str) -> Any:
    named = [s for s in spans if s.name == name]
    assert len(named) == 1, (name, [s.name for s in spans])
    return named[0]


async def test_each_rollout_is_one_trace_of_the_engine_agent_and_gateway_spans(
    moto, channel, emulator, spans
):
    emu = await emulator(app="tests.agents.turns:app")
    turns = {"one": 1, "three": 3}
    async with (
        PolicyServer(seed=3) as policy,
        Gateway(SGLangBackend(policy.url), CharRenderer()) as gateway,
    ):
        gw = {"url": gateway.admin_url, "admin_token": gateway.admin_token}
        async with RolloutEngine(engine_config(moto, channel, emu, gateway=gw)) as engine:
            requests = [
                RolloutRequest({"question": "2+3?", "turns": n, "max_tokens": 3}, "q", request_id=r)
                for r, n in turns.items()
            ]
            batch = await engine.rollout(requests)
    assert [o.outcome for o in batch.outcomes] == [Outcome.OK] * 2, [o.error for o in batch]
    traces = _by_trace(spans.get_finished_spans())
    finished = spans.get_finished_spans()
    roots = {s.attributes["rollout.request_id"]: s for s in finished if s.name == "rollout"}
    assert set(roots) == set(turns)
    assert len({s.context.trace_id for s in roots.values()}) == 2  # one trace each
    for outcome in batch.outcomes:
        rid = outcome.request.request_id
        root = roots[rid]
        trace = traces[root.context.trace_id]
        assert root.parent is None and root.attributes["rollout.outcome"] == "ok"
        assert root.attributes["rollout.reward"] == outcome.reward
        for name in _ENGINE_SPANS:
            assert _one(trace, name).parent.span_id == root.context.span_id, name
        queue, start, result, handoff = (
            _one(trace, n) for n in ("queue", "session.start", "result", "handoff")
        )
        assert queue.end_time <= start.start_time <= start.end_time  # one after another
        assert _one(trace, "agent").end_time == result.start_time <= result.end_time
        assert result.end_time == handoff.start_time <= handoff.end_time <= root.end_time
        agent = _one(trace, "agent.rollout")  # the agent SDK's span, inside the `agent` span
        assert agent.parent.span_id == _one(trace, "agent").context.span_id
        turn_spans = [s for s in trace if s.name == "gateway.turn"]
        assert len(turn_spans) == outcome.trace["num_turns"] == turns[rid]
        assert {s.parent.span_id for s in turn_spans} == {agent.context.span_id}  # its header
        assert sorted(s.attributes["gateway.turn"] for s in turn_spans) == list(range(turns[rid]))
        assert (
            sum(s.attributes["gateway.completion_tokens"] for s in turn_spans)
            == (outcome.trace["usage"]["completion_tokens"])
        )
        assert {s.attributes["gateway.session_id"] for s in turn_spans} == {
            outcome.gateway_session_id
        }


async def test_a_turn_without_a_traceparent_header_joins_its_session_s_rollout(spans):
    """The admin call carries the rollout's traceparent: a turn the agent sent without the
    header is its child; one with the header, the header's."""
    session_parent = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
    header_parent = "00-" + "c" * 32 + "-" + "d" * 16 + "-01"
    async with (
        PolicyServer(seed=3) as policy,
        Gateway(SGLangBackend(policy.url), CharRenderer()) as gateway,
        GatewayAdmin(gateway.admin_url, gateway.admin_token) as admin,
    ):
        with pytest.raises(GatewayError, match="traceparent must be a W3C traceparent"):
            await admin.create_session("bad", traceparent="00-nope")
        session = await admin.create_session("r", traceparent=session_parent)
        messages = [{"role": "user", "content": "hi"}]
        async with AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key=session.api_key) as client:
            await client.chat.completions.create(model="policy", messages=messages, max_tokens=2)
            await client.chat.completions.create(
                model="policy",
                messages=messages,
                max_tokens=2,
                extra_headers={"traceparent": header_parent},
            )
    first, second = (s for s in spans.get_finished_spans() if s.name == "gateway.turn")
    assert (first.context.trace_id, first.parent.span_id) == (int("a" * 32, 16), int("b" * 16, 16))
    assert (second.context.trace_id, second.parent.span_id) == (
        int("c" * 32, 16),
        int("d" * 16, 16),
    )


@pytest.mark.unit
def test_retries_are_events_and_a_failure_ends_every_span_with_its_error(spans):
    """Spans of a request whose session started on a second attempt and whose result never
    came: the retry is an event of `session.start`, the agent's span ends at the delivery, and
    the root carries the outcome as an error."""
    from opentelemetry import trace
    from opentelemetry.trace import StatusCode

    job = RolloutSpans(trace.get_tracer("test"), {"rollout.request_id": "r"}, 1000.0)
    first, second = job.attempt(), job.attempt()
    assert first == second and first is not None  # every attempt names the same agent span
    job.started("e0")
    job.delivered(
        Delivery(missing="no result by the deadline", handed_off_at=2000.0, via="deadline")
    )
    job.ended(make_outcome(outcome=Outcome.TIMEOUT))
    by_name = {s.name: s for s in spans.get_finished_spans()}
    assert set(by_name) == {"rollout", *_ENGINE_SPANS}
    start = by_name["session.start"]
    assert [e.name for e in start.events] == ["retry"] and start.attributes["attempts"] == 2
    assert by_name["rollout"].start_time == 1000 * 10**9  # from submit
    assert by_name["result"].attributes["valid"] is False
    assert by_name["handoff"].start_time == by_name["result"].end_time == 2000 * 10**9
    assert by_name["agent"].end_time == by_name["result"].start_time  # no result: at delivery
    root = by_name["rollout"]
    assert root.status.status_code is StatusCode.ERROR
    assert root.attributes["rollout.outcome"] == "timeout"
    assert root.attributes["rollout.error_kind"] == "timeout"


@pytest.mark.unit
def test_the_control_block_carries_a_well_formed_traceparent_or_none():
    base = {
        "exp_id": "e",
        "step": 0,
        "request_id": "r",
        "input_id": "i",
        "sample_index": 0,
        "session_id": "s" * 40,
        "result": {"bucket": "bkt", "key": "k"},
        "deadline": 1.0,
        "sig_key": "k" * 32,
    }
    assert RolloutControl.model_validate(base).traceparent is None
    good = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"
    assert RolloutControl.model_validate({**base, "traceparent": good}).traceparent == good
    with pytest.raises(ContractError, match="traceparent"):
        split_payload({"_rollout": {**base, "traceparent": "not-a-traceparent"}})


@pytest.mark.unit
@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "True"}, False),
    ],
)
def test_configured_by_the_standard_variables(monkeypatch, env, expected):
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert configured() is expected


_BATCH = textwrap.dedent(
    """
    import asyncio, json, sys
    from agentcore_rollout import RolloutEngine, RolloutRequest
    from agentcore_rollout.local.config import LocalConfig
    from agentcore_rollout.local.stack import LocalStack
    from tests.factories import flat_config

    async def main():
        local = LocalConfig(app="tests.agents.turns:app", mode="process", policy_workers=1)
        async with LocalStack(local) as stack:
            config = stack.engine_config(flat_config(exp_id="plain", wait_time=1))
            async with RolloutEngine(config) as engine:
                requests = [
                    RolloutRequest({"question": "1?", "turns": n, "max_tokens": 2}, "q")
                    for n in (1, 2)
                ]
                batch = await engine.rollout(requests)
        loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
        outcomes = [
            [o.request.request_id, o.outcome.value, (o.trace or {}).get("num_turns")]
            for o in batch.outcomes
        ]
        print(json.dumps({"outcomes": outcomes, "loaded": loaded}))

    asyncio.run(main())
    """
)


def _batch_env(**otel: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return {**env, "PYTHONPATH": str(ROOT), **otel}


def test_not_configured_a_batch_imports_no_opentelemetry(tmp_path):
    """The engine, the local stack and the gateway's client import nothing of OpenTelemetry,
    so nothing can be exported, when no OTLP endpoint is set."""
    done = subprocess.run(
        [sys.executable, "-c", _BATCH],
        env=_batch_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert [outcome for _, outcome, _ in answer["outcomes"]] == ["ok", "ok"]
    assert answer["loaded"] == []


class _Collector(Server):
    """An OTLP/HTTP trace receiver: every span exported to it, with its service's name."""

    def __init__(self) -> None:
        super().__init__()
        self.spans: list[dict[str, Any]] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.add_routes([web.post("/v1/traces", self._export)])
        return app

    async def _export(self, request: web.Request) -> web.Response:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        for resource in ExportTraceServiceRequest.FromString(body).resource_spans:
            named = {a.key: a.value.string_value for a in resource.resource.attributes}
            for scope in resource.scope_spans:
                self.spans += [_span(named["service.name"], span) for span in scope.spans]
        answer = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=answer, content_type="application/x-protobuf")


def _span(service: str, span: Any) -> dict[str, Any]:
    attributes = {a.key: a.value.string_value or a.value.int_value for a in span.attributes}
    return {
        "service": service,
        "name": span.name,
        "trace": span.trace_id.hex(),
        "id": span.span_id.hex(),
        "parent": span.parent_span_id.hex() or None,
        "attributes": attributes,
    }


@pytest.mark.e2e
async def test_a_collector_gets_one_trace_per_rollout_from_the_engine_gateway_and_agent():
    """Over OTLP/HTTP from three kinds of process: the engine's, the gateway's (a child of the
    local stack) and the agents' (one process per session), joined by the `traceparent` the
    invocation and the turns' header carry."""
    async with _Collector() as collector:
        otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.url, "OTEL_BSP_SCHEDULE_DELAY": "100"}
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _BATCH,
            env=_batch_env(**otel),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(child.communicate(), 240)
        assert child.returncode == 0, err.decode()[-3000:]
    answer = json.loads(out.decode().strip().splitlines()[-1])
    assert answer["loaded"]  # configured: the engine's process imported it
    for request_id, outcome, num_turns in answer["outcomes"]:
        assert outcome == "ok"
        (root,) = (
            s
            for s in collector.spans
            if s["name"] == "rollout" and s["attributes"]["rollout.request_id"] == request_id
        )
        trace = [s for s in collector.spans if s["trace"] == root["trace"]]
        by_service = {(s["service"], s["name"]) for s in trace}
        engine = {("agentcore-rollout-engine", name) for name in {"rollout", *_ENGINE_SPANS}}
        assert engine | {("agentcore-rollout-agent", "agent.rollout")} <= by_service
        turns = [s for s in trace if s["name"] == "gateway.turn"]
        assert len(turns) == num_turns
        assert {s["service"] for s in turns} == {"agentcore-rollout-gateway"}
        (agent,) = (s for s in trace if s["name"] == "agent.rollout")
        assert {s["parent"] for s in turns} == {agent["id"]}
