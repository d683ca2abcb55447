"""`HostedGateways`: the hosted gateway as N Ray actors (`gateway.replicas: N`), when one process,
which saturates one core, is not enough.

`num_cpus=0`: veRL plans the cluster's CPUs for its own workers, and a replica waits on sockets,
so it takes none of them and starts even when veRL's plan took every CPU. The replicas are
unnamed actors owned by the engine service and die with it (Ray fate-sharing), their traces too:
a prompt re-issued after a restart runs anew. Placement, ports: docs/verl.md#the-hosted-gateway."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Sequence
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ...config import GatewayConfig, GatewayReplica

_WILDCARDS = frozenset({"0.0.0.0", "::", ""})
# Loading a tokenizer is the slow part of a replica's start; a replica Ray cannot place at all
# would otherwise hang the first rollout.
START_TIMEOUT = 300.0


class GatewayActor:
    """One gateway replica, in its own Ray worker process (an async actor: the Gateway runs on
    the actor's event loop)."""

    def __init__(self) -> None:
        self._gateway: Any = None

    async def start(
        self, server_manager: Any, renderer: str, host: str, port: int, **options: Any
    ) -> tuple[str, str]:
        """Serve a Gateway sampling through `server_manager` (`options`: the Gateway's); return
        the URLs its agents' API and its admin API are reached at."""
        from .backend import start_gateway

        node = ray.util.get_node_ip_address() if host in _WILDCARDS else None
        self._gateway = gateway = await start_gateway(
            server_manager,
            renderer,
            host=host,
            port=port,
            admin_host=node or "127.0.0.1",
            **options,
        )
        if node is None:
            return gateway.url, gateway.admin_url
        scheme = gateway.url.partition(":")[0]
        return f"{scheme}://{node}:{gateway.port}", gateway.admin_url

    async def stop(self) -> None:
        gateway, self._gateway = self._gateway, None
        if gateway is not None:
            await gateway.stop()


class HostedGateways:
    """N started `GatewayActor`s and the `GatewayConfig` that reaches them."""

    def __init__(self, actors: list[Any], config: GatewayConfig) -> None:
        self.actors = actors
        self.config = config

    @classmethod
    async def start(
        cls,
        count: int,
        server_manager: Any,
        renderer: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        public_urls: Sequence[str] = (),
        tls: dict[str, str | None] | None = None,
    ) -> HostedGateways:
        """Start `count` replicas (Ray must be initialized) and wait until each listens; `tls`:
        the Gateway's `tls_cert` and `tls_key` (files on every node a replica may run on)."""
        check_replicas(count, port, public_urls)
        if not ray.is_initialized():
            raise RuntimeError("gateway replicas are Ray actors: initialize Ray first")
        options: dict[str, Any] = {"num_cpus": 0}
        if host not in _WILDCARDS:  # reachable only on this node
            node = ray.get_runtime_context().get_node_id()
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
        actor_class = ray.remote(GatewayActor).options(**options)
        actors = [actor_class.remote() for _ in range(count)]
        token = secrets.token_urlsafe(32)
        try:
            starts = [
                actor.start.remote(
                    server_manager,
                    renderer,
                    host,
                    port + i if port else 0,
                    admin_token=token,
                    **(tls or {}),
                )
                for i, actor in enumerate(actors)
            ]
            urls = await asyncio.wait_for(asyncio.gather(*starts), START_TIMEOUT)
        except BaseException:
            for actor in actors:
                ray.kill(actor)
            raise
        replicas = [  # the engine calls each admin listener; agents each agents' one
            GatewayReplica(url=admin, public_url=public_urls[i] if public_urls else agents)
            for i, (agents, admin) in enumerate(urls)
        ]
        return cls(actors, GatewayConfig(replicas=replicas, admin_token=token))

    async def stop(self) -> None:
        """Stop each gateway (its requests in flight end), then kill its actor."""
        actors, self.actors = self.actors, []
        await asyncio.gather(*(actor.stop.remote() for actor in actors), return_exceptions=True)
        for actor in actors:
            ray.kill(actor)


def check_replicas(count: int, port: int, public_urls: Sequence[str]) -> None:
    """`replicas`, `port` and a list of `public_url`s that fit together; ValueError in one line."""
    if count < 2:
        raise ValueError(f"gateway.replicas: {count}; as actors, 2 or more (1: in process)")
    if public_urls and len(public_urls) != count:
        raise ValueError(
            f"gateway.public_url: {len(public_urls)} URLs for {count} replicas; give one each"
        )
    if public_urls and not port:
        raise ValueError(
            "gateway.public_url: a list needs a fixed port (replica i listens on port + i)"
        )
