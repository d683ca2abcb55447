"""The engine's AWS clients: aiobotocore's, all from one session, so every call reads the user's AWS
configuration as the SDK reads it (docs/aws.md), with a count of every API call.

On top, one attempt per AgentCore call: the dispatcher retries those itself, because it must slow
its start rate on throttling rather than just wait. S3 and SQS retry in botocore's standard mode
with 5 attempts, unless the user chose a mode or a number of attempts."""

from __future__ import annotations

import os
from collections import Counter
from contextlib import AsyncExitStack
from typing import Any

from aiobotocore.config import AioConfig
from aiobotocore.session import AioSession, get_session

from .config import EngineConfig

_CONNECT_TIMEOUT_S, _READ_TIMEOUT_S = 10, 120
_ATTEMPTS = 5
_MAX_POOL_CONNECTIONS = 64  # per client: 16 downloads and 400 starts/s (bench/scale.py) unqueued
# AgentCore's clients: an invocation that creates a session holds its connection through the
# cold start, so the pool must not bound what the dispatcher lets be in flight (starts:
# ceil(start_rate x session_start_time) an endpoint; calls and stops are short). At 64 a 15 s
# cold start held the engine to 64 / 15 = 4.3 starts a second (bench/warm.py). Connections
# open only as needed.
_AGENTCORE_POOL_CONNECTIONS = 4096


class AwsClients:
    """Async context manager holding `s3` and `sqs` clients for the engine's region, and the
    AgentCore data-plane clients of its runtimes (`agentcore_in`), one per region and URL."""

    def __init__(self, config: EngineConfig) -> None:
        self._config = config
        self._stack = AsyncExitStack()
        self.api_calls: Counter[str] = Counter()
        self.s3: Any = None
        self.sqs: Any = None
        self._clients: dict[tuple[str, str, str | None], Any] = {}
        self._session: AioSession | None = None

    async def __aenter__(self) -> AwsClients:
        self._session = get_session()
        cfg = self._config
        try:
            self.s3 = await self.client_in("s3", cfg.region, cfg.service_urls.s3)
            self.sqs = await self.client_in("sqs", cfg.region, cfg.service_urls.sqs)
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    async def agentcore_in(self, region: str, url: str | None) -> Any:
        """The AgentCore data-plane client for a runtime in `region` at `url` (None:
        `AWS_ENDPOINT_URL_BEDROCK_AGENTCORE` or AWS's): runtimes may live in several regions
        or behind several URLs."""
        return await self.client_in("bedrock-agentcore", region, url)

    async def client_in(self, service: str, region: str, url: str | None) -> Any:
        """`service`'s client for `region` at `url` (None: as the AWS configuration
        says), made once and kept (its connections stay open) until the context exits."""
        key = (service, region, url)
        if key not in self._clients:
            assert self._session is not None, "AwsClients is used inside `async with`"
            client = await self._stack.enter_async_context(
                self._session.create_client(
                    service,
                    region_name=region,
                    endpoint_url=url,
                    config=self._client_config(service, url),
                )
            )
            client.meta.events.register(
                f"before-send.{client.meta.service_model.service_name}", self._count
            )
            self._clients[key] = client
        return self._clients[key]

    def _client_config(self, service: str, url: str | None) -> AioConfig:
        retries, timeouts, pool = self._retries(), {}, _MAX_POOL_CONNECTIONS
        if service == "bedrock-agentcore":
            retries["total_max_attempts"] = 1
            timeouts = {"connect_timeout": _CONNECT_TIMEOUT_S, "read_timeout": _READ_TIMEOUT_S}
            pool = _AGENTCORE_POOL_CONNECTIONS
        return AioConfig(
            max_pool_connections=pool,
            retries=retries,
            s3={"addressing_style": "path"} if service == "s3" and url else None,
            **timeouts,
        )

    def _retries(self) -> dict[str, Any]:
        """Standard mode, 5 attempts, except where the user's configuration says otherwise."""
        assert self._session is not None
        profile = self._session.get_scoped_config()
        retries: dict[str, Any] = {}
        if not (os.environ.get("AWS_RETRY_MODE") or profile.get("retry_mode")):
            retries["mode"] = "standard"
        if not (os.environ.get("AWS_MAX_ATTEMPTS") or profile.get("max_attempts")):
            retries["total_max_attempts"] = _ATTEMPTS
        return retries

    def _count(self, event_name: str, **_: Any) -> None:
        # event_name is "before-send.<service>.<Operation>"; one per HTTP attempt
        _, service, operation = event_name.split(".", 2)
        self.api_calls[f"{service}:{operation}"] += 1
