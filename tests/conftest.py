"""Shared fixtures: one moto server process per test session, a fresh bucket/queue pair per
test, and a factory for the AgentCore Runtime emulator."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from agentcore_rollout.config import EngineConfig
from agentcore_rollout.local.moto import (
    LOCAL_CREDENTIALS,
    MotoServer,
    ResultsChannel,
    provision_results_channel,
)
from agentcore_rollout.local.runtime import EmulatorConfig, RuntimeEmulator
from agentcore_rollout.runtimes.agentcore.published import active_sessions

from .factories import flat_config

ROOT = Path(__file__).resolve().parent.parent
REGION = "us-east-1"
RUNTIME_ARN = "arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/test_agent-abc123"


@pytest.fixture(scope="session", autouse=True)
def _aws_env() -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.update(LOCAL_CREDENTIALS)
    os.environ["AWS_DEFAULT_REGION"] = REGION
    os.environ.pop("AWS_PROFILE", None)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="session")
def moto() -> Iterator[MotoServer]:
    with MotoServer() as server:
        yield server


@pytest.fixture
def channel(moto: MotoServer) -> ResultsChannel:
    name = f"t-{uuid.uuid4().hex[:12]}"
    return provision_results_channel(
        moto.client("s3"), moto.client("sqs"), bucket=name, prefix="rollouts", queue=name
    )


def agent_env(moto: MotoServer) -> dict[str, str]:
    return {
        **LOCAL_CREDENTIALS,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_ENDPOINT_URL_S3": moto.url,
        "AWS_ENDPOINT_URL_SQS": moto.url,
        "PYTHONPATH": str(ROOT),
    }


@pytest.fixture
def agent_endpoints(moto: MotoServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process agents read endpoints from the standard AWS environment variables."""
    for k, v in agent_env(moto).items():
        monkeypatch.setenv(k, v)


@pytest.fixture
async def emulator(moto: MotoServer, agent_endpoints: None) -> AsyncIterator[Any]:
    """`emu = await emulator(mode=..., ...)`: started now, stopped after the test."""
    started: list[RuntimeEmulator] = []

    async def make(**overrides: Any) -> RuntimeEmulator:
        base: dict[str, Any] = {
            "app": "tests.agents.basic:app",
            "mode": "in_process",
            "runtime_arns": (RUNTIME_ARN,),  # the emulator answers ResourceNotFound for others
            "max_sessions": active_sessions(REGION),  # the service's quota, not a laptop's
            "env": agent_env(moto),
        }
        emu = RuntimeEmulator(EmulatorConfig(**(base | overrides)))
        await emu.start()
        started.append(emu)
        return emu

    yield make
    for emu in started:
        await emu.stop()


def engine_config(
    moto: MotoServer, channel: ResultsChannel, emu: RuntimeEmulator, **overrides: Any
) -> EngineConfig:
    base: dict[str, Any] = {
        "exp_id": "exp1",
        "region": REGION,
        "bucket": channel.bucket,
        "prefix": channel.prefix,
        "queue_url": channel.queue_url,
        "runtime_arn": RUNTIME_ARN,
        "service_urls": {"s3": moto.url, "sqs": moto.url, "agentcore": emu.url},
        "start_rate": 25.0,  # the emulator's account quota (AgentCore's published)
        "session_start_time": 0.5,
        "max_live_sessions": 64,
        "rollout_timeout": 30.0,
        "result_grace": 2.0,
        "reconcile_before": 1.0,
        "wait_time": 1,
        "backoff_base": 0.05,
        "backoff_max": 0.5,
    }
    return flat_config(**(base | overrides))


TIERS = ("unit", "component", "e2e")  # pyproject's markers; `make check` runs all but e2e


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by them
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test is in one tier: its module's `pytestmark`, or its own mark (or its
    parameter's) over that. The tier is left as the test's only tier marker, so `-m` sees
    the nearest one; a test with none stops the run, so none slips out of `make check`."""
    tiers = {
        item: next((m.name for m in item.iter_markers() if m.name in TIERS), None) for item in items
    }
    untiered = [item.nodeid for item, tier in tiers.items() if tier is None]
    if untiered:
        listed = "\n  ".join(untiered[:20])
        raise pytest.UsageError(f"tests with none of the tiers {', '.join(TIERS)}:\n  {listed}")
    for item, tier in tiers.items():
        for node in item.listchain():
            node.own_markers[:] = [m for m in node.own_markers if m.name not in TIERS]
        item.add_marker(tier)
