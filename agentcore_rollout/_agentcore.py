"""`SandboxRuntime` over the AgentCore Runtime data plane: InvokeAgentRuntime in a new session,
StopRuntimeSession, and the mapping of AgentCore's error types onto retry decisions."""

from __future__ import annotations

import json
from typing import Any

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
)

from ._sandbox import SessionCallError

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


def classify_client_error(e: ClientError) -> SessionCallError:
    err = e.response.get("Error", {})
    code = err.get("Code", "Unknown")
    status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    retryable, throttled = _AGENTCORE_ERRORS.get(
        code, (status >= 500 or status == 429, status == 429)
    )
    return SessionCallError(
        code,
        err.get("Message", str(e)),
        retryable=retryable,
        throttled=throttled,
        outage=status >= 500,
        maybe_started=status not in _REFUSED,
    )


def _transport_error(e: Exception) -> SessionCallError:
    """No answer: unreachable (nothing was sent, nothing started) or cut off mid-call."""
    unreachable = isinstance(e, EndpointConnectionError | ConnectTimeoutError)
    return SessionCallError(
        type(e).__name__, str(e), retryable=True, outage=True, maybe_started=not unreachable
    )


class AgentCoreRuntime:
    """`SandboxRuntime` over the AgentCore data plane (InvokeAgentRuntime, StopRuntimeSession)."""

    def __init__(self, client: Any, runtime_arn: str, qualifier: str = "DEFAULT") -> None:
        self._client = client
        self._arn = runtime_arn
        self._qualifier = qualifier

    async def invoke(self, session_id: str, payload: bytes) -> None:
        try:
            resp = await self._client.invoke_agent_runtime(
                agentRuntimeArn=self._arn,
                qualifier=self._qualifier,
                runtimeSessionId=session_id,
                payload=payload,
                contentType="application/json",
                accept="application/json",
            )
            async with resp["response"] as stream:
                body = await stream.read()
        except ClientError as e:
            raise classify_client_error(e) from None
        except (BotoCoreError, OSError, TimeoutError) as e:
            raise _transport_error(e) from None
        _check_accepted(body)

    async def stop(self, session_id: str) -> None:
        try:
            await self._client.stop_runtime_session(
                agentRuntimeArn=self._arn, qualifier=self._qualifier, runtimeSessionId=session_id
            )
        except ClientError as e:
            err = classify_client_error(e)
            if err.code != "ResourceNotFoundException":
                raise err from None
        except (BotoCoreError, OSError, TimeoutError) as e:
            raise _transport_error(e) from None


def _check_accepted(body: bytes) -> None:
    """RolloutApp answers `{"status": "accepted"}`; anything else means it did not start."""
    try:
        reply = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        reply = None
    if not isinstance(reply, dict) or reply.get("status") != "accepted":
        shown = body[:200].decode(errors="replace")
        raise SessionCallError("NotAccepted", f"agent did not accept: {shown}", retryable=False)
