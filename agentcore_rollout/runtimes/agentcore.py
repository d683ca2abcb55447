"""`SandboxRuntime` over the AgentCore Runtime data plane: InvokeAgentRuntime in a new session
and StopRuntimeSession through aiobotocore's client, and the mapping of AgentCore's answers and
failures onto retry decisions."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    HTTPClientError,
    NoCredentialsError,
    ProxyConnectionError,
    SSLError,
)

from .base import SessionCallError

# AgentCore Runtime's published defaults and quotas: the one definition, for the config, the
# emulator, the CLI's deploy and the infra parameters. Check your account's own.
IDLE_TIMEOUT_S = 900  # idleRuntimeSessionTimeout: an idle session ends after it (60-28,800)
MAX_LIFETIME_S = 28_800  # maxLifetime: any session ends after it, 8 h
SYNC_TIMEOUT_S = 900  # a synchronous invocation's reply, 15 min
MAX_PAYLOAD_BYTES = 100_000_000  # an invocation's payload, 100 MB
# Quotas, each per account and region ("Unless otherwise noted, each quota is Region-specific"),
# all adjustable: AgentCore Developer Guide, "Quotas for Amazon Bedrock AgentCore"
# (https://docs.aws.amazon.com/bedrock-agentcore/latest/devguide/bedrock-agentcore-limits.html)
# and Release notes, August 2026, "Amazon Bedrock AgentCore Runtime: Simplified and increased
# API rate quotas" (https://docs.aws.amazon.com/bedrock-agentcore/latest/devguide/release-notes.html).
# An account's applied values are in Service Quotas (service code `bedrock-agentcore`), which
# the engine reads at start-up (`_quotas`).
NEW_SESSIONS_PER_SECOND = 25  # one quota shared by every endpoint (was 400/min per endpoint)
DATA_PLANE_TPS = 1_000  # every data-plane call together: invokes, stops (was 200/s per agent)
ACTIVE_SESSIONS = {"us-east-1": 5_000, "us-west-2": 5_000}  # active session workloads
ACTIVE_SESSIONS_ELSEWHERE = 2_500  # in every other region
SERVICE_QUOTAS_CODE = "bedrock-agentcore"
# Not adjustable, same guide, "AgentCore Runtime Service Quotas": "Maximum size for a Docker
# image in an AgentCore Runtime: 2 GB" (it was 1 GB in the 2025 preview). Read as 2 x 10^9
# bytes, the stricter reading, and checked against the image as ECR stores it (compressed
# layers), the size AWS holds; `deploy --tasks` refuses an image over it. (Beside it, not
# checked here: 1,000 agent runtimes per account, 10 endpoints per runtime, both adjustable.)
MAX_IMAGE_BYTES = 2_000_000_000
LIFECYCLE_MIN_S, LIFECYCLE_MAX_S = 60, 1_209_600  # what the API and CloudFormation accept
# AgentCore Runtime's published prices (us-east-1; check your region's): it bills per second
# (1 s minimum) the vCPUs a session actively uses and the peak GB of memory it holds.
VCPU_HOUR_USD = 0.0895
GB_HOUR_USD = 0.00945
# A Runtime session's microVM, as reported for AgentCore Runtime (not a setting of the runtime):
# billed at most this much, so an estimate from them is an upper bound.
SESSION_VCPUS = 2.0
SESSION_GB = 8.0


def active_sessions(region: str) -> int:
    """The published active-session quota of an account in `region`."""
    return ACTIVE_SESSIONS.get(region, ACTIVE_SESSIONS_ELSEWHERE)


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
_JSON = "application/json"


def _refusal(e: ClientError) -> SessionCallError:
    """An error answer. AgentCore's name an error type and carry a request id; a 4xx with
    neither came from something in between (a proxy refusing its credentials, a firewall):
    nothing started, AgentCore is not down, and the request fails now, in its own words."""
    error, meta = e.response.get("Error", {}), e.response.get("ResponseMetadata", {})
    code, status = str(error.get("Code") or "Unknown"), int(meta.get("HTTPStatusCode") or 0)
    message = str(error.get("Message") or f"HTTP {status}")
    if 400 <= status < 500 and code == str(status) and not meta.get("RequestId"):
        return SessionCallError(
            f"HTTP{status}",
            f"refused before reaching AgentCore (no AgentCore request id): {message}",
            retryable=False,
            maybe_started=False,
        )
    retryable, throttled = _AGENTCORE_ERRORS.get(
        code, (status >= 500 or status == 429, status == 429)
    )
    return SessionCallError(
        code,
        message,
        retryable=retryable,
        throttled=throttled,
        outage=status >= 500,
        maybe_started=status not in _REFUSED,
    )


def _failure(e: BotoCoreError) -> SessionCallError:
    """No answer from AgentCore, named as botocore names it. Unreachable (AgentCore, or the
    proxy before it): nothing was sent, nothing started, it may be down. Cut off mid-call:
    the session may have started. Refused by a proxy, or a certificate that does not verify:
    nothing reached AgentCore, and trying again will not help. No credentials: nothing sent."""
    name = type(e).__name__
    if isinstance(e, ProxyConnectionError) and isinstance(
        e.kwargs.get("error"), aiohttp.ClientResponseError
    ):
        return SessionCallError(
            name, f"{e} (the proxy refused)", retryable=False, maybe_started=False
        )
    if isinstance(e, SSLError | NoCredentialsError):
        return SessionCallError(name, str(e), retryable=False, maybe_started=False)
    if isinstance(e, EndpointConnectionError | ConnectTimeoutError | ProxyConnectionError):
        return SessionCallError(name, str(e), retryable=True, outage=True, maybe_started=False)
    if isinstance(e, HTTPClientError):
        return SessionCallError(name, str(e), retryable=True, outage=True)
    return SessionCallError(name, str(e), retryable=True, maybe_started=False)  # credentials


class AgentCoreRuntime:
    """`SandboxRuntime` over the AgentCore data plane (InvokeAgentRuntime, StopRuntimeSession),
    through an aiobotocore client (`AwsClients.agentcore_in`)."""

    def __init__(self, client: Any, runtime_arn: str, qualifier: str = "DEFAULT") -> None:
        self._client = client
        self._arn = runtime_arn
        self._qualifier = qualifier

    async def invoke(self, session_id: str, payload: bytes) -> None:
        async with _as_session_call_error():
            reply = await self._client.invoke_agent_runtime(
                agentRuntimeArn=self._arn,
                qualifier=self._qualifier,
                runtimeSessionId=session_id,
                payload=payload,
                contentType=_JSON,
                accept=_JSON,
            )
            async with reply["response"] as stream:
                body = await stream.read()
        _check_accepted(body)

    async def stop(self, session_id: str) -> None:
        try:
            async with _as_session_call_error():
                await self._client.stop_runtime_session(
                    agentRuntimeArn=self._arn,
                    qualifier=self._qualifier,
                    runtimeSessionId=session_id,
                )
        except SessionCallError as err:
            if err.code != "ResourceNotFoundException":
                raise


@asynccontextmanager
async def _as_session_call_error() -> AsyncIterator[None]:
    try:
        yield
    except ClientError as e:
        raise _refusal(e) from None
    except BotoCoreError as e:
        raise _failure(e) from None
    except (aiohttp.ClientError, OSError, TimeoutError) as e:  # a body cut off mid-read
        raise SessionCallError(type(e).__name__, str(e), retryable=True, outage=True) from None


def _check_accepted(body: bytes) -> None:
    """RolloutApp answers `{"status": "accepted"}`; anything else means it did not start."""
    try:
        reply = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        reply = None
    if not isinstance(reply, dict) or reply.get("status") != "accepted":
        shown = body[:200].decode(errors="replace")
        raise SessionCallError("NotAccepted", f"agent did not accept: {shown}", retryable=False)
