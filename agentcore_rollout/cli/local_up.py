"""The `local up` command: start the embedded stack, print its endpoints (a table on stderr,
`agentcore.env` lines on stdout), keep it up until Ctrl-C."""

from __future__ import annotations

import asyncio

from rich.table import Table

from .. import Config
from .views import console


async def local_up(config: Config, *, interrupted: asyncio.Event) -> None:
    from ..local.stack import LocalStack  # lazily: it loads moto, numpy, the gateway

    async with LocalStack(config.local) as local:
        engine_cfg = local.engine_config(config.engine)
        table = Table(title="local stack (Ctrl-C to stop)", show_header=False, title_justify="left")
        table.add_row("S3 + SQS (moto)", local.moto.url)
        table.add_row("AgentCore Runtime emulator", engine_cfg.endpoints.agentcore or "")
        table.add_row("policy (router or worker)", local.policy_url)
        if engine_cfg.gateway is not None:
            table.add_row("token-capture gateway", engine_cfg.gateway.url)
        table.add_row("bucket / prefix", f"{engine_cfg.bucket} / {engine_cfg.prefix}")
        table.add_row("queue", engine_cfg.queue_url or "")
        table.add_row("runtime ARN", engine_cfg.runtime_arn or "")
        console.print(table)
        print("\n".join(local.env_lines()), flush=True)
        await interrupted.wait()
