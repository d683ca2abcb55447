"""The emulator's sessions, as AgentCore runs them: each gets its own agent (`agents`) on its first
invocation, after the simulated cold start (`cold_start`, and in mode container
`cold_start_per_gb` of its image), and ends on a stop or as the service ends it. Where agents
run is set up once, at the emulator's start. Ledgers and gauges let tests check a client's
bounds."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field

import aiohttp

from .._flow import Gauge
from ..runtimes._owner import owner_label
from .agents import Agent, ContainerAgent, InProcessAgent, ProcessAgent, SharedApp, container_env
from .config import DEFAULT_RUNTIME_ARN, EmulatorConfig
from .containers import (
    ContainerEngine,
    InternalNetwork,
    container_engine,
    internal_network,
    loopback_ports,
    storage_quota,
)
from .quotas import Quotas
from .relay import LoopbackRelay
from .wire import ApiError

PING_EVERY_MAX = 2.0  # an idle session's agent is asked `/ping` at least this often

Key = tuple[str, str, str]
"""A session's key: (runtime ARN, endpoint qualifier, session id)."""


@dataclass
class Session:
    session_id: str
    key: Key
    created: float
    agent: Agent | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    failed: str | None = None
    """Why its agent did not start."""
    ended: str | None = None
    """Why it ended: what an invocation still attached to it is told."""
    in_flight: int = 0
    """Invocations attached to it, from their arrival to the end of their reply: a session
    with one is busy, whatever its agent's ping says."""
    idle_since: float | None = None
    """When it last became idle (nothing in flight, its agent not HealthyBusy); None: busy."""
    watcher: asyncio.Task[None] | None = None


