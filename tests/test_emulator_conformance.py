"""The local AgentCore Runtime behaves like the service wherever a client or an agent can tell.

Driven only through the unmodified boto3 and aiobotocore clients (plus one raw, unsigned HTTP
request, which no SDK sends), with a plain BedrockAgentCoreApp agent, a raw ASGI agent, a
command agent and a RolloutApp agent. Every reply is checked against botocore's service model
for bedrock-agentcore: status, error code, required members, modelled headers. Then: streaming
replies arrive as produced, the headers the container sees, the three quotas, and how the
runtime (ARN, agent id + account, qualifier) and the caller (signature) are identified.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import boto3
import botocore.session
import pytest
from aiobotocore.session import get_session
from botocore import UNSIGNED
from botocore.config import Config
from botocore.exceptions import ClientError

from agentcore_rollout.local.config import LocalConfig
from agentcore_rollout.local.runtime import EmulatorConfig

from .conftest import REGION, RUNTIME_ARN
from .test_emulator import _payload

pytestmark = pytest.mark.component

MODEL = botocore.session.get_session().get_service_model("bedrock-agentcore")
ACCOUNT, AGENT_ID = RUNTIME_ARN.split(":")[4], RUNTIME_ARN.split("/")[-1]
OTHER_ARN = "arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/other_agent-xyz789"
NO_RETRIES = Config(retries={"total_max_attempts": 1})
STREAM_WAIT = 30.0  # a guard against a hang, never a timing assertion


def _sid() -> str:
    return f"conformance-{uuid.uuid4()}"


# ---------------------------------------------------------------------- model checks


def check_output(resp: dict[str, Any], operation: str) -> None:
    """A successful reply: a 2xx status, a request id, every required output member, and the
    session id header the model declares."""
    meta = resp["ResponseMetadata"]
    assert 200 <= meta["HTTPStatusCode"] < 300
    assert meta["RequestId"], "no x-amzn-RequestId"
    output = MODEL.operation_model(operation).output_shape
    for name in output.required_members:
        assert resp.get(name), f"{operation} reply lacks required {name}"
    assert len(resp["runtimeSessionId"]) >= 33
    if operation == "InvokeAgentRuntime":
        assert resp["traceId"].startswith("Root=1-"), "no X-Amzn-Trace-Id"
        assert resp["statusCode"] == meta["HTTPStatusCode"]


def check_error(error: ClientError, operation: str, code: str) -> dict[str, Any]:
    """An error reply: a code the operation declares, the status its shape declares, a request
    id, and every required member of the shape (ValidationException: `reason` from its enum)."""
    response = error.response
    assert response["Error"]["Code"] == code, response
    shapes = {s.name: s for s in MODEL.operation_model(operation).error_shapes}
    assert code in shapes, f"{operation} does not declare {code}"
    shape = shapes[code]
    assert (
        response["ResponseMetadata"]["HTTPStatusCode"] == shape.metadata["error"]["httpStatusCode"]
    )
    assert response["ResponseMetadata"]["RequestId"], "no x-amzn-RequestId on an error"
    assert response["Error"]["Message"]
    for name in shape.required_members:
        if name != "message":
            assert name in response, f"{code} lacks required {name}: {response}"
    if "reason" in shape.members and "reason" in response:
        assert response["reason"] in shape.members["reason"].enum
    return response


async def _error(call: Any, operation: str, code: str) -> dict[str, Any]:
    with pytest.raises(ClientError) as raised:
        await call
    return check_error(raised.value, operation, code)


# ---------------------------------------------------------------------- clients


@pytest.fixture
def clients() -> Callable[[str], Any]:
    """`async with clients(url) as c`: an aiobotocore client for the emulator at `url`."""

    def make(url: str, config: Config = NO_RETRIES) -> Any:
        return get_session().create_client(
            "bedrock-agentcore", region_name=REGION, endpoint_url=url, config=config
        )

    return make


def _boto3(url: str, config: Config = NO_RETRIES) -> Any:
    return boto3.client("bedrock-agentcore", region_name=REGION, endpoint_url=url, config=config)


async def _invoke(c: Any, sid: str, payload: Any, **kw: Any) -> tuple[dict[str, Any], bytes]:
    resp = await c.invoke_agent_runtime(
        agentRuntimeArn=kw.pop("arn", RUNTIME_ARN),
        runtimeSessionId=sid,
        payload=payload if isinstance(payload, bytes) else json.dumps(payload).encode(),
        **kw,
    )
    async with resp["response"] as body:
        return resp, await body.read()


# ---------------------------------------------------------------------- every kind of agent

AGENTS = {
    "bedrock-agentcore app": {"app": "tests.agents.plain:app"},
    "raw ASGI app": {"app": "tests.agents.raw_asgi:app"},
    "RolloutApp": {"app": "tests.agents.basic:app"},
    "bedrock-agentcore app, process": {"app": "tests.agents.plain:app", "mode": "process"},
    "command on $PORT": {
        "app": "",
        "command": ("python", "-m", "tests.agents.command"),
        "mode": "process",
    },
}


@pytest.mark.parametrize("agent", list(AGENTS))
async def test_every_kind_of_agent_is_served_and_replies_conform(agent, emulator, clients, channel):
    spec = dict(AGENTS[agent])
    if "command" in spec:  # the command's interpreter: this test's, with the repo importable
        spec["command"] = (sys.executable, *spec["command"][1:])
    emu = await emulator(**spec)
    sid = _sid()
    rollout = json.loads(_payload(channel, f"r-{uuid.uuid4().hex[:8]}", sid, time.time() + 30))
    payload = rollout if agent == "RolloutApp" else {"hello": "agent"}
    async with clients(emu.url) as c:
        resp, body = await _invoke(c, sid, payload)
        check_output(resp, "InvokeAgentRuntime")
        assert resp["runtimeSessionId"] == sid
        assert resp["contentType"].startswith("application/json")
        reply = json.loads(body)
        if agent == "RolloutApp":
            assert reply["status"] == "accepted"
        elif agent == "raw ASGI app":
            assert json.loads(reply["body"]) == payload
        else:
            assert reply["echo"] == payload and reply["session_id"] == sid
        # The same session through boto3 (a second invocation reuses the session's agent).
        sync = _boto3(emu.url)
        if agent != "RolloutApp":

            def invoke_and_read() -> tuple[dict[str, Any], bytes]:  # off the emulator's loop
                resp = sync.invoke_agent_runtime(
                    agentRuntimeArn=RUNTIME_ARN,
                    runtimeSessionId=sid,
                    payload=json.dumps(payload).encode(),
                )
                return resp, resp["response"].read()

            again, again_body = await asyncio.to_thread(invoke_and_read)
            check_output(again, "InvokeAgentRuntime")
            same = json.loads(again_body)
            if agent == "raw ASGI app":  # headers differ per call (request and trace ids)
                same, reply = same["body"], reply["body"]
            assert same == reply
        assert emu.sessions.started == [sid]
        stopped = await asyncio.to_thread(
            sync.stop_runtime_session, agentRuntimeArn=RUNTIME_ARN, runtimeSessionId=sid
        )
        check_output(stopped, "StopRuntimeSession")
        assert emu.sessions.stopped == [sid] and emu.sessions.live.value == 0
        await _error(
            c.stop_runtime_session(agentRuntimeArn=RUNTIME_ARN, runtimeSessionId=sid),
            "StopRuntimeSession",
            "ResourceNotFoundException",
        )


async def test_an_app_that_is_not_asgi_fails_to_start_with_the_reason(emulator, clients):
    emu = await emulator(app="tests.agents.gate:release", mode="process")
    async with clients(emu.url) as c:
        response = await _error(
            c.invoke_agent_runtime(
                agentRuntimeArn=RUNTIME_ARN, runtimeSessionId=_sid(), payload=b"{}"
            ),
            "InvokeAgentRuntime",
            "RuntimeClientError",
        )
    assert "agent failed to start" in response["Error"]["Message"]
    assert "not an ASGI app" in response["Error"]["Message"]
    with pytest.raises(ValueError, match="exactly one of app and command"):
        EmulatorConfig(app="m:app", command=("serve",))


# ---------------------------------------------------------------------- errors and identity


async def test_errors_are_shaped_as_the_model_says(emulator, clients):
    emu = await emulator(app="tests.agents.raw_asgi:app")
    sid = _sid()
    async with clients(emu.url) as c:
        bad = await _error(
            c.invoke_agent_runtime(
                agentRuntimeArn="not-an-arn", runtimeSessionId=sid, payload=b"{}"
            ),
            "InvokeAgentRuntime",
            "ValidationException",
        )
        assert bad["reason"] == "FieldValidationFailed"
        assert bad["fieldList"][0]["name"] == "agentRuntimeArn"
        await _error(
            c.invoke_agent_runtime(agentRuntimeArn=OTHER_ARN, runtimeSessionId=sid, payload=b"{}"),
            "InvokeAgentRuntime",
            "ResourceNotFoundException",
        )
        await _error(
            c.invoke_agent_runtime(
                agentRuntimeArn=RUNTIME_ARN,
                qualifier="no-such-endpoint",
                runtimeSessionId=sid,
                payload=b"{}",
            ),
            "InvokeAgentRuntime",
            "ResourceNotFoundException",
        )
        long = await _error(  # botocore checks only minimums; the service checks the maximum
            c.invoke_agent_runtime(
                agentRuntimeArn=RUNTIME_ARN, runtimeSessionId="s" * 257, payload=b"{}"
            ),
            "InvokeAgentRuntime",
            "ValidationException",
        )
        assert long["fieldList"][0]["name"] == "runtimeSessionId"
        await _error(
            c.invoke_agent_runtime(
                agentRuntimeArn=RUNTIME_ARN, runtimeSessionId=sid, payload=b"{}", traceId="t" * 129
            ),
            "InvokeAgentRuntime",
            "ValidationException",
        )
        too_big = await _error(
            c.invoke_agent_runtime(
                agentRuntimeArn=RUNTIME_ARN, runtimeSessionId=sid, payload=b" " * 110_000_000
            ),
            "InvokeAgentRuntime",
            "ValidationException",
        )
        assert too_big["fieldList"][0]["name"] == "payload"
        assert emu.sessions.started == []  # nothing refused opened a session
        agent_failed = await _error(
            c.invoke_agent_runtime(
                agentRuntimeArn=RUNTIME_ARN, runtimeSessionId=sid, payload=b'{"status": 500}'
            ),
            "InvokeAgentRuntime",
            "RuntimeClientError",
        )
        assert "(500)" in agent_failed["Error"]["Message"]
        await _error(
            c.stop_runtime_session(agentRuntimeArn=RUNTIME_ARN, runtimeSessionId=_sid()),
            "StopRuntimeSession",
            "ResourceNotFoundException",
        )
        await _error(
            c.stop_runtime_session(agentRuntimeArn="not-an-arn", runtimeSessionId=sid),
            "StopRuntimeSession",
            "ValidationException",
        )


async def test_runtime_named_by_arn_or_by_agent_id_and_account(emulator, clients):
    emu = await emulator(app="tests.agents.plain:app")
    sid = _sid()
    async with clients(emu.url) as c:
        await _invoke(c, sid, {"n": 1})
        by_id, body = await _invoke(c, sid, {"n": 2}, arn=AGENT_ID, accountId=ACCOUNT)
        check_output(by_id, "InvokeAgentRuntime")
        assert json.loads(body)["echo"] == {"n": 2}
        assert emu.sessions.started == [sid]  # one runtime, one session, however it is named
        await _error(
            c.invoke_agent_runtime(
                agentRuntimeArn=AGENT_ID,
                accountId="210987654321",
                runtimeSessionId=sid,
                payload=b"{}",
            ),
            "InvokeAgentRuntime",
            "ResourceNotFoundException",
        )
        await _error(  # an id alone does not say whose runtime it is
            c.invoke_agent_runtime(agentRuntimeArn=AGENT_ID, runtimeSessionId=sid, payload=b"{}"),
            "InvokeAgentRuntime",
            "ValidationException",
        )
        await c.stop_runtime_session(agentRuntimeArn=RUNTIME_ARN, runtimeSessionId=sid)


async def test_sessions_belong_to_their_runtime_and_endpoint(emulator, clients):
    emu = await emulator(
        app="tests.agents.plain:app",
        runtime_arns=(RUNTIME_ARN, OTHER_ARN),
        qualifiers=("DEFAULT", "canary"),
    )
    sid = _sid()
    async with clients(emu.url) as c:
        await _invoke(c, sid, {"n": 1})
        for arn, qualifier in ((OTHER_ARN, "DEFAULT"), (RUNTIME_ARN, "canary")):
            await _error(
                c.stop_runtime_session(
                    agentRuntimeArn=arn, qualifier=qualifier, runtimeSessionId=sid
                ),
                "StopRuntimeSession",
                "ResourceNotFoundException",
            )
        assert emu.sessions.live.value == 1 and emu.sessions.stopped == []
        await _invoke(c, sid, {"n": 2}, arn=OTHER_ARN)  # the same id on another runtime: its own
        assert emu.sessions.started == [sid, sid] and emu.sessions.live.value == 2
        stopped = await c.stop_runtime_session(
            agentRuntimeArn=RUNTIME_ARN, qualifier="DEFAULT", runtimeSessionId=sid
        )
        check_output(stopped, "StopRuntimeSession")
        assert emu.sessions.live.value == 1


async def test_unsigned_requests_are_refused(emulator, clients):
    emu = await emulator(app="tests.agents.plain:app")
    unsigned = Config(signature_version=UNSIGNED, retries={"total_max_attempts": 1})
    async with clients(emu.url, unsigned) as c:
        for call, op in (
            (
                c.invoke_agent_runtime(
                    agentRuntimeArn=RUNTIME_ARN, runtimeSessionId=_sid(), payload=b"{}"
                ),
                "InvokeAgentRuntime",
            ),
            (
                c.stop_runtime_session(agentRuntimeArn=RUNTIME_ARN, runtimeSessionId=_sid()),
                "StopRuntimeSession",
            ),
        ):
            await _error(call, op, "AccessDeniedException")
    path = f"/runtimes/{RUNTIME_ARN.replace(':', '%3A').replace('/', '%2F')}/invocations"
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            emu.url + path,
            data=b"{}",
            headers={"X-Amzn-Bedrock-AgentCore-Runtime-Session-Id": _sid()},
        ) as resp,
    ):
        assert resp.status == 403
        assert resp.headers["x-amzn-ErrorType"] == "AccessDeniedException"
        assert resp.headers["x-amzn-RequestId"]
    async with aiohttp.ClientSession() as http:  # no operation there: still a modelled reply
        for method, where in (("GET", path), ("POST", "/no/such/operation")):
            async with http.request(method, emu.url + where) as resp:
                assert resp.status == 404
                assert resp.headers["x-amzn-ErrorType"] == "UnknownOperationException"
                assert resp.headers["x-amzn-RequestId"] and (await resp.json())["message"]
    assert emu.sessions.started == []


# ---------------------------------------------------------------------- headers


def _with_custom_header(client: Any, name: str, value: str) -> None:
    """Custom headers are not modelled: callers add them before signing, as AWS documents."""

    def add(request: Any, **_: Any) -> None:
        request.headers[name] = value

    client.meta.events.register("before-sign.bedrock-agentcore.InvokeAgentRuntime", add)


async def test_headers_reach_the_container_as_the_service_forwards_them(emulator, clients):
    emu = await emulator(app="tests.agents.raw_asgi:app")
    sid = _sid()
    custom = "X-Amzn-Bedrock-AgentCore-Runtime-Custom-Tenant"
    trace = {
        "traceId": "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1",
        "traceParent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "traceState": "vendor=opaque",
        "baggage": "userId=alice,experiment=7",
    }
    async with clients(emu.url) as c:
        _with_custom_header(c, custom, "acme")
        resp, body = await _invoke(
            c,
            sid,
            b"plain text, not JSON",
            contentType="text/plain; charset=utf-8",
            accept="application/x-ndjson",
            runtimeUserId="user-42",
            **trace,
        )
    check_output(resp, "InvokeAgentRuntime")
    seen = {k.lower(): v for k, v in json.loads(body)["headers"]}
    assert json.loads(body)["body"] == "plain text, not JSON"
    assert seen["x-amzn-bedrock-agentcore-runtime-session-id"] == sid
    assert (
        seen["x-amzn-bedrock-agentcore-runtime-request-id"] == resp["ResponseMetadata"]["RequestId"]
    )
    assert seen["x-amzn-trace-id"] == trace["traceId"]
    assert seen["traceparent"] == trace["traceParent"]
    assert seen["tracestate"] == trace["traceState"]
    assert seen["baggage"] == trace["baggage"]
    assert seen["x-amzn-bedrock-agentcore-runtime-user-id"] == "user-42"
    assert seen[custom.lower()] == "acme"
    assert seen["content-type"] == "text/plain; charset=utf-8"
    assert seen["accept"] == "application/x-ndjson"
    assert "authorization" not in seen and "x-amz-date" not in seen  # the caller's signature
    for member, value in trace.items():  # the modelled trace headers come back
        assert resp[member] == value


async def test_the_sdk_context_sees_forwarded_headers(emulator, clients):
    emu = await emulator(app="tests.agents.plain:app")
    custom = "X-Amzn-Bedrock-AgentCore-Runtime-Custom-Tenant"
    async with clients(emu.url) as c:
        _with_custom_header(c, custom, "acme")
        _, body = await _invoke(c, _sid(), {"x": 1})
    headers = {k.lower(): v for k, v in json.loads(body)["request_headers"].items()}
    assert headers[custom.lower()] == "acme"


# ---------------------------------------------------------------------- streaming


async def _first_event(lines: AsyncIterator[bytes]) -> bytes:
    async for line in lines:
        if line.strip():
            return line
    raise AssertionError("the stream ended before its first event")


@pytest.mark.parametrize(
    "spec",
    [
        {"app": "tests.agents.plain:app"},
        {"app": "tests.agents.raw_asgi:app"},
        {"app": "tests.agents.streaming:app"},
        {"app": "tests.agents.plain:app", "mode": "process"},
    ],
    ids=[
        "bedrock-agentcore app",
        "raw ASGI app",
        "bedrock-agentcore app, sync generator",
        "bedrock-agentcore app, process",
    ],
)
async def test_streaming_reply_arrives_as_it_is_produced(spec, emulator, clients):
    """The agent sends event 1, then waits for a release that the test sends only after it
    has read event 1: a buffering emulator would hang here (and fail at the guard)."""
    emu = await emulator(**spec)
    sid, tag = _sid(), uuid.uuid4().hex
    async with clients(emu.url) as c:
        try:
            async with asyncio.timeout(STREAM_WAIT):  # a buffered reply sends not even headers
                resp = await c.invoke_agent_runtime(
                    agentRuntimeArn=RUNTIME_ARN,
                    runtimeSessionId=sid,
                    payload=json.dumps({"stream": tag, "events": 4}).encode(),
                )
                lines = resp["response"].iter_lines()
                first = await _first_event(lines)
        except TimeoutError:
            pytest.fail("event 1 did not arrive before the agent was released: buffered")
        check_output(resp, "InvokeAgentRuntime")
        assert resp["contentType"].startswith("text/event-stream")
        async with resp["response"]:
            assert json.loads(first.removeprefix(b"data: ")) == {"event": 1}
            _, released = await _invoke(c, sid, {"release": tag})
            assert json.loads(released) == {"released": tag}
            async with asyncio.timeout(STREAM_WAIT):
                rest = [line async for line in lines if line.strip()]
    assert [json.loads(line.removeprefix(b"data: ")) for line in rest] == [
        {"event": 2},
        {"event": 3},
        {"event": 4},
    ]


@pytest.mark.e2e  # waits out real idle timeouts and lifetimes (no injectable clock yet)
async def test_time_caps_are_the_services_and_configurable(emulator, clients):
    defaults = EmulatorConfig(app="m:app")
    assert (defaults.sync_timeout, defaults.stream_timeout) == (15 * 60.0, 60 * 60.0)
    # A stream may outlive the synchronous cap; a synchronous reply may not.
    emu = await emulator(app="tests.agents.plain:app", sync_timeout=1.0, stream_timeout=60.0)
    sid, tag = _sid(), uuid.uuid4().hex
    async with clients(emu.url) as c:
        slow = await _error(
            c.invoke_agent_runtime(
                agentRuntimeArn=RUNTIME_ARN, runtimeSessionId=sid, payload=b'{"sleep": 3}'
            ),
            "InvokeAgentRuntime",
            "RuntimeClientError",
        )
        assert "timed out" in slow["Error"]["Message"]
        resp = await c.invoke_agent_runtime(
            agentRuntimeArn=RUNTIME_ARN,
            runtimeSessionId=sid,
            payload=json.dumps({"stream": tag, "events": 2}).encode(),
        )
        async with resp["response"] as body:
            lines = body.iter_lines()
            async with asyncio.timeout(STREAM_WAIT):
                await _first_event(lines)
            await asyncio.sleep(1.5)  # past the synchronous cap
            await _invoke(c, sid, {"release": tag})
            async with asyncio.timeout(STREAM_WAIT):
                rest = [line async for line in lines if line.strip()]
        assert rest == [b'data: {"event": 2}']
    # A stream past its own cap is cut.
    emu = await emulator(app="tests.agents.plain:app", stream_timeout=1.0)
    async with clients(emu.url) as c:
        resp = await c.invoke_agent_runtime(
            agentRuntimeArn=RUNTIME_ARN,
            runtimeSessionId=_sid(),
            payload=json.dumps({"stream": uuid.uuid4().hex}).encode(),
        )
        got: list[bytes] = []
        with pytest.raises(Exception):  # noqa: B017 - the client sees the stream cut
            async with resp["response"] as body, asyncio.timeout(STREAM_WAIT):
                got.extend([line async for line in body.iter_lines() if line.strip()])
                raise AssertionError("the stream ended cleanly instead of being cut")
    assert emu.counts["cut"] == 1


# ---------------------------------------------------------------------- quotas


def test_quota_defaults_are_the_published_ones():
    """The rates are AgentCore's; live sessions are `local.max_sessions`' one default, as
    many as a machine runs (the fixture plays the service: 5,000)."""
    cfg = EmulatorConfig(app="m:app")
    assert (cfg.new_sessions_per_second, cfg.data_plane_tps, cfg.max_sessions) == (25, 1000, 64)
    assert cfg.max_sessions == LocalConfig().max_sessions


def _still(emu: Any) -> Any:
    """The emulator with its quotas' clock held still: every call falls in one second, so
    what a rate admits is a count, whatever the machine's speed."""
    emu.quotas.clock = lambda: 0.0
    return emu


