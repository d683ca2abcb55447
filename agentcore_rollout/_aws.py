"""aiobotocore clients for S3, SQS and the AgentCore data plane, from one session, with the
endpoints, pool sizes and retry modes the engine needs, and a count of every API call."""

from __future__ import annotations

from collections import Counter
from contextlib import AsyncExitStack
from typing import Any

import botocore
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session

from .config import EngineConfig

_USER_AGENT = f"agentcore-rollout botocore/{botocore.__version__}"
"""A fixed User-Agent: botocore otherwise rebuilds and sanitizes its ~20-part string on every
call, about 8% of the engine's CPU per rollout (bench/scale.py, profiled)."""


class AwsClients:
    """Async context manager holding `s3`, `sqs` and `agentcore` clients.

    S3 and SQS keep botocore's standard retries (transient 5xx, SlowDown). The AgentCore
    client makes one attempt per call: the dispatcher owns retries there, because it must
    slow the start rate down on throttling rather than just wait.
    """

    def __init__(self, config: EngineConfig) -> None:
        self._config = config
        self._stack = AsyncExitStack()
        self.api_calls: Counter[str] = Counter()
        self.s3: Any = None
        self.sqs: Any = None
        self.agentcore: Any = None
        self._agentcore: dict[tuple[str, str | None], Any] = {}
        self._session: Any = None
        self._single: AioConfig | None = None

    async def __aenter__(self) -> AwsClients:
        self._session = session = get_session()
        cfg = self._config
        pool = cfg.max_pool_connections
        standard = AioConfig(
            user_agent=_USER_AGENT,
            max_pool_connections=pool,
            retries={"mode": "standard", "max_attempts": 5},
            s3={"addressing_style": "path"} if cfg.endpoints.s3 else None,
        )
        single = AioConfig(
            user_agent=_USER_AGENT,
            max_pool_connections=pool,
            retries={"mode": "standard", "total_max_attempts": 1},
            connect_timeout=10,
            read_timeout=120,
        )
        self._single = single
        try:
            self.s3 = await self._client(session, "s3", cfg.endpoints.s3, standard)
            self.sqs = await self._client(session, "sqs", cfg.endpoints.sqs, standard)
            self.agentcore = await self._client(
                session, "bedrock-agentcore", cfg.endpoints.agentcore, single
            )
            self._agentcore[(cfg.region, cfg.endpoints.agentcore)] = self.agentcore
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    async def agentcore_in(self, region: str, endpoint: str | None) -> Any:
        """The AgentCore data-plane client for a runtime in `region` at `endpoint` (None:
        AWS's), one per pair: runtimes may live in several regions or behind several URLs."""
        key = (region, endpoint)
        if key not in self._agentcore:
            assert self._single is not None  # entered
            self._agentcore[key] = await self._client(
                self._session, "bedrock-agentcore", endpoint, self._single, region=region
            )
        return self._agentcore[key]

    async def _client(
        self,
        session: Any,
        service: str,
        endpoint: str | None,
        cfg: AioConfig,
        *,
        region: str | None = None,
    ) -> Any:
        client = await self._stack.enter_async_context(
            session.create_client(
                service,
                region_name=region or self._config.region,
                endpoint_url=endpoint,
                config=cfg,
            )
        )
        client.meta.events.register(
            f"before-send.{client.meta.service_model.service_name}", self._count
        )
        return client

    def _count(self, event_name: str, **_: Any) -> None:
        # event_name is "before-send.<service>.<Operation>"; one per HTTP attempt
        _, service, operation = event_name.split(".", 2)
        self.api_calls[f"{service}:{operation}"] += 1