class Sessions(Mapping[str, Session]):
    """The live sessions by id (a session id is unique per runtime endpoint on AWS; tests here
    use one runtime), and the ledgers of every session's start and end."""

    def __init__(self, config: EmulatorConfig, quotas: Quotas) -> None:
        self.config = config
        self.quotas = quotas
        self._live: dict[Key, Session] = {}
        self.starting = Gauge()
        self.live = Gauge()
        self.started: list[str] = []
        self.created: list[tuple[float, str, str]] = []
        """Each session's creation: (monotonic time, runtime ARN, qualifier)."""
        self.stopped: list[str] = []
        self.expired: list[str] = []
        self.http: aiohttp.ClientSession | None = None  # every agent is reached with it
        self._watchers: set[asyncio.Task[None]] = set()
        self._shared: SharedApp | None = None
        self._engine: ContainerEngine | None = None
        self._loopback: LoopbackRelay | None = None  # containers' way to the host's services
        self._internal: InternalNetwork | None = None  # no-network containers' bridge
        self._isolated: LoopbackRelay | None = None  # their way to the host's services
        self._disk = False  # the engine bounds a container's disk
        self._label = owner_label()  # its containers', for the sweeps
        self._image_cold_start: dict[str, float] = {}  # by runtime ARN: cold_start_per_gb's

    def __getitem__(self, session_id: str) -> Session:
        return {s.session_id: s for s in self._live.values()}[session_id]

    def __iter__(self) -> Iterator[str]:
        return iter([s.session_id for s in self._live.values()])

    def __len__(self) -> int:
        return len(self._live)

    async def setup(self) -> None:
        """Where agents will run; fails at once, in one line, if it cannot work here."""
        cfg = self.config
        if cfg.mode == "in_process":
            self._shared = SharedApp(cfg.app)
            await asyncio.to_thread(self._shared.start)
        if cfg.mode == "container":
            self._engine = engine = await asyncio.to_thread(container_engine, cfg.container_engine)
            await asyncio.to_thread(engine.remove_orphans)  # an earlier emulator's
            arns = cfg.runtime_arns or (DEFAULT_RUNTIME_ARN,)
            for image in sorted({cfg.image_of(arn) for arn in arns}):
                if not await asyncio.to_thread(engine.image_exists, image):
                    raise RuntimeError(
                        f"image {image} not found: build it (agentcore-rollout local build)"
                    )
            if cfg.cold_start_per_gb:  # each image's size, once: its sessions' longer start
                sizes = {
                    image: await asyncio.to_thread(engine.image_bytes, image)
                    for image in {cfg.image_of(arn) for arn in arns}
                }
                self._image_cold_start = {
                    arn: cfg.cold_start_per_gb * sizes[cfg.image_of(arn)] / 1e9 for arn in arns
                }
            urls = [*container_env(cfg.env).values(), *cfg.host_urls]  # their ports alone
            ports = loopback_ports(urls)
            self._loopback = LoopbackRelay(engine.host, engine.subnet, ports)
            await self._loopback.start()
            limits = [cfg.limits_of(arn) for arn in arns]
            if any(lim.network == "no-network" for lim in limits):  # their bridge, its relay
                self._internal = net = await asyncio.to_thread(internal_network, engine)
                self._isolated = LoopbackRelay(net.gateway, net.subnet, ports, freebind=True)
                await self._isolated.start()
            if asked := sum(1 for lim in limits if lim.storage_mb):  # one line if it cannot
                why = await asyncio.to_thread(storage_quota, engine)
                self._disk = why is None
                if why is not None:
                    said = f"storage_mb of {asked} runtime(s) is not enforced: {why}"
                    print(f"warning: {said}", file=sys.stderr, flush=True)
        # No total timeout: the service's caps (sync_timeout, stream_timeout) are applied per
        # invocation; a connect that hangs is still bounded. No connection limit either: open
        # streams must not queue other sessions' invocations (only the quotas bound them).
        # A pooled connection is dropped after 1 s unused, before an agent's server drops it
        # (uvicorn: 5 s): one reused as the agent closes it fails the request mid-write.
        self.http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=1.0),
            timeout=aiohttp.ClientTimeout(total=None, connect=10),
            auto_decompress=False,
        )

    async def shutdown(self) -> None:
        """Every session ended and its agent stopped, then where they ran."""
        sessions = list(self._live.values())
        await asyncio.gather(*(self._end(s, "shutdown", self.expired) for s in sessions))
        await asyncio.gather(*self._watchers, return_exceptions=True)  # ends under way
        if self._shared is not None:
            await asyncio.to_thread(self._shared.stop)
        if self._engine is not None:  # any container whose start raced the stop
            await asyncio.to_thread(self._engine.remove_containers, self._label)
        for relay in (self._loopback, self._isolated):
            if relay is not None:
                await relay.stop()
        if self.http is not None:
            await self.http.close()

    @contextlib.asynccontextmanager
    async def attached(self, key: Key) -> AsyncIterator[Session]:
        """The session `key` names, ready: opened (if the quotas admit it) and its agent
        started if it is new. Busy while the caller holds it, its agent's start included."""
        session = self._live.get(key)
        opening = session is None
        if session is None:
            self.quotas.admit_session(key[:2])
            session = self._open(key)
        session.in_flight += 1
        session.idle_since = None
        try:
            if opening:
                with self.starting:
                    await self._launch(session)
            await session.ready.wait()
            yield session
        finally:
            session.in_flight -= 1
            if not session.in_flight:
                session.idle_since = time.monotonic()

    async def stop(self, key: Key) -> bool:
        """End the session `key` names, as StopRuntimeSession does; False: there is none."""
        session = self._live.get(key)
        if session is not None:
            await self._end(session, "stopped", self.stopped)
        return session is not None

    def cold_start(self, runtime_arn: str) -> float:
        """Seconds a new session of `runtime_arn` waits before its agent starts: `cold_start`,
        plus `cold_start_per_gb` times its image's size in GB (mode container)."""
        return self.config.cold_start + self._image_cold_start.get(runtime_arn, 0.0)

    def kill_agent(self, session_id: str) -> None:
        """Kill a session's agent process abruptly (SIGKILL), as a crash would."""
        agent = self[session_id].agent
        if not isinstance(agent, ProcessAgent):
            raise RuntimeError("kill_agent needs mode='process' or 'container'")
        agent.kill()

    def _open(self, key: Key) -> Session:
        session = Session(key[2], key, created=time.monotonic())
        self._live[key] = session
        self.live.add()
        self.started.append(session.session_id)
        self.created.append((session.created, key[0], key[1]))
        return session

    async def _launch(self, session: Session) -> None:
        """Start the session's agent and its watcher; a session ended meanwhile (a stop)
        starts neither, and its invocations are told it ended."""
        cfg = self.config
        try:
            await asyncio.sleep(self.cold_start(session.key[0]))
            if session.ended:
                return
            if self._shared is not None:
                session.agent = InProcessAgent(self._shared, session.session_id)
            else:
                agent = await self._spawn(session.key)
                session.agent = agent
                if session.ended:  # during the spawn, so `_end` saw no agent to stop
                    await agent.terminate()
                    return
                assert self.http is not None
                await agent.wait_ready(
                    self.http,
                    cfg.agent_ready_timeout,
                    starting=lambda: self.starting.value,
                    setting="agent_ready_timeout (local config; the emulator's "
                    "--agent-ready-timeout)",
                )
        except Exception as e:
            if session.ended:  # stopped while starting: not the agent's failure
                return
            session.failed = f"agent failed to start: {e}"
            await self._end(session, session.failed, self.expired)
            raise ApiError("RuntimeClientError", session.failed) from None
        finally:
            session.ready.set()
        if not session.ended:
            session.watcher = watcher = asyncio.create_task(self._watch(session))
            self._watchers.add(watcher)
            watcher.add_done_callback(self._watchers.discard)

    async def _spawn(self, key: Key) -> ProcessAgent:
        """The session's agent: a container of its runtime's image, or a process on the
        host."""
        runtime_arn, _, session_id = key
        if self._engine is None:
            return await ProcessAgent.spawn(self.config, session_id)
        cfg = self.config
        return await ContainerAgent.spawn_container(
            *(cfg, self._engine, self._label, session_id, cfg.image_of(runtime_arn)),
            cfg.limits_of(runtime_arn),
            internal=self._internal,
            relayed=self._isolated.ports if self._isolated is not None else (),
            disk=self._disk,
        )

    async def _end(self, session: Session, why: str, ledger: list[str]) -> None:
        if self._live.pop(session.key, None) is None:
            return
        session.ended = why
        self.live.remove()
        self.quotas.closed(session.key[:2])
        ledger.append(session.session_id)
        if session.watcher is not None and session.watcher is not asyncio.current_task():
            session.watcher.cancel()
        if session.agent is not None:
            await session.agent.terminate()

    async def _watch(self, session: Session) -> None:
        """A started session's end, as the service judges it: when its agent exits, at its
        max lifetime (busy or not), or after `idle_timeout` idle. Idle is the agent's word:
        with no invocation in flight it is asked `/ping` every quarter of the idle timeout
        (at most `PING_EVERY_MAX` apart), HealthyBusy keeps it busy, and the timeout counts
        from when it last became idle, so work acknowledged at once and run in the background
        (`add_async_task`) is never cut short."""
        assert session.agent is not None and self.http is not None
        agent, cfg = session.agent, self.config
        end_of_life = session.created + cfg.max_lifetime
        every = min(cfg.idle_timeout / 4, PING_EVERY_MAX)
        while True:
            await asyncio.sleep(max(0.0, min(every, end_of_life - time.monotonic())))
            if not agent.alive():
                return await self._end(session, "its agent exited", self.expired)
            if time.monotonic() >= end_of_life:
                return await self._end(session, "max lifetime", self.expired)
            if session.in_flight:
                continue
            busy = await agent.busy(self.http)
            if session.in_flight:  # an invocation arrived while the agent answered
                continue
            now = time.monotonic()
            if busy:
                session.idle_since = None
            elif session.idle_since is None:
                session.idle_since = now
            elif now - session.idle_since >= cfg.idle_timeout:
                return await self._end(session, "idle timeout", self.expired)
