"""What the engine checks and builds before its first request: that its bucket and queue
answer, its runtimes (AgentCore's from the config unless given), and their limits."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace

from botocore.exceptions import BotoCoreError, ClientError

from .._aws import AwsClients
from .._dispatch.endpoints import RuntimeEndpoint
from .._redact import redact
from ..config import ConfigError, DispatchConfig, EngineConfig
from ..contract import listing_prefix
from ..runtimes.agentcore import agentcore_runtimes
from ..runtimes.base import RuntimeLimits, SandboxRuntime


async def preflight(clients: AwsClients, cfg: EngineConfig) -> None:
    """Fail at once, in one line, on a missing bucket or queue or an unreachable endpoint,
    rather than after a batch of rollouts has nowhere to report."""
    checks = [
        (  # ListBucket under the prefix: what the least-privilege trainer role may do
            "bucket",
            "s3",
            lambda: clients.s3.list_objects_v2(
                Bucket=cfg.bucket, Prefix=listing_prefix(cfg.prefix), MaxKeys=1
            ),
        ),
        (
            "queue_url",
            "sqs",
            lambda: clients.sqs.get_queue_attributes(
                QueueUrl=cfg.queue_url, AttributeNames=["QueueArn"]
            ),
        ),
    ]
    for key, service, call in checks:
        try:
            await call()
        except ClientError as e:
            code = e.response.get("Error", {}).get("Code", "error")
            raise ConfigError(
                f"config: engine.{key}: {getattr(cfg, key)!r} not found or no access ({code})"
            ) from None
        except (BotoCoreError, OSError) as e:
            where = getattr(clients, service).meta.endpoint_url
            raise ConfigError(redact(f"config: cannot reach {where}: {e}")) from None


async def runtimes_of(
    clients: AwsClients, cfg: EngineConfig, given: Sequence[SandboxRuntime]
) -> list[SandboxRuntime]:
    """The runtimes given to the engine, else AgentCore's of `engine.runtimes`."""
    if not given:
        return list(await agentcore_runtimes(clients, cfg))
    names = [runtime.name for runtime in given]
    if twice := sorted({n for n in names if names.count(n) > 1}):
        raise ConfigError(f"runtimes: {twice[0]!r} names two runtimes; each needs its own name")
    return list(given)


async def endpoints_and_limits(
    runtimes: Sequence[SandboxRuntime], cfg: DispatchConfig
) -> tuple[list[RuntimeEndpoint], dict[str, RuntimeLimits], str]:
    """Each runtime as the dispatcher's endpoint, each pool's limits (`engine.dispatch`'s
    values, else what its runtimes report), and the one line saying them."""
    reported = await asyncio.gather(*(runtime.limits() for runtime in runtimes))
    pools: dict[str, RuntimeLimits] = {}
    for limits in reported:
        pools.setdefault(limits.pool, limits)
    endpoints = [
        RuntimeEndpoint(rt.name, rt, rt.max_live_sessions, limits.pool, rt.environment)
        for rt, limits in zip(runtimes, reported, strict=True)
    ]
    in_force = {pool: _within(limits, cfg) for pool, limits in pools.items()}
    return endpoints, in_force, describe(pools, cfg)


def describe(pools: dict[str, RuntimeLimits], cfg: DispatchConfig) -> str:
    """One line: the values in force in each pool, and where each came from."""
    return "quotas in force: " + "; ".join(
        _described(limits, cfg) for _, limits in sorted(pools.items())
    )


def _within(limits: RuntimeLimits, cfg: DispatchConfig) -> RuntimeLimits:
    return replace(
        limits,
        start_rate=cfg.start_rate or limits.start_rate,
        max_live_sessions=cfg.max_live_sessions or limits.max_live_sessions,
    )


def _described(limits: RuntimeLimits, cfg: DispatchConfig) -> str:
    values = (
        (limits.start_rate, cfg.start_rate, "new sessions/s", "start_rate"),
        (limits.call_rate, None, "calls/s", ""),
        (limits.max_live_sessions, cfg.max_live_sessions, "live sessions", "max_live_sessions"),
    )
    parts = []
    for reported, configured, label, key in values:
        if configured is None:
            parts.append(f"{reported:g} {label}")
        else:
            parts.append(f"{configured:g} {label} (engine.dispatch.{key}; reported: {reported:g})")
    return f"{limits.pool}: {', '.join(parts)}" + (f" ({limits.source})" if limits.source else "")