async def test_the_data_plane_rate_counts_every_call_invokes_and_stops(emulator, clients):
    emu = _still(
        await emulator(app="tests.agents.plain:app", data_plane_tps=5, new_sessions_per_second=None)
    )
    sid = _sid()
    async with clients(emu.url) as c:
        await _invoke(c, sid, {"n": 0})
        calls = [_invoke(c, sid, {"n": i}) for i in range(12)]
        results = await asyncio.gather(*calls, return_exceptions=True)
        await _error(
            c.stop_runtime_session(agentRuntimeArn=RUNTIME_ARN, runtimeSessionId=sid),
            "StopRuntimeSession",
            "ThrottlingException",
        )
    errors = [r for r in results if isinstance(r, BaseException)]
    for e in errors:
        assert isinstance(e, ClientError)
        check_error(e, "InvokeAgentRuntime", "ThrottlingException")
    assert len(errors) == 12 - 4  # the first call took one of the second's five
    assert emu.sessions.started == [sid] and emu.sessions.stopped == []


async def test_new_session_rate_and_active_sessions_are_separate_limits(emulator, clients):
    emu = _still(
        await emulator(
            app="tests.agents.plain:app",
            data_plane_tps=None,
            new_sessions_per_second=3,
            max_sessions=1000,
        )
    )
    sids = [_sid() for _ in range(4)]
    async with clients(emu.url) as c:
        for sid in sids[:3]:
            await _invoke(c, sid, {"n": 1})
        await _error(
            c.invoke_agent_runtime(
                agentRuntimeArn=RUNTIME_ARN, runtimeSessionId=sids[3], payload=b"{}"
            ),
            "InvokeAgentRuntime",
            "ThrottlingException",
        )
        for _ in range(4):  # existing sessions are not new sessions
            for sid in sids[:3]:
                await _invoke(c, sid, {"n": 2})
    emu = await emulator(
        app="tests.agents.plain:app",
        data_plane_tps=None,
        new_sessions_per_second=None,
        max_sessions=2,
    )
    async with clients(emu.url) as c:
        for sid in sids[:2]:
            await _invoke(c, sid, {"n": 1})
        await _error(
            c.invoke_agent_runtime(
                agentRuntimeArn=RUNTIME_ARN, runtimeSessionId=sids[2], payload=b"{}"
            ),
            "InvokeAgentRuntime",
            "ServiceQuotaExceededException",
        )
        await _invoke(c, sids[0], {"n": 2})  # an active session is served at the quota
        await c.stop_runtime_session(agentRuntimeArn=RUNTIME_ARN, runtimeSessionId=sids[0])
        await _invoke(c, sids[2], {"n": 1})  # a stop frees the slot
    assert emu.sessions.live.peak == 2


