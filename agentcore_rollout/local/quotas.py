"""The emulator's quotas, counted as AgentCore counts them and told as Service Quotas tells them:
new sessions per second and data-plane calls per second (429 ThrottlingException each), active
sessions (402 ServiceQuotaExceededException), each per account and region, so a client that
handles only one of them fails here as it would on AWS (docs/local-stack.md)."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from .._flow import TokenBucket
from ..runtimes.agentcore.published import SERVICE_QUOTAS_CODE
from .wire import REQUEST_ID_HEADER, ApiError, check_signed

# Service Quotas' wire (botocore/data/service-quotas/*/service-2.json): JSON 1.1, `POST /`, the
# operation in X-Amz-Target, signed for `servicequotas`; errors 400 with their code in `__type`.
_SIGNING_NAME = "servicequotas"
_LIST = "ServiceQuotasV20190624.ListServiceQuotas"
_JSON_11 = "application/x-amz-json-1.1"

# Names as AgentCore's quotas are listed (quota codes are not published: these are the
# emulator's own), and what the emulator's each is.
QUOTA_NAMES = {
    "new_sessions_per_second": ("Rate of new Runtime session creation", "L-EMU00001"),
    "data_plane_tps": ("Rate of Runtime data plane APIs", "L-EMU00002"),
    "max_sessions": ("Active Session Workloads per Account", "L-EMU00003"),
}


@dataclass
class Quotas:
    """The limits of one emulator, per account (`account id:region`). Endpoints are
    `(runtime ARN, qualifier)` pairs."""

    new_sessions_per_second: float | None
    data_plane_tps: float | None
    max_sessions: int
    throttle_every: int = 0
    clock: Callable[[], float] = time.monotonic
    """The rate buckets' clock (a test may hold it still: a second that never ends)."""
    _calls: dict[str, TokenBucket] = field(default_factory=dict, init=False)
    _new: dict[str, TokenBucket] = field(default_factory=dict, init=False)
    active: Counter[str] = field(default_factory=Counter, init=False)
    """Sessions open, by account (`account id:region`)."""

    def __post_init__(self) -> None:
        self._invokes = 0

    def admit_call(self, endpoint: tuple[str, str]) -> None:
        """Every data-plane call (invoke or stop), before it reaches a session."""
        if not self._take(self._calls, account_of(endpoint[0]), self.data_plane_tps):
            raise ApiError("ThrottlingException", "Rate exceeded")

    def admit_invoke(self, endpoint: tuple[str, str]) -> None:
        """Every InvokeAgentRuntime call, before it reaches a session."""
        self._invokes += 1
        if self.throttle_every and self._invokes % self.throttle_every == 0:
            raise ApiError("ThrottlingException", "Rate exceeded (injected)")
        self.admit_call(endpoint)

    def admit_session(self, endpoint: tuple[str, str]) -> None:
        """A call that would open a new session on `endpoint`; counted open if admitted
        (`closed` when it ends)."""
        account = account_of(endpoint[0])
        if self.active[account] >= self.max_sessions:
            raise ApiError(
                "ServiceQuotaExceededException",
                f"active sessions quota ({self.max_sessions}) reached",
            )
        if not self._take(self._new, account, self.new_sessions_per_second):
            raise ApiError("ThrottlingException", "Rate exceeded for new sessions")
        self.active[account] += 1

    def closed(self, endpoint: tuple[str, str]) -> None:
        self.active[account_of(endpoint[0])] -= 1

    def listed(self, account_id: str, region: str) -> list[dict[str, Any]]:
        """ListServiceQuotas' `Quotas` for the account: each limit that is on."""
        quotas = []
        for attr, (name, code) in QUOTA_NAMES.items():
            value = getattr(self, attr)
            if value is None:
                continue
            quota = {
                "ServiceCode": SERVICE_QUOTAS_CODE,
                "ServiceName": "Amazon Bedrock AgentCore",
                "QuotaArn": f"arn:aws:servicequotas:{region}:{account_id}:"
                f"{SERVICE_QUOTAS_CODE}/{code}",
                "QuotaCode": code,
                "QuotaName": name,
                "Value": float(value),
                "Unit": "None",
                "Adjustable": True,
                "GlobalQuota": False,
                "QuotaAppliedAtLevel": "ACCOUNT",
            }
            if attr != "max_sessions":
                quota["Period"] = {"PeriodValue": 1, "PeriodUnit": "SECOND"}
            quotas.append(quota)
        return quotas

    def _take(self, buckets: dict[str, TokenBucket], account: str, rate: float | None) -> bool:
        if not rate:
            return True
        if account not in buckets:
            buckets[account] = TokenBucket(rate, burst=max(1.0, rate), clock=self.clock)
        return buckets[account].try_acquire()


async def list_service_quotas(
    request: web.Request, quotas: Quotas, runtimes: Iterable[str], *, denied: bool
) -> web.Response:
    """ListServiceQuotas for `bedrock-agentcore`: `quotas`, as the account of the first of
    `runtimes` in the signing region (else the first) has them; `denied`: as for a caller
    without the permission."""
    region = check_signed(request, _SIGNING_NAME)
    target = request.headers.get("X-Amz-Target", "")
    if target != _LIST:
        raise ApiError("UnknownOperationException", f"{target or 'no X-Amz-Target'}")
    if denied:
        raise ApiError(
            "AccessDeniedException", "not authorized to perform: servicequotas:ListServiceQuotas"
        )
    asked = json.loads(await request.read() or b"{}")
    if asked.get("ServiceCode") != SERVICE_QUOTAS_CODE:
        raise ApiError("NoSuchResourceException", f"No service {asked.get('ServiceCode')!r}")
    arn = min(runtimes, key=lambda arn: arn.split(":")[3] != region)
    listed = quotas.listed(arn.split(":")[4], region)
    start = int(asked.get("NextToken") or 0)
    end = start + int(asked.get("MaxResults") or 100)
    page: dict[str, object] = {"Quotas": listed[start:end]}
    if end < len(listed):
        page["NextToken"] = str(end)
    return web.json_response(page, content_type=_JSON_11)


def json11_error(error: ApiError, request_id: str) -> web.Response:
    """An error as a JSON 1.1 service answers it."""
    return web.Response(
        body=json.dumps({"__type": error.code, "message": error.message}).encode(),
        status=400,
        content_type=_JSON_11,
        headers={REQUEST_ID_HEADER: request_id},
    )


def account_of(arn: str) -> str:
    """`account id:region`: whose quotas a runtime's sessions and calls count against."""
    parts = arn.split(":")
    return f"{parts[4]}:{parts[3]}"
