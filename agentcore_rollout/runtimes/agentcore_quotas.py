"""AgentCore Runtime's quotas as the account has them, read once at start-up.

Why: AgentCore's quotas are adjustable, per account and region, and its two rates are the
account's, shared by every endpoint and runtime there (since August 2026): new sessions
(published: 25/s) and data-plane calls, invokes and stops together (1,000/s); beside them the
active sessions (5,000 in us-east-1 and us-west-2, 2,500 elsewhere). Paced by the published
figures alone, a run would start sessions below what a raised account allows, or be throttled
by a lowered one.

So, for each region of the engine's runtimes, Service Quotas is asked once (ListServiceQuotas,
service code `bedrock-agentcore`, every page). Credentials are one account's, so its answer is
that account's; each quota's ARN names it, and its values go to the runtimes of that account
and region. Every value it does not give is the published default, named as such with why: no
permission or no answer (any error), a quota not listed, another account's runtime, AgentCore
at a URL not AWS's (an emulator, a stand-in: Service Quotas is then asked only at
`engine.service_urls.service_quotas`).
Quota codes are not published, so quotas are matched by name, leniently (case and hyphens
aside): "new" with "session creation" is the start rate, "data plane" the data-plane rate,
"active session" the live bound; a name naming another AgentCore service (Browser, Code
Interpreter, Gateway, Memory, Identity, ...) is none of them. A rate given per minute (its
`Period`) is turned into one per second.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from botocore.exceptions import ClientError

from ..config import DispatchConfig, EngineConfig, RuntimeTarget
from .agentcore import (
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


@dataclass(frozen=True)
class Limits:
    """What the dispatcher holds one account and region to: the configured values
    (`engine.dispatch`), else the account's quotas."""

    start_rate: float
    data_plane_tps: float
    max_live_sessions: int

    @classmethod
    def of(cls, quotas: AccountQuotas, cfg: DispatchConfig) -> Limits:
        return cls(
            cfg.start_rate or quotas.new_sessions_per_second.value,
            quotas.data_plane_tps.value,
            cfg.max_live_sessions or max(1, int(quotas.active_sessions.value)),
        )


def published(region: str, why: str = "") -> AccountQuotas:
    """The published defaults for an account in `region`, sourced with `why`."""
    source = f"{PUBLISHED} ({why})" if why else PUBLISHED
    return AccountQuotas(
        Quota(NEW_SESSIONS_PER_SECOND, source),
        Quota(DATA_PLANE_TPS, source),
        Quota(active_sessions(region), source),
    )


async def account_quotas(clients: Any, config: EngineConfig) -> dict[str, AccountQuotas]:
    """Each runtime account's quotas (`<account id>:<region>`, `RuntimeTarget.account`): from
    Service Quotas where it answers for that account, else the published defaults. Never
    raises: whatever goes wrong leaves the published defaults, and says why."""
    targets = config.all_runtimes
    url = config.service_urls.service_quotas
    asked = sorted({t.region for t in targets if url or await _at_aws(clients, config, t)})
    answers = await asyncio.gather(*(_read(clients, region, url) for region in asked))
    by_region = dict(zip(asked, answers, strict=True))
    quotas = {}
    for account in sorted({t.account for t in targets}):
        account_id, region = account.split(":")
        listed, why = by_region.get(region, ({}, _OWN_URL))
        quotas[account] = _quotas_of(account_id, region, listed, why)
    return quotas


def describe(quotas: Mapping[str, AccountQuotas], cfg: DispatchConfig) -> str:
    """One line: the values in force in each account and region, and where each came from."""
    return "quotas in force: " + "; ".join(
        _described(account, q, cfg) for account, q in sorted(quotas.items())
    )


async def _at_aws(clients: Any, config: EngineConfig, target: RuntimeTarget) -> bool:
    """The runtime's data plane is AWS's own (however its URL was set): Service Quotas at
    AWS's knows its quotas; of an emulator or a stand-in it knows nothing."""
    url = target.data_plane_url or config.service_urls.agentcore
    client = await clients.agentcore_in(target.region, url)
    host = urlsplit(client.meta.endpoint_url).hostname or ""
    return host.endswith(_AWS_DOMAINS)


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


def _described(account: str, q: AccountQuotas, cfg: DispatchConfig) -> str:
    account_id, _, region = account.partition(":")
    values = (
        (q.new_sessions_per_second, cfg.start_rate, "new sessions/s", "start_rate"),
        (q.data_plane_tps, None, "data-plane calls/s", ""),
        (q.active_sessions, cfg.max_live_sessions, "live sessions", "max_live_sessions"),
    )
    configured = cfg.start_rate is not None or cfg.max_live_sessions is not None
    sources = {quota.source for quota, *_ in values}
    shared = sources.pop() if len(sources) == 1 and not configured else None
    parts = []
    for quota, configured, label, key in values:
        if configured is not None:
            said = f"engine.dispatch.{key}; the quota: {quota.value:g}, {quota.source}"
            parts.append(f"{configured:g} {label} ({said})")
        else:
            parts.append(f"{quota.value:g} {label}" + ("" if shared else f" ({quota.source})"))
    where = f"{region}/{account_id}" if region else account or "runtime"
    return f"{where}: {', '.join(parts)}" + (f" ({shared})" if shared else "")
