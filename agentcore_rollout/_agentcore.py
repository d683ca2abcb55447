"""`SandboxRuntime` over the AgentCore Runtime data plane: InvokeAgentRuntime in a new session,
StopRuntimeSession (each one signed HTTP request, as botocore's service model describes it),
and the mapping of AgentCore's error types onto retry decisions."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING
from urllib.parse import quote

import aiohttp
from botocore.exceptions import BotoCoreError, NoCredentialsError

from ._sandbox import SessionCallError

if TYPE_CHECKING:
    from ._aws import SignedClient

# AgentCore Runtime's published defaults and quotas: the one definition, for the config, the
# emulator, the CLI's deploy and the infra parameters. Check your account's own.
IDLE_TIMEOUT_S = 900  # idleRuntimeSessionTimeout: an idle session ends after it (60-28,800)
MAX_LIFETIME_S = 28_800  # maxLifetime: any session ends after it, 8 h
SYNC_TIMEOUT_S = 900  # a synchronous invocation's reply, 15 min
MAX_PAYLOAD_BYTES = 100_000_000  # an invocation's payload, 100 MB
INVOKE_TPS = 200  # InvokeAgentRuntime calls per second per agent, every call (was 25)
NEW_SESSIONS_PER_MINUTE = 400  # per endpoint, container deployments (was 100; code: 25/s)
ACTIVE_SESSIONS = 5_000  # per account, us-east-1 and us-west-2
LIFECYCLE_MIN_S, LIFECYCLE_MAX_S = 60, 1_209_600  # what the API and CloudFormation accept
# AgentCore Runtime's published prices (us-east-1; check your region's): it bills per second
# (1 s minimum) the vCPUs a session actively uses and the peak GB of memory it holds.
VCPU_HOUR_USD = 0.0895
GB_HOUR_USD = 0.00945
# A Runtime session's microVM, as reported for AgentCore Runtime (not a setting of the runtime):
# billed at most this much, so an estimate from them is an upper bound.
SESSION_VCPUS = 2.0
SESSION_GB = 8.0

# AgentCore error types (x-amzn-ErrorType) -> (retryable, throttled)
_AGENTCORE_ERRORS: dict[str, tuple[bool, bool]] = {
    "ThrottlingException": (True, True),
    "ServiceQuotaExceededException": (True, False),
    "RetryableConflictException": (True, False),
    "InternalServerException": (True, False),
    "ValidationException": (False, False),
    "AccessDeniedException": (False, False),
    "ResourceNotFoundException": (False, False),
    "RuntimeClientError": (False, False),
    "ConflictException": (False, False),
    "UnauthorizedException": (False, False),
}


# Refusals that start nothing: the service answered before creating a session.
_REFUSED = {400, 402, 403, 404, 429}
SESSION_HEADER = "X-Amzn-Bedrock-AgentCore-Runtime-Session-Id"
_JSON = "application/json"


def _refusal(status: int, headers: Mapping[str, str], body: bytes) -> SessionCallError:
    """An error answer, read as botocore's rest-json parser reads it: the code from
    `x-amzn-ErrorType` (or the body's `__type` / `code`), the message from the body."""
    try:
        reply = json.loads(body) if body else {}
    except (ValueError, UnicodeDecodeError):
        reply = None
    if not isinstance(reply, dict):
        reply = {"message": body[:200].decode(errors="replace")}
    code = headers.get("x-amzn-ErrorType", "").split(":")[0]
    code = code or str(reply.get("__type") or reply.get("code") or "").split("#")[-1]
    code = code or f"HTTP{status}"
    retryable, throttled = _AGENTCORE_ERRORS.get(
        code, (status >= 500 or status == 429, status == 429)
    )
    return SessionCallError(
        code,
        str(reply.get("message") or reply.get("Message") or f"HTTP {status}"),
        retryable=retryable,
        throttled=throttled,
        outage=status >= 500,
        maybe_started=status not in _REFUSED,
    )


def _transport_error(e: Exception, url: str) -> SessionCallError:
    """No answer: unreachable (nothing was sent, nothing started) or cut off mid-call. Named
    as botocore names them, so logs and outcomes read the same as with its clients."""
    if isinstance(e, aiohttp.ClientConnectorError):
        code, unreachable = "EndpointConnectionError", True
        e = OSError(f"Could not connect to the endpoint URL: {url}: {e.os_error}")
    elif isinstance(e, aiohttp.ConnectionTimeoutError):
        code, unreachable = "ConnectTimeoutError", True
    elif isinstance(e, TimeoutError):
        code, unreachable = "ReadTimeoutError", False
    else:
        code, unreachable = "ConnectionClosedError", False
    return SessionCallError(
        code, str(e) or type(e).__name__, retryable=True, outage=True, maybe_started=not unreachable
    )


class AgentCoreRuntime:
    """`SandboxRuntime` over the AgentCore data plane (InvokeAgentRuntime, StopRuntimeSession),
    through a `SignedClient` (`AwsClients.agentcore_in`)."""

    def __init__(self, client: SignedClient, runtime_arn: str, qualifier: str = "DEFAULT") -> None:
        self._client = client
        runtime = f"/runtimes/{quote(runtime_arn, safe='')}"
        query = f"?qualifier={quote(qualifier, safe='')}"
        self._invocations = f"{runtime}/invocations{query}"
        self._stop = f"{runtime}/stopruntimesession{query}"

    async def invoke(self, session_id: str, payload: bytes) -> None:
        headers = {"Content-Type": _JSON, "Accept": _JSON, SESSION_HEADER: session_id}
        body = await self._call("InvokeAgentRuntime", self._invocations, payload, headers)
        _check_accepted(body)

    async def stop(self, session_id: str) -> None:
        # clientToken: the idempotency token botocore would generate
        token = json.dumps({"clientToken": str(uuid.uuid4())}).encode()
        headers = {"Content-Type": _JSON, SESSION_HEADER: session_id}
        try:
            await self._call("StopRuntimeSession", self._stop, token, headers)
        except SessionCallError as err:
            if err.code != "ResourceNotFoundException":
                raise

    async def _call(self, operation: str, path: str, body: bytes, headers: dict[str, str]) -> bytes:
        try:
            status, reply_headers, reply = await self._client.post(operation, path, body, headers)
        except BotoCoreError as e:  # credentials: nothing was sent
            raise SessionCallError(
                type(e).__name__,
                str(e),
                retryable=not isinstance(e, NoCredentialsError),
                maybe_started=False,
            ) from None
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            raise _transport_error(e, self._client.endpoint_url + path) from None
        if status >= 300:
            raise _refusal(status, reply_headers, reply)
        return reply


def _check_accepted(body: bytes) -> None:
    """RolloutApp answers `{"status": "accepted"}`; anything else means it did not start."""
    try:
        reply = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        reply = None
    if not isinstance(reply, dict) or reply.get("status") != "accepted":
        shown = body[:200].decode(errors="replace")
        raise SessionCallError("NotAccepted", f"agent did not accept: {shown}", retryable=False)