async def test_the_26th_new_session_in_a_second_is_refused_across_an_accounts_endpoints(
    emulator, clients
):
    """AgentCore's published 25 new sessions a second are the account's, whatever endpoint or
    runtime they open on; another account (or region) has its own."""
    other_account = RUNTIME_ARN.replace(ACCOUNT, "210987654321")
    emu = _still(
        await emulator(
            app="tests.agents.plain:app",
            runtime_arns=(RUNTIME_ARN, OTHER_ARN, other_account),
            qualifiers=("DEFAULT", "endpoint_2"),
        )
    )
    opened = [(RUNTIME_ARN, "DEFAULT"), (RUNTIME_ARN, "endpoint_2"), (OTHER_ARN, "DEFAULT")]
    async with clients(emu.url) as c:
        calls = [
            c.invoke_agent_runtime(
                agentRuntimeArn=arn, qualifier=q, runtimeSessionId=_sid(), payload=b"{}"
            )
            for i in range(26)
            for arn, q in [opened[i % 3]]
        ]
        answers = await asyncio.gather(*calls, return_exceptions=True)
        refused = [a for a in answers if isinstance(a, ClientError)]
        assert len(refused) == 1, answers
        check_error(refused[0], "InvokeAgentRuntime", "ThrottlingException")
        for answer in answers:
            if not isinstance(answer, BaseException):
                async with answer["response"] as body:
                    await body.read()
        for q in ("DEFAULT", "endpoint_2"):  # the other account's 25 are all there
            await _invoke(c, _sid(), {"n": 1}, arn=other_account, qualifier=q)
    assert len(emu.sessions.created) == 25 + 2
    assert {(arn, q) for _, arn, q in emu.sessions.created[:25]} == set(opened)


