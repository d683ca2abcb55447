"""Where the emulator's sessions run, the agent side of the AgentCore container contract: a process
per session (`ProcessAgent`, as a microVM per session is on AWS), a container of the agent's image
per session (`ContainerAgent`), or one app shared in a thread (`SharedApp` + `InProcessAgent`, for
tests and benchmarks that need hundreds of sessions quickly)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import IO, Any, Protocol

import aiohttp

from .agent_env import process_agent_env
from .config import ContainerLimits, EmulatorConfig
from .containers import (
    LABEL,
    SESSION_LABEL,
    ContainerEngine,
    InternalNetwork,
    container_url,
    isolate_ports,
    seal,
)
from .host import load_asgi_app

PING_TIMEOUT = aiohttp.ClientTimeout(total=5)
_TAIL_BYTES = 2048


class Agent(Protocol):
    url: str

    def alive(self) -> bool: ...
    async def busy(self, http: aiohttp.ClientSession) -> bool: ...
    async def terminate(self) -> None: ...


async def _ping_busy(http: aiohttp.ClientSession, url: str) -> bool:
    """`GET /ping` says HealthyBusy (the contract's way to keep an idle session alive)."""
    try:
        async with http.get(f"{url}/ping", timeout=PING_TIMEOUT) as resp:
            return (await resp.json(content_type=None)).get("status") == "HealthyBusy"
    except (aiohttp.ClientError, TimeoutError, ValueError, AttributeError):
        return False


def _cores() -> int:
    return max(1, os.cpu_count() or 1)


def ready_bound(timeout: float, starting: int) -> float:
    """How long a new agent may take to answer `/ping`: `timeout` alone, `timeout` times the
    agents starting at once per core where they outnumber the cores (they share them)."""
    return timeout * max(1.0, starting / _cores())


class ProcessAgent:
    """One OS process per session, in a process group of its own (a command's children go
    with it)."""

    _what = "agent"  # what its failures name

    def __init__(self, process: asyncio.subprocess.Process, url: str) -> None:
        self.process = process
        self.url = url
        self._tail = b""  # the end of the agent's output, for a start failure's message
        self._drain: asyncio.Task[None] | None = None
        if process.stdout is not None:
            self._drain = asyncio.create_task(self._keep_tail(process.stdout))

    async def _keep_tail(self, stream: asyncio.StreamReader) -> None:
        """Read the agent's output as it comes (a full pipe would block it), keeping the end."""
        while chunk := await stream.read(4096):
            self._tail = (self._tail + chunk)[-_TAIL_BYTES:]

    @classmethod
    async def spawn(cls, config: EmulatorConfig, session_id: str) -> ProcessAgent:
        """The agent `config` names, its app or its command, for one session."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        env = {
            **process_agent_env(os.environ, config.env),
            "AGENTCORE_ROLLOUT_PARENT_PID": str(os.getpid()),
        }
        if config.command:
            # The command binds $PORT itself, as a container's server binds 8080: the port is
            # free again by the time it starts (a race on loopback only, not worth a protocol).
            sock.close()
            argv, fds = list(config.command), ()
            env["PORT"] = str(port)
        else:
            sock.listen(64)
            argv = [sys.executable, "-m", "agentcore_rollout.local.host", config.app]
            argv += ["--fd", str(sock.fileno())]
            fds = (sock.fileno(),)
        try:
            process = await _start(argv, env, config.agent_log_dir, session_id, pass_fds=fds)
        finally:
            sock.close()
        return cls(process, f"http://127.0.0.1:{port}")

    def alive(self) -> bool:
        return self.process.returncode is None

    async def wait_ready(
        self,
        http: aiohttp.ClientSession,
        timeout: float,
        *,
        starting: Callable[[], int] | None = None,
        setting: str = "",
    ) -> None:
        """Until `GET /ping` answers 200, as the service waits for a container's health, while
        the agent runs. `timeout` is one start's bound on an idle machine; with `starting`
        (how many agents are starting now, this one included) it scales with the most that
        started at once during the wait, per core (`ready_bound`): 32 containers started
        together on 2 cores share them. A bound reached is one line naming the bound, what
        was starting and `setting`, the setting that changes it."""
        began = time.monotonic()
        peak = 1
        while True:
            peak = max(peak, starting() if starting is not None else 1)
            bound = ready_bound(timeout, peak)
            if time.monotonic() - began >= bound:
                break
            if not self.alive():
                if self._drain is not None:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(asyncio.shield(self._drain), timeout=1)
                lines = self._tail.decode(errors="replace").strip().splitlines()
                why = f": {lines[-1][:300]}" if lines else ""
                raise RuntimeError(f"{self._exited()} with code {self.process.returncode}{why}")
            if not await self._located():
                await asyncio.sleep(0.1)
                continue
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with http.get(f"{self.url}/ping", timeout=PING_TIMEOUT) as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.05 if time.monotonic() - began < 2 else 0.25)
        await self.terminate()
        load = f"; {peak} agents were starting at once on {_cores()} cores" if peak > 1 else ""
        change = f" ({setting} sets {timeout:g}s a start, scaled by the starts per core)"
        raise RuntimeError(
            f"{self._what} not healthy within {bound:.0f}s (GET /ping){load}"
            f"{change if setting else ''}"
        )

    def _exited(self) -> str:
        return f"{self._what} exited"

    async def _located(self) -> bool:
        """Its URL is known (a process's is, from its start)."""
        return True

    async def busy(self, http: aiohttp.ClientSession) -> bool:
        return await _ping_busy(http, self.url)

    def kill(self) -> None:
        """SIGKILL the whole group, as a crash of the microVM would."""
        self._signal(signal.SIGKILL)

    async def terminate(self) -> None:
        if self.alive():
            self._signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), timeout=5)
            except TimeoutError:
                self._signal(signal.SIGKILL)
        await self.process.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)  # whatever the agent left behind
        if self._drain is not None:
            self._drain.cancel()

    def _signal(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.process.pid, sig)
        except (ProcessLookupError, PermissionError):
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(sig)


