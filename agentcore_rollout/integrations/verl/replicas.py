"""`HostedGateways`: the hosted gateway as N Ray actors, when one process is not enough.

One gateway process saturates one core (`bench/gateway.py`); in process, it also shares the
engine actor's. With `custom.agentcore.gateway.replicas: N` (N >= 2), the engine service starts
N `GatewayActor`s instead, each a Gateway in its own Ray worker process, sampling through the
server manager veRL handed the agent loop (`backend.VerlServerBackend`; Ray pickles it: it holds
veRL's config and the load balancer's actor handle), all behind one admin token. The engine
opens each session on one replica and hands its agent that replica's URL (`GatewayConfig`'s
`replicas`), so no proxy hop.

- `num_cpus=0`: veRL plans the cluster's CPUs for its own workers; a replica waits on sockets
  and takes none of them (an actor's default reserves one to be placed), so it starts even when
  veRL's plan has taken every CPU.
- Placement: a replica bound to a loopback or a named address is pinned to the engine service's
  node, where that address is reachable, and its admin listener is on loopback; bound to a
  wildcard (`0.0.0.0`, `::`), Ray may place it on any node, its URL is its node's IP address,
  and so is its admin listener's (plain HTTP, behind the admin token: the cluster's network
  must be one you trust).
- Ports: `port` 0 picks a free one per replica; a fixed `port` P puts replica i on P + i, so a
  list of public URLs (`public_url`, one per replica, in that order) can name them.
- Lifetime: the replicas are unnamed actors owned by the engine service, so they die with it (Ray
  fate-sharing) and `close` kills them. A restarted service never meets an earlier one's
  replicas, and the traces they held die with them: as with the in-process gateway, a prompt
  re-issued after a restart runs anew (see `agent_loop`'s docstring).
"""

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
