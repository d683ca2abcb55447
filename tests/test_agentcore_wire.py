"""AgentCore's two data-plane calls as the engine sends them (`AgentCoreRuntime` over
`SignedClient`), checked at the wire: the same requests botocore's client sends, a SigV4
signature that holds for what arrived, and AgentCore's answers read as botocore reads them.

A recording server on loopback stands in for the data plane; the emulator answers the real
refusals."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator

import pytest
from aiobotocore.session import get_session
from aiohttp import web

from agentcore_rollout._agentcore import SESSION_HEADER, AgentCoreRuntime
from agentcore_rollout._aws import AwsClients
from agentcore_rollout._sandbox import SessionCallError

from .conftest import REGION, RUNTIME_ARN
from .wire_support import AUTH, Received, Reply, engine_at, recording_server, signature_holds

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


async def _botocore_calls(url: str) -> None:
    async with get_session().create_client(
        "bedrock-agentcore", region_name=REGION, endpoint_url=url
    ) as client:
        resp = await client.invoke_agent_runtime(
            agentRuntimeArn=RUNTIME_ARN,
            qualifier="DEFAULT",
            runtimeSessionId=SESSION,
            payload=PAYLOAD,
            contentType="application/json",
            accept="application/json",
        )
        async with resp["response"] as stream:
            await stream.read()
        await client.stop_runtime_session(
            agentRuntimeArn=RUNTIME_ARN, qualifier="DEFAULT", runtimeSessionId=SESSION
        )


async def _our_calls(url: str) -> dict[str, int]:
    async with AwsClients(engine_at(agentcore=url)) as clients:
        runtime = AgentCoreRuntime(clients.agentcore, RUNTIME_ARN)
        await runtime.invoke(SESSION, PAYLOAD)
        await runtime.stop(SESSION)
        return dict(clients.api_calls)


async def test_the_engine_sends_what_botocore_sends_signed_as_it_signs(recorder) -> None:
    url, received, _ = recorder
    await _botocore_calls(url)
    calls = await _our_calls(url)
    assert calls == {
        "bedrock-agentcore:InvokeAgentRuntime": 1,
        "bedrock-agentcore:StopRuntimeSession": 1,
    }
    botocore_invoke, botocore_stop, our_invoke, our_stop = received
    modelled = ("Content-Type", "Accept", SESSION_HEADER, "Host", "X-Amz-Security-Token")
    for theirs, ours in ((botocore_invoke, our_invoke), (botocore_stop, our_stop)):
        assert (ours.method, ours.raw_path) == (theirs.method, theirs.raw_path)
        assert {h: ours.headers.get(h) for h in modelled} == {
            h: theirs.headers.get(h) for h in modelled
        }
        assert AUTH.fullmatch(ours.headers["Authorization"])["region"] == REGION  # type: ignore[index]
        # The signature holds for what arrived, botocore's as ours, and only for that.
        assert signature_holds(theirs) and signature_holds(ours)
        assert not signature_holds(ours, secret="not-the-secret")
        tampered = Received(ours.method, ours.raw_path, ours.headers, ours.body + b" ")
        assert not signature_holds(tampered)
    assert our_invoke.raw_path.startswith("/runtimes/arn%3Aaws%3Abedrock-agentcore%3A")
    assert our_invoke.body == botocore_invoke.body == PAYLOAD
    # StopRuntimeSession's body is its idempotency token, a fresh one per call, as botocore's.
    ours_token, theirs_token = (
        json.loads(r.body)["clientToken"] for r in (our_stop, botocore_stop)
    )
    assert len(ours_token) == len(theirs_token) >= 33 and ours_token != theirs_token


def _error(status: int, error_type: str | None, body: bytes) -> Reply:
    headers = {"x-amzn-ErrorType": error_type} if error_type else {}
    return lambda _: web.Response(status=status, body=body, headers=headers)


@pytest.mark.parametrize(
    ("reply", "code", "retryable", "throttled", "maybe_started"),
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
        ),
        (
            _error(400, None, b'{"__type":"aws#ValidationException","message":"bad"}'),
            "ValidationException",
            False,
            False,
            False,
        ),
        (_error(502, None, b"<html>Bad Gateway</html>"), "HTTP502", True, False, True),
        (lambda _: web.json_response({"status": "busy"}), "NotAccepted", False, False, True),
    ],
)
async def test_an_answer_is_read_as_botocore_reads_it(
    recorder, reply: Reply, code: str, retryable: bool, throttled: bool, maybe_started: bool
) -> None:
    url, _, replies = recorder
    replies.append(reply)
    async with AwsClients(engine_at(agentcore=url)) as clients:
        with pytest.raises(SessionCallError) as caught:
            await AgentCoreRuntime(clients.agentcore, RUNTIME_ARN).invoke(SESSION, PAYLOAD)
    err = caught.value
    assert (err.code, err.retryable, err.throttled, err.maybe_started) == (
        code,
        retryable,
        throttled,
        maybe_started,
    )


async def test_the_emulators_refusals_and_an_unreachable_endpoint(emulator) -> None:
    emu = await emulator()
    async with AwsClients(engine_at(agentcore=emu.url)) as clients:
        known = AgentCoreRuntime(clients.agentcore, RUNTIME_ARN)
        await known.stop(SESSION)  # a session that does not exist: not an error
        unknown = AgentCoreRuntime(clients.agentcore, RUNTIME_ARN.replace("abc123", "zzz999"))
        with pytest.raises(SessionCallError) as caught:
            await unknown.invoke(SESSION, PAYLOAD)
        assert caught.value.code == "ResourceNotFoundException"
        assert not caught.value.retryable and not caught.value.maybe_started
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"  # bound, never listening
        async with AwsClients(engine_at(agentcore=closed)) as clients:
            with pytest.raises(SessionCallError) as caught:
                await AgentCoreRuntime(clients.agentcore, RUNTIME_ARN).invoke(SESSION, PAYLOAD)
    err = caught.value
    assert err.code == "EndpointConnectionError" and closed in str(err)
    assert err.retryable and err.outage and not err.maybe_started


async def test_without_an_endpoint_the_calls_go_to_aws_regional_data_plane() -> None:
    cfg = engine_at(agentcore="unused").model_copy(update={"region": "us-west-2"})
    cfg.endpoints.agentcore = None
    async with AwsClients(cfg) as clients:
        assert clients.agentcore.endpoint_url == "https://bedrock-agentcore.us-west-2.amazonaws.com"
        other = await clients.agentcore_in("eu-central-1", None)
        assert other.endpoint_url == "https://bedrock-agentcore.eu-central-1.amazonaws.com"
