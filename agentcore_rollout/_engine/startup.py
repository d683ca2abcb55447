"""What the engine checks and builds before its first request: that its bucket and queue
answer, one dispatcher endpoint per runtime endpoint, and each account's limits."""

from __future__ import annotations

from botocore.exceptions import BotoCoreError, ClientError

from .._aws import AwsClients
from .._dispatch.dispatcher import RuntimeEndpoint
from .._redact import redact
from ..config import ConfigError, EngineConfig
from ..contract import listing_prefix
from ..runtimes.agentcore import AgentCoreRuntime
from ..runtimes.agentcore_quotas import Limits, account_quotas, describe, published
from ..runtimes.base import SandboxRuntime


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


async def runtime_endpoints(
    clients: AwsClients, cfg: EngineConfig, runtime: SandboxRuntime | None
) -> list[RuntimeEndpoint]:
    """One per runtime endpoint (`engine.runtimes`, or `runtime_arn` + `qualifier`), each
    with its own live bound and its account; a runtime given to the engine is the one."""
    targets = cfg.all_runtimes
    if runtime is not None:
        if len(targets) > 1:
            raise ConfigError("engine.runtimes: a runtime given to the engine is one endpoint")
        return [RuntimeEndpoint(targets[0].name if targets else "runtime", runtime)]
    endpoints = []
    for t in targets:
        client = await clients.agentcore_in(
            t.region, t.data_plane_url or cfg.service_urls.agentcore
        )
        runtime = AgentCoreRuntime(client, t.arn, t.qualifier)
        endpoints.append(
            RuntimeEndpoint(t.name, runtime, t.max_live_sessions, t.account, t.environment)
        )
    return endpoints


async def account_limits(
    clients: AwsClients, cfg: EngineConfig, runtime: SandboxRuntime | None
) -> tuple[dict[str, Limits], str]:
    """Each account's limits: `engine.dispatch`'s values, else its quotas, read from Service
    Quotas where it answers, else the published ones; and the one line saying so."""
    if runtime is not None:  # not necessarily AgentCore's: nobody to ask
        quotas = {"": published(cfg.region, "a runtime given to the engine")}
    else:
        quotas = await account_quotas(clients, cfg)
    limits = {account: Limits.of(q, cfg.dispatch) for account, q in quotas.items()}
    return limits, describe(quotas, cfg.dispatch)
