"""The engine's AWS clients: aiobotocore's for S3 and SQS, and a signed HTTP client for the
AgentCore data plane, all from one session, with the endpoints, pool sizes and retry modes the
engine needs, and a count of every API call."""

from __future__ import annotations

import os
import ssl
import urllib.request
from collections import Counter
from collections.abc import Mapping
from contextlib import AsyncExitStack
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import botocore
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import NoCredentialsError
from botocore.httpsession import get_cert_path
from yarl import URL

from ._sigv4 import SigV4
from ._sqs import QueueClient
from .config import EngineConfig

_USER_AGENT = f"agentcore-rollout botocore/{botocore.__version__}"
"""A fixed User-Agent: botocore otherwise rebuilds and sanitizes its ~20-part string on every
call, about 8% of the engine's CPU per rollout (bench/scale.py, profiled)."""
_CONNECT_TIMEOUT_S, _READ_TIMEOUT_S = 10, 120


class SignedClient:
    """One AWS service's API called directly: each request signed (SigV4, as botocore signs
    it) with the session's credentials (refreshed as they expire), sent with aiohttp.

    Why: the engine makes two AgentCore calls and half an SQS call per rollout, and botocore's
    call pipeline (parameter validation, a dozen event hooks, an endpoint ruleset, `email`
    header objects, the response parser) costs about 1 ms of CPU a call; this, 0.2-0.4
    (`bench/calls.py`). What stays botocore's: the credentials and the endpoint
    (resolved once, by a botocore client). The caller builds the path and reads the answer.
    """

    def __init__(
        self,
        http: aiohttp.ClientSession,
        service: str,
        region: str,
        endpoint_url: str,
        credentials: Any,
        calls: Counter[str],
    ) -> None:
        self.endpoint_url = endpoint_url.rstrip("/")
        self._http = http
        self._service = service
        self._credentials = credentials
        self._calls = calls
        self._proxy = _proxy_for(self.endpoint_url)
        self._signer = SigV4(service, region, self.endpoint_url)

    async def post(
        self, operation: str, path: str, body: bytes, headers: Mapping[str, str]
    ) -> tuple[int, Mapping[str, str], bytes]:
        """POST `body` to `path` (percent-encoded, with its query): status, headers, body.

        Raises botocore's errors for credentials (nothing sent), aiohttp's for transport."""
        if self._credentials is None:
            raise NoCredentialsError()
        frozen = await self._credentials.get_frozen_credentials()
        signed = self._signer.sign(frozen, "POST", path, headers, body)
        self._calls[f"{self._service}:{operation}"] += 1
        # encoded=True: sent byte for byte as signed (yarl would otherwise unquote the path)
        async with self._http.post(
            URL(self.endpoint_url + path, encoded=True),
            data=body,
            headers=signed,
            proxy=self._proxy,
        ) as response:
            return response.status, response.headers, await response.read()


class AwsClients:
    """Async context manager holding `s3` and `sqs` (aiobotocore, for everything but the
    per-rollout calls), `queue` (a `QueueClient`: SQS's calls on the results path, signed) and
    `agentcore` (a `SignedClient` for the data plane of the engine's region and endpoint).

    S3 and SQS keep botocore's standard retries (transient 5xx, SlowDown; `queue` the same in
    small). AgentCore calls make one attempt each: the dispatcher owns retries there, because
    it must slow the start rate down on throttling rather than just wait.
    """

    def __init__(self, config: EngineConfig) -> None:
        self._config = config
        self._stack = AsyncExitStack()
        self.api_calls: Counter[str] = Counter()
        self.s3: Any = None
        self.sqs: Any = None
        self.queue: QueueClient | None = None
        self.agentcore: SignedClient | None = None
        self._agentcore: dict[tuple[str, str | None], SignedClient] = {}
        self._session: Any = None
        self._credentials: Any = None
        self._http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> AwsClients:
        self._session = session = get_session()
        cfg = self._config
        standard = AioConfig(
            user_agent=_USER_AGENT,
            max_pool_connections=cfg.max_pool_connections,
            retries={"mode": "standard", "max_attempts": 5},
            s3={"addressing_style": "path"} if cfg.endpoints.s3 else None,
        )
        try:
            self.s3 = await self._client("s3", cfg.endpoints.s3, standard)
            self.sqs = await self._client("sqs", cfg.endpoints.sqs, standard)
            self._credentials = await session.get_credentials()
            self._http = await self._stack.enter_async_context(_http_session(cfg))
            self.queue = QueueClient(self._signed_like(self.sqs.meta))
            self.agentcore = await self.agentcore_in(cfg.region, cfg.endpoints.agentcore)
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    async def agentcore_in(self, region: str, endpoint: str | None) -> SignedClient:
        """The AgentCore data-plane client for a runtime in `region` at `endpoint` (None:
        AWS's), one per pair: runtimes may live in several regions or behind several URLs."""
        key = (region, endpoint)
        if key not in self._agentcore:
            # botocore resolves AWS's endpoint for the region; its client is never called
            async with self._session.create_client(
                "bedrock-agentcore", region_name=region, endpoint_url=endpoint
            ) as resolver:
                self._agentcore[key] = self._signed_like(resolver.meta)
        return self._agentcore[key]

    def _signed_like(self, meta: Any) -> SignedClient:
        """A `SignedClient` for the service, region and endpoint a botocore client resolved."""
        assert self._http is not None  # entered
        return SignedClient(
            self._http,
            meta.service_model.signing_name,
            meta.region_name,
            meta.endpoint_url,
            self._credentials,
            self.api_calls,
        )

    async def _client(
        self, service: str, endpoint: str | None, cfg: AioConfig, *, region: str | None = None
    ) -> Any:
        client = await self._stack.enter_async_context(
            self._session.create_client(
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


def _http_session(cfg: EngineConfig) -> aiohttp.ClientSession:
    """aiohttp's session for signed calls, set up as botocore's would be: its CA bundle (or
    `AWS_CA_BUNDLE`), its connect and read timeouts. Not `trust_env`: that reads the
    environment and ~/.netrc again on every request (`_proxy_for` reads it once)."""
    ssl_context = ssl.create_default_context(
        cafile=os.environ.get("AWS_CA_BUNDLE") or get_cert_path(True)
    )
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(
            limit=0, limit_per_host=cfg.max_pool_connections, ssl=ssl_context
        ),
        timeout=aiohttp.ClientTimeout(sock_connect=_CONNECT_TIMEOUT_S, sock_read=_READ_TIMEOUT_S),
        headers={"User-Agent": _USER_AGENT},
        cookie_jar=aiohttp.DummyCookieJar(),
    )


def _proxy_for(url: str) -> str | None:
    """The proxy the environment names for `url` (HTTPS_PROXY / HTTP_PROXY, unless NO_PROXY
    covers its host), as botocore reads it."""
    parts = urlsplit(url)
    if urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return urllib.request.getproxies().get(parts.scheme)
