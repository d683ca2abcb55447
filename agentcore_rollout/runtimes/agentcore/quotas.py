"""AgentCore Runtime's quotas as the account has them, read once at start-up.

They are adjustable, per account and region, and its two rates are shared by every endpoint
there, so pacing by the published figures alone would start sessions below a raised quota or
be throttled by a lowered one. Service Quotas is asked once per region; any value it does not
give is the published default, named with why. Quota codes are not published, so quotas are
matched by name, leniently (docs/aws.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from botocore.exceptions import ClientError

from ..base import RuntimeLimits
from .published import (
    DATA_PLANE_TPS,
    NEW_SESSIONS_PER_SECOND,
    SERVICE_QUOTAS_CODE,
    active_sessions,
)

SERVICE_QUOTAS = "Service Quotas"
PUBLISHED = "published default"
_READ_TIMEOUT_S = 10.0  # all pages of one region, retries included
_OTHER_SERVICES = ("browser", "code interpreter", "gateway", "memory", "identity", "evaluation")
_OWN_URL = "AgentCore at its own URL; no engine.service_urls.service_quotas"
_AWS_DOMAINS = (".amazonaws.com", ".amazonaws.com.cn", ".api.aws")
_SECONDS = {"MICROSECOND": 1e-6, "MILLISECOND": 1e-3, "SECOND": 1, "MINUTE": 60, "HOUR": 3600}


@dataclass(frozen=True)
class Quota:
    value: float
    source: str
    """`Service Quotas`, or `published default (why)`."""


@dataclass(frozen=True)
class AccountQuotas:
    """AgentCore Runtime's quotas of one account in one region."""

    new_sessions_per_second: Quota
    data_plane_tps: Quota
    active_sessions: Quota


def published(region: str, why: str = "") -> AccountQuotas:
    """The published defaults for an account in `region`, sourced with `why`."""
    source = f"{PUBLISHED} ({why})" if why else PUBLISHED
    return AccountQuotas(
        Quota(NEW_SESSIONS_PER_SECOND, source),
        Quota(DATA_PLANE_TPS, source),
        Quota(active_sessions(region), source),
    )


class QuotaReader:
    """Each region's quotas, asked once for every runtime of the engine there."""

    def __init__(self, clients: Any, url: str | None) -> None:
        self._clients = clients
        self._url = url  # engine.service_urls.service_quotas
        self._regions: dict[str, asyncio.Task[tuple[dict[str, dict], str]]] = {}

    async def limits(self, account: str, at_aws: bool) -> RuntimeLimits:
        """The limits of `account` (`<account id>:<region>`): from Service Quotas where it
        answers for that account, else the published defaults, and why. Never raises."""
        account_id, region = account.split(":")
        if not (self._url or at_aws):  # of an emulator or a stand-in, AWS's knows nothing
            listed, why = {}, _OWN_URL
        else:
            if region not in self._regions:
                self._regions[region] = asyncio.ensure_future(
                    _read(self._clients, region, self._url)
                )
            listed, why = await asyncio.shield(self._regions[region])
        return limits_of(account, _quotas_of(account_id, region, listed, why))


def at_aws(endpoint_url: str) -> bool:
    """The data plane at this URL is AWS's own, whose Service Quotas knows its quotas."""
    return (urlsplit(endpoint_url).hostname or "").endswith(_AWS_DOMAINS)


async def _read(clients: Any, region: str, url: str | None) -> tuple[dict[str, dict], str]:
    """Service Quotas' answer in `region`, by account id; or nothing, and why."""
    try:
        async with asyncio.timeout(_READ_TIMEOUT_S):
            client = await clients.client_in("service-quotas", region, url)
            listed: list[dict[str, Any]] = []
            pages = client.get_paginator("list_service_quotas")
            async for page in pages.paginate(ServiceCode=SERVICE_QUOTAS_CODE):
                listed += page.get("Quotas", [])
    except ClientError as e:
        return {}, f"Service Quotas: {e.response.get('Error', {}).get('Code', 'error')}"
    except Exception as e:  # unreachable, no credentials, timed out: the published defaults
        return {}, f"Service Quotas: {type(e).__name__}"
    return _by_account(listed), ""


def _by_account(listed: Iterable[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """{account id: {our name: value per second or count}}, the first quota of each name."""
    found: dict[str, dict[str, float]] = {}
    for quota in listed:
        name = _name(str(quota.get("QuotaName", "")))
        arn = str(quota.get("QuotaArn", "")).split(":")
        value = quota.get("Value")
        if name is None or len(arn) < 6 or not isinstance(value, int | float) or value <= 0:
            continue
        if name != "active_sessions":
            value /= _period_s(quota.get("Period") or {})
        found.setdefault(arn[4], {}).setdefault(name, value)
    return found


def _name(quota_name: str) -> str | None:
    name = " ".join(quota_name.lower().replace("-", " ").split())
    if any(other in name for other in _OTHER_SERVICES):
        return None
    if "new" in name and "session creation" in name:
        return "new_sessions_per_second"
    if "data plane" in name:
        return "data_plane_tps"
    if "active session" in name:
        return "active_sessions"
    return None


def _period_s(period: Mapping[str, Any]) -> float:
    """A rate quota's period in seconds (none given: per second, as AgentCore's are)."""
    unit = _SECONDS.get(str(period.get("PeriodUnit", "SECOND")), 1)
    return unit * float(period.get("PeriodValue") or 1)


def _quotas_of(
    account_id: str, region: str, listed: Mapping[str, dict[str, float]], why: str
) -> AccountQuotas:
    mine = listed.get(account_id, {})
    if not mine and listed and not why:
        why = f"Service Quotas answers for account {', '.join(sorted(listed))}"
    defaults = published(region, why or f"not listed by {SERVICE_QUOTAS}")

    def one(name: str, default: Quota) -> Quota:
        return Quota(mine[name], SERVICE_QUOTAS) if name in mine else default

    return AccountQuotas(
        one("new_sessions_per_second", defaults.new_sessions_per_second),
        one("data_plane_tps", defaults.data_plane_tps),
        one("active_sessions", defaults.active_sessions),
    )


def limits_of(account: str, q: AccountQuotas) -> RuntimeLimits:
    """The runtime's limits from its account's quotas, with one phrase saying their sources."""
    values = (
        (q.new_sessions_per_second, "new sessions/s"),
        (q.data_plane_tps, "calls/s"),
        (q.active_sessions, "live sessions"),
    )
    sources = {quota.source for quota, _ in values}
    if len(sources) == 1:
        source = sources.pop()
    else:
        source = "; ".join(f"{label}: {quota.source}" for quota, label in values)
    return RuntimeLimits(
        start_rate=q.new_sessions_per_second.value,
        call_rate=q.data_plane_tps.value,
        max_live_sessions=max(1, int(q.active_sessions.value)),
        pool=account,
        source=source,
    )
