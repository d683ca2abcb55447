"""`SandboxRuntime` over the AgentCore Runtime data plane (InvokeAgentRuntime in a new session,
StopRuntimeSession) through aiobotocore's client, AgentCore's answers and failures mapped onto
the dispatcher's decisions, and its limits read from the account's quotas."""

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

from ...config import EngineConfig
from ..base import RuntimeLimits, SandboxRuntime, SessionCallError
from .quotas import QuotaReader, at_aws, limits_of, published

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


class AgentCoreRuntime(SandboxRuntime):
    """One AgentCore runtime endpoint: its ARN and qualifier, through an aiobotocore client of
    its region's data plane (`AwsClients.agentcore_in`)."""

    def __init__(
        self,
        client: Any,
        runtime_arn: str,
        qualifier: str = "DEFAULT",
        *,
        environment: str | None = None,
        max_live_sessions: int | None = None,
        quotas: QuotaReader | None = None,
    ) -> None:
        self._client = client
        self._arn = runtime_arn
        self._qualifier = qualifier
        self._quotas = quotas
        self.name = f"{runtime_arn}#{qualifier}"
        self.environment = environment
        self.max_live_sessions = max_live_sessions
        _, _, _, region, account_id, *_ = runtime_arn.split(":")
        self.account = f"{account_id}:{region}"
        """Its quotas' pool: AgentCore's are per account and region."""

    async def limits(self) -> RuntimeLimits:
        """The account's quotas, from Service Quotas where it answers, else published."""
        if self._quotas is None:
            region = self.account.partition(":")[2]
            return limits_of(self.account, published(region, "no Service Quotas reader given"))
        return await self._quotas.limits(self.account, at_aws(self._client.meta.endpoint_url))

    async def invoke(self, session_id: str, payload: bytes) -> dict[str, Any]:
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
        return _accepted(body)

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


def _accepted(body: bytes) -> dict[str, Any]:
    """RolloutApp answers `{"status": "accepted", ...}`; anything else means it did not start."""
    try:
        reply = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        reply = None
    if not isinstance(reply, dict) or reply.get("status") != "accepted":
        shown = body[:200].decode(errors="replace")
        raise SessionCallError("NotAccepted", f"agent did not accept: {shown}", retryable=False)
    return reply


async def agentcore_runtimes(clients: Any, config: EngineConfig) -> list[AgentCoreRuntime]:
    """The engine's runtimes when none are given: one per `engine.runtimes` endpoint (or
    `runtime_arn` + `qualifier`), sharing one reader of the accounts' quotas."""
    reader = QuotaReader(clients, config.service_urls.service_quotas)
    runtimes = []
    for t in config.all_runtimes:
        url = t.data_plane_url or config.service_urls.agentcore
        client = await clients.agentcore_in(t.region, url)
        runtimes.append(
            AgentCoreRuntime(
                client,
                t.arn,
                t.qualifier,
                environment=t.environment,
                max_live_sessions=t.max_live_sessions,
                quotas=reader,
            )
        )
    return runtimes