_AWS_NAMES = (
    *("AWS_REGION", "AWS_DEFAULT_REGION"),
    *("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"),
)
_ENGINE_ERRORS = (125, 126, 127)  # podman/docker run's own failures, not the container's


class ContainerAgent(ProcessAgent):
    """One container per session: `run --rm` attached, so the client process lives as long as
    the container and its output is the container's. The app binds 8080 in its own network
    namespace, as on AgentCore; the emulator reaches it on a host loopback port. It gets the
    environment AgentCore gives (region, credentials) and the AWS endpoint URLs, loopback
    ones rewritten to the host as the container sees it."""

    _what = "container"

    def __init__(
        self, process: asyncio.subprocess.Process, url: str, engine: ContainerEngine, name: str
    ) -> None:
        super().__init__(process, url)
        self.engine = engine
        self.name = name
        self.bridge = ""  # Podman's internal bridge, whose ports are isolated once it runs
        self.sealed: tuple[str, tuple[int, ...]] | None = None  # the gateway, the relay's ports
        self._looks, self._next_look = 0, 0.0  # `inspect`s for its address, and the next one

    @classmethod
    async def spawn_container(
        cls,
        config: EmulatorConfig,
        engine: ContainerEngine,
        label: str,
        session_id: str,
        image: str,
        limits: ContainerLimits | None = None,
        *,
        internal: InternalNetwork | None = None,
        relayed: Iterable[int] = (),
        disk: bool = False,
    ) -> ContainerAgent:
        """A container of `image` for one session, labelled `label` (its emulator's), given
        `limits`: cpus and memory; disk where `disk` (the engine's storage bounds it); with
        `network=no-network`, on `internal` (no port published there: the emulator reaches
        it at its address on that bridge, found once it runs), reaching the relay's ports
        there (`relayed`) and nothing else."""
        limits = limits or ContainerLimits()
        isolated = limits.network == "no-network"
        if isolated and internal is None:
            raise ValueError("a no-network container needs the internal network")
        host = internal.gateway if internal is not None and isolated else engine.host
        given = {k: container_url(v, host) for k, v in container_env(config.env).items()}
        name = f"agentcore-rollout-{uuid.uuid4().hex[:12]}"
        if internal is not None and isolated:
            network, url = ("--network", internal.name), ""
        else:
            # the engine picks the host port: one picked here could be taken before it binds
            network, url = ("--network", engine.network, "-p", "127.0.0.1::8080"), ""
        bounds = [f"--cpus={limits.cpus:g}"] if limits.cpus else []
        if limits.memory_mb:  # swap included: without it the engines allow as much again
            bounds += [f"--memory={limits.memory_mb}m", f"--memory-swap={limits.memory_mb}m"]
        bounds += [f"--storage-opt=size={limits.storage_mb}m"] if limits.storage_mb and disk else []
        argv = engine.argv(
            # --init: an init as PID 1 passes SIGTERM on and reaps (a server as PID 1 may
            # not exit on it: 2 s to a SIGKILL per stop, measured)
            *("run", "--rm", "--init", "--sig-proxy=false", "--name", name),
            *("--label", f"{LABEL}={label}", "--label", f"{SESSION_LABEL}={session_id}"),
            *network,
            *bounds,
            *(f"--env={k}" for k in sorted(given)),  # values from the client's environment
            image,
        )
        # the values not in argv: credentials stay out of `ps`
        process = await _start(argv, {**engine.env, **given}, config.agent_log_dir, session_id)
        agent = cls(process, url, engine, name)
        if internal is not None and isolated:
            agent.bridge = internal.bridge
            agent.sealed = (internal.gateway, tuple(sorted(relayed)))
        return agent

    async def _located(self) -> bool:
        """Its URL known: a published container's once the engine says which host port it
        picked; a container on the internal network has one once it runs (its
        address on the bridge, as the engine reports it), once its namespace is sealed
        (`seal`) and its bridge port isolated from the other containers' (Podman's): before
        it is ready, so before its first invocation."""
        if self.url:
            return True
        if time.monotonic() < self._next_look:
            return False
        # each look is an engine process: 32 containers starting on 2 cores must not each
        # ask four times a second (0.25 s, doubling, at most 1 s apart)
        self._next_look = time.monotonic() + min(1.0, 0.25 * 2**self._looks)
        self._looks += 1
        if self.sealed is None:  # published on a host loopback port the engine picked
            shown = await asyncio.to_thread(self.engine.run, "port", self.name, "8080/tcp")
            port = shown.stdout.strip().splitlines()[0].rpartition(":")[2] if shown.stdout else ""
            if shown.returncode == 0 and port.isdigit():
                self.url = f"http://127.0.0.1:{port}"
            return bool(self.url)
        template = "{{.State.Pid}} {{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}"
        shown = await asyncio.to_thread(self.engine.run, "inspect", "--format", template, self.name)
        pid, _, address = shown.stdout.strip().partition(" ")
        if shown.returncode == 0 and address and pid.isdigit() and int(pid):
            if self.sealed is not None:
                await asyncio.to_thread(seal, int(pid), *self.sealed)
            if self.bridge:
                await asyncio.to_thread(isolate_ports, self.bridge)
            self.url = f"http://{address}:8080"
        return bool(self.url)

    def _exited(self) -> str:
        if self.process.returncode in _ENGINE_ERRORS:
            return f"{self.engine.name} could not start the container"
        return super()._exited()

    def kill(self) -> None:
        """SIGKILL the container, as a crash of the microVM would."""
        self.engine.run("kill", self.name, timeout=30)

    async def terminate(self) -> None:
        """Remove the container (SIGTERM, SIGKILL after 2 s), then end its client."""
        if self.alive():
            await asyncio.to_thread(self.engine.remove, self.name, grace=2)
        await super().terminate()