# ---------------------------------------------------------------------- Service Quotas

QUOTAS_MODEL = botocore.session.get_session().get_service_model("service-quotas")


def _service_quotas(url: str) -> Any:
    return get_session().create_client(
        "service-quotas", region_name=REGION, endpoint_url=url, config=NO_RETRIES
    )


async def test_service_quotas_lists_the_emulators_quotas_as_botocore_reads_them(emulator):
    emu = await emulator(
        app="tests.agents.plain:app", new_sessions_per_second=40, data_plane_tps=None
    )
    async with _service_quotas(emu.url) as sq:
        pages = sq.get_paginator("list_service_quotas").paginate(
            ServiceCode="bedrock-agentcore", PaginationConfig={"PageSize": 1}
        )
        quotas = [q async for page in pages for q in page["Quotas"]]
        with pytest.raises(ClientError) as unknown:
            await sq.list_service_quotas(ServiceCode="no-such-service")
    assert {q["QuotaName"]: q["Value"] for q in quotas} == {  # a limit switched off: not listed
        "Rate of new Runtime session creation": 40.0,
        "Active Session Workloads per Account": 5000.0,
    }
    assert emu.counts["ListServiceQuotas"] == 3  # a page each, and the error
    assert {q["QuotaArn"].split(":")[4] for q in quotas} == {ACCOUNT}  # the caller's account
    assert quotas[0]["Period"] == {"PeriodValue": 1, "PeriodUnit": "SECOND"}
    members = QUOTAS_MODEL.shape_for("ServiceQuota").members
    for attr in ("new_sessions_per_second", "data_plane_tps", "max_sessions"):
        setattr(emu.quotas, attr, 1)
    assert all(set(q) <= set(members) for q in emu.quotas.listed(ACCOUNT, REGION))
    assert unknown.value.response["Error"]["Code"] == "NoSuchResourceException"
    assert unknown.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400


async def test_service_quotas_refuses_a_caller_without_the_permission(emulator):
    emu = await emulator(app="tests.agents.plain:app", service_quotas=False)
    async with _service_quotas(emu.url) as sq:
        with pytest.raises(ClientError) as denied:
            await sq.list_service_quotas(ServiceCode="bedrock-agentcore")
    assert denied.value.response["Error"]["Code"] == "AccessDeniedException"
    assert "servicequotas:ListServiceQuotas" in denied.value.response["Error"]["Message"]
    names = {s.name for s in QUOTAS_MODEL.operation_model("ListServiceQuotas").error_shapes}
    assert "AccessDeniedException" in names
