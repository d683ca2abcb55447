"""AgentCore's quotas as the account has them: read from Service Quotas at start-up (the
emulator answers ListServiceQuotas through botocore's own client), in force in the dispatcher
and named, with where each came from, in one line; whatever cannot be read is the published
default, named as such."""

from __future__ import annotations

import logging

import pytest

from agentcore_rollout import RolloutEngine, RolloutRequest
from agentcore_rollout._engine.startup import describe
from agentcore_rollout.config import DispatchConfig
from agentcore_rollout.runtimes.agentcore.quotas import (
    AccountQuotas,
    Quota,
    _by_account,
    limits_of,
    published,
)

from .conftest import RUNTIME_ARN, engine_config

pytestmark = pytest.mark.component

WHERE = "123456789012:us-east-1"
OTHER_ACCOUNT = RUNTIME_ARN.replace("123456789012", "210987654321")


async def _started(moto, channel, emu, caplog, **overrides) -> tuple[str, dict[str, float]]:
    """The start-up line of an engine whose quotas are read from `emu` (unless overridden),
    and the limits it holds each account to; one rollout ends ok under them."""
    urls = {"s3": moto.url, "sqs": moto.url, "agentcore": emu.url, "service_quotas": emu.url}
    overrides = {"start_rate": None, "max_live_sessions": None, "service_urls": urls} | overrides
    cfg = engine_config(moto, channel, emu, **overrides)
    with caplog.at_level(logging.INFO, logger="agentcore_rollout.engine"):
        async with RolloutEngine(cfg) as engine:
            batch = await engine.rollout([RolloutRequest({"a": 1, "b": 2}, input_id="q")])
            limits = engine.stats().pool_limits
    assert batch.counts["ok"] == 1
    (line,) = [r.getMessage() for r in caplog.records if "quotas in force" in r.getMessage()]
    return line, limits


async def test_the_accounts_quotas_from_service_quotas_are_in_force_and_named(
    moto, channel, emulator, caplog
):
    emu = await emulator(new_sessions_per_second=40, data_plane_tps=300, max_sessions=30)
    line, limits = await _started(moto, channel, emu, caplog)
    assert line == (
        f"quotas in force: {WHERE}: 40 new sessions/s, 300 calls/s, 30 live sessions "
        "(Service Quotas)"
    )
    assert limits == {
        "123456789012:us-east-1/start_rate": 40.0,
        "123456789012:us-east-1/call_rate": 300.0,
        "123456789012:us-east-1/max_live_sessions": 30.0,
    }
    assert emu.counts["ListServiceQuotas"] == 1


async def test_a_configured_value_is_used_and_the_quota_named_beside_it(
    moto, channel, emulator, caplog
):
    emu = await emulator(new_sessions_per_second=None, max_sessions=30)  # a rate not listed
    line, limits = await _started(moto, channel, emu, caplog, max_live_sessions=8)
    assert line == (
        f"quotas in force: {WHERE}: 25 new sessions/s, 1000 calls/s, 8 live sessions "
        "(engine.dispatch.max_live_sessions; reported: 30) (new sessions/s: published default "
        "(not listed by Service Quotas); calls/s: Service Quotas; live sessions: Service Quotas)"
    )
    assert limits["123456789012:us-east-1/max_live_sessions"] == 8.0


@pytest.mark.parametrize("why", ["AccessDeniedException", "EndpointConnectionError"])
async def test_no_permission_or_no_answer_leaves_the_published_defaults_named_as_such(
    moto, channel, emulator, caplog, monkeypatch, why
):
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # unreachable: no retries to wait out
    emu = await emulator(new_sessions_per_second=40, service_quotas=why != "AccessDeniedException")
    closed = "http://127.0.0.1:9"  # discard: nothing listens there
    urls = {"s3": moto.url, "sqs": moto.url, "agentcore": emu.url, "service_quotas": closed}
    unreachable = {"service_urls": urls} if why == "EndpointConnectionError" else {}
    line, limits = await _started(moto, channel, emu, caplog, **unreachable)
    assert line == (
        f"quotas in force: {WHERE}: 25 new sessions/s, 1000 calls/s, 5000 live "
        f"sessions (published default (Service Quotas: {why}))"
    )
    assert limits["123456789012:us-east-1/start_rate"] == 25.0


async def test_other_accounts_and_agentcore_at_its_own_url_get_the_published_defaults(
    moto, channel, emulator, caplog
):
    emu = await emulator(runtime_arns=(RUNTIME_ARN, OTHER_ACCOUNT), new_sessions_per_second=40)
    runtimes = [{"arn": RUNTIME_ARN}, {"arn": OTHER_ACCOUNT}]
    line, limits = await _started(moto, channel, emu, caplog, runtime_arn=None, runtimes=runtimes)
    assert f"{WHERE}: 40 new sessions/s, 1000 calls/s, 5000 live sessions (Service " in line
    assert line.endswith(
        "210987654321:us-east-1: 25 new sessions/s, 1000 calls/s, 5000 live sessions "
        "(published default (Service Quotas answers for account 123456789012))"
    )
    assert limits["210987654321:us-east-1/start_rate"] == 25.0
    caplog.clear()
    emu.counts.clear()
    urls = {"s3": moto.url, "sqs": moto.url, "agentcore": emu.url}  # none for the quotas
    line, _ = await _started(moto, channel, emu, caplog, service_urls=urls)
    assert line.endswith(
        "(published default (AgentCore at its own URL; no engine.service_urls.service_quotas))"
    )
    assert emu.counts["ListServiceQuotas"] == 0  # AWS's Service Quotas knows nothing of it


def test_quotas_are_matched_by_name_leniently_and_rates_read_per_second():
    def quota(name: str, value: float, **more: object) -> dict[str, object]:
        arn = f"arn:aws:servicequotas:us-west-2:111122223333:bedrock-agentcore/L-{len(name)}"
        return {"QuotaName": name, "Value": value, "QuotaArn": arn, **more}

    listed = [
        quota("Rate of new browser session creation", 9),  # another service's
        quota("Rate of NEW runtime session-creation", 600, Period={"PeriodUnit": "MINUTE"}),
        quota("Rate of Runtime data-plane APIs", 2000),
        quota("Active session workloads per account", 4000),
        quota("Active session workloads per account", 1),  # the first of a name wins
        quota("Rate of Runtime data plane APIs", 0),  # no value is no quota
        {"QuotaName": "Rate of Runtime data plane APIs", "Value": 5},  # whose? not ours
    ]
    assert _by_account(listed) == {
        "111122223333": {
            "new_sessions_per_second": 10.0,
            "data_plane_tps": 2000,
            "active_sessions": 4000,
        }
    }


def test_the_start_up_line_says_each_value_and_its_source():
    assert published("eu-west-1").active_sessions.value == 2500  # 5,000 only in two regions
    account = "123456789012:us-west-2"
    quotas = AccountQuotas(
        Quota(50, "Service Quotas"), Quota(1000, "published default"), Quota(5000, "x")
    )
    said = describe({account: limits_of(account, quotas)}, DispatchConfig(start_rate=5))
    assert said == (
        "quotas in force: 123456789012:us-west-2: 5 new sessions/s (engine.dispatch.start_rate; "
        "reported: 50), 1000 calls/s, 5000 live sessions (new sessions/s: Service Quotas; "
        "calls/s: published default; live sessions: x)"
    )