def container_env(env: Mapping[str, str]) -> dict[str, str]:
    """What a session container is given, before its loopback URLs are rewritten: the AWS
    names and endpoint URLs of this process's environment, then `env`."""
    given = {k: v for k, v in os.environ.items() if k in _AWS_NAMES or "ENDPOINT_URL" in k}
    return {k: v for k, v in {**given, **env}.items() if k != "PYTHONPATH"}


class SharedApp:
    """One app served by uvicorn in a background thread (in_process mode)."""

    def __init__(self, spec: str) -> None:
        self.app = load_asgi_app(spec)
        self.url = ""
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        import uvicorn

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        # A RolloutApp needs no lifespan; another app may have startup work to run.
        lifespan = "off" if hasattr(self.app, "session_busy") else "auto"
        self._server = uvicorn.Server(
            uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan=lifespan)
        )
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._server.serve(sockets=[sock])), daemon=True
        )
        self._thread.start()
        give_up = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > give_up or not self._thread.is_alive():
                raise RuntimeError("in-process agent server did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)


class InProcessAgent:
    """A session's view of the shared app."""

    def __init__(self, shared: SharedApp, session_id: str) -> None:
        self._shared = shared
        self._session_id = session_id
        self.url = shared.url

    def alive(self) -> bool:
        return True

    async def busy(self, http: aiohttp.ClientSession) -> bool:
        session_busy = getattr(self._shared.app, "session_busy", None)
        if session_busy is not None:
            return bool(session_busy(self._session_id))
        return await _ping_busy(http, self.url)

    async def terminate(self) -> None:
        cancel = getattr(self._shared.app, "cancel_session", None)
        if cancel is not None:
            cancel(self._session_id)


async def _start(
    argv: Sequence[str],
    env: Mapping[str, str],
    log_dir: str | None,
    session_id: str,
    pass_fds: Sequence[int] = (),
) -> asyncio.subprocess.Process:
    """A session's agent process, in a process group of its own, its output to
    `log_dir/<session_id>.log`, else to a pipe."""
    out = _agent_output(log_dir, session_id)
    try:
        return await asyncio.create_subprocess_exec(
            *argv,
            pass_fds=pass_fds,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        if not isinstance(out, int):
            out.close()  # the child has it


def _agent_output(log_dir: str | None, session_id: str) -> int | IO[bytes]:
    if not log_dir:
        return asyncio.subprocess.PIPE
    os.makedirs(log_dir, exist_ok=True)
    return open(os.path.join(log_dir, f"{session_id}.log"), "ab")
