"""AgentCore's two data-plane calls as the engine makes them (`AgentCoreRuntime` over
aiobotocore's client), checked at the wire: what AgentCore answers, what something in between
answers, and what no answer at all means for a retry, a stop and the endpoint's health.

A recording server on loopback stands in for the data plane; the emulator answers the real
refusals."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from agentcore_rollout._aws import AwsClients
from agentcore_rollout.local.wire import SESSION_HEADER
from agentcore_rollout.runtimes.agentcore import AgentCoreRuntime
from agentcore_rollout.runtimes.base import SessionCallError

from .conftest import REGION, RUNTIME_ARN
from .wire_support import Received, Reply, engine_at, recording_server

pytestmark = pytest.mark.component

SESSION = "s" * 40
PAYLOAD = json.dumps({"prompt": "why is the sky blue?", "_rollout": {"k": "v:/?&="}}).encode()


def _accepted(req: Received) -> web.Response:
    reply = {"status": "accepted"} if req.raw_path.split("?")[0].endswith("invocations") else {}
    return web.json_response(reply, headers={SESSION_HEADER: req.headers[SESSION_HEADER]})


@pytest.fixture
async def recorder() -> AsyncIterator[tuple[str, list[Received], list[Reply]]]:
    """(url, what it received, the replies to give: `_accepted` when none is queued)."""
    async with recording_server(_accepted) as recording:
        yield recording


async def test_two_calls_a_rollout_each_one_attempt(recorder) -> None:
    url, received, replies = recorder
    async with AwsClients(engine_at(agentcore=url)) as clients:
        runtime = AgentCoreRuntime(await clients.agentcore_in(REGION, url), RUNTIME_ARN)
        await runtime.invoke(SESSION, PAYLOAD)
        await runtime.stop(SESSION)
        replies.append(_error(503, None, b""))
        with pytest.raises(SessionCallError):  # the dispatcher retries, not the client
            await runtime.invoke(SESSION, PAYLOAD)
        calls = dict(clients.api_calls)
    assert calls == {
        "bedrock-agentcore:InvokeAgentRuntime": 2,
        "bedrock-agentcore:StopRuntimeSession": 1,
    }
    invoke, stop, _ = received
    assert invoke.raw_path.startswith("/runtimes/arn%3Aaws%3Abedrock-agentcore%3A")
    assert invoke.body == PAYLOAD and invoke.headers[SESSION_HEADER] == SESSION
    assert json.loads(stop.body)["clientToken"]  # botocore's idempotency token


def _error(status: int, error_type: str | None, body: bytes, request_id: bool = True) -> Reply:
    headers = {"x-amzn-ErrorType": error_type} if error_type else {}
    if request_id:
        headers["x-amzn-RequestId"] = "0f0e0d0c-0000-4000-8000-000000000000"
    return lambda _: web.Response(status=status, body=body, headers=headers)


_PROXY_407 = _error(407, None, b"", request_id=False)
_FIREWALL_403 = _error(403, None, b"<html>Forbidden</html>", request_id=False)


@pytest.mark.parametrize(
    ("reply", "code", "retryable", "throttled", "outage", "maybe_started"),
    [
        (
            _error(
                429,
                "ThrottlingException:http://internal.amazon.com/coral/",
                b'{"message":"Rate exceeded"}',
            ),
            "ThrottlingException",
            True,
            True,
            False,
            False,
        ),
        (
            _error(400, None, b'{"__type":"aws#ValidationException","message":"bad"}'),
            "ValidationException",
            False,
            False,
            False,
            False,
        ),
        (_error(502, None, b"<html>Bad Gateway</html>"), "502", True, False, True, True),
        # Answers that cannot have come from AgentCore: no error type, no request id.
        (_PROXY_407, "HTTP407", False, False, False, False),
        (_FIREWALL_403, "HTTP403", False, False, False, False),
        (lambda _: web.json_response({"status": "busy"}), "NotAccepted", False, False, False, True),
    ],
    ids=["throttled", "invalid", "bad-gateway", "proxy-407", "firewall-403", "not-accepted"],
)
async def test_an_answer_decides_retry_stop_and_health(
    recorder,
    reply: Reply,
    code: str,
    retryable: bool,
    throttled: bool,
    outage: bool,
    maybe_started: bool,
) -> None:
    url, _, replies = recorder
    replies.append(reply)
    async with AwsClients(engine_at(agentcore=url)) as clients:
        client = await clients.agentcore_in(REGION, url)
        with pytest.raises(SessionCallError) as caught:
            await AgentCoreRuntime(client, RUNTIME_ARN).invoke(SESSION, PAYLOAD)
    err = caught.value
    assert (err.code, err.retryable, err.throttled, err.outage, err.maybe_started) == (
        code,
        retryable,
        throttled,
        outage,
        maybe_started,
    )


async def test_the_emulators_refusals_and_an_unreachable_endpoint(emulator) -> None:
    emu = await emulator()
    async with AwsClients(engine_at(agentcore=emu.url)) as clients:
        client = await clients.agentcore_in(REGION, emu.url)
        known = AgentCoreRuntime(client, RUNTIME_ARN)
        await known.stop(SESSION)  # a session that does not exist: not an error
        unknown = AgentCoreRuntime(client, RUNTIME_ARN.replace("abc123", "zzz999"))
        with pytest.raises(SessionCallError) as caught:
            await unknown.invoke(SESSION, PAYLOAD)
        assert caught.value.code == "ResourceNotFoundException"
        assert not caught.value.retryable and not caught.value.maybe_started
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"  # bound, never listening
        async with AwsClients(engine_at(agentcore=closed)) as clients:
            client = await clients.agentcore_in(REGION, closed)
            with pytest.raises(SessionCallError) as caught:
                await AgentCoreRuntime(client, RUNTIME_ARN).invoke(SESSION, PAYLOAD)
    err = caught.value
    assert err.code == "EndpointConnectionError" and closed in str(err)
    assert err.retryable and err.outage and not err.maybe_started


async def test_a_password_in_an_endpoint_url_is_in_no_error() -> None:
    url = "http://user:pw-in-url@127.0.0.1:9"  # the SDK will not send it: an error, masked
    async with AwsClients(engine_at(agentcore=url)) as clients:
        client = await clients.agentcore_in(REGION, url)
        with pytest.raises(SessionCallError) as caught:
            await AgentCoreRuntime(client, RUNTIME_ARN).invoke(SESSION, PAYLOAD)
    assert "pw-in-url" not in str(caught.value)
    with pytest.raises(SessionCallError) as caught:
        raise SessionCallError(
            "EndpointConnectionError", f"Could not connect to {url}/x", retryable=True
        )
    assert str(caught.value).endswith("Could not connect to http://***:***@127.0.0.1:9/x")


async def test_without_an_endpoint_the_calls_go_to_aws_regional_data_plane(monkeypatch) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL_BEDROCK_AGENTCORE", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    async with AwsClients(engine_at()) as clients:
        west = await clients.agentcore_in("us-west-2", None)
        assert west.meta.endpoint_url == "https://bedrock-agentcore.us-west-2.amazonaws.com"
        other = await clients.agentcore_in("eu-central-1", None)
        assert other.meta.endpoint_url == "https://bedrock-agentcore.eu-central-1.amazonaws.com"
