"""`SandboxRuntime` on this machine's containers: each session one container of an agent's image,
run by Podman or Docker, the agent called directly (no emulator in between).

The agent binds 8080 in the container's own network namespace, published on a loopback port.
Loopback URLs in its environment (S3, SQS, the gateway on 127.0.0.1) are rewritten to the host
as the container sees it. Podman: slirp4netns with `allow_host_loopback` (10.0.2.2 is the host's
127.0.0.1, loopback-only services included; unlike the emulator's containers, these reach every
one). Docker: its bridge's `host-gateway`, which reaches services listening on every address.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import socket
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from . import _invocation
from ._owner import gone, owner_label
from .base import RuntimeLimits, SandboxRuntime, SessionCallError

RUNTIME_LABEL = "agentcore-rollout.runtime"
"""On every container of a `ContainerRuntime`, valued with its runtime's identity
(`ContainerRuntime.owner`): `podman ps -a --filter label=agentcore-rollout.runtime`."""
SESSION_LABEL = "agentcore-rollout.session"
"""Its session's id, on each container."""
ENGINES = ("podman", "docker")
_HOST = {"podman": "10.0.2.2", "docker": "host.docker.internal"}
_NETWORK = {
    "podman": ("--network", "slirp4netns:allow_host_loopback=true"),
    "docker": ("--add-host", "host.docker.internal:host-gateway"),
}
_LOOPBACK = re.compile(r"//(?:127\.0\.0\.1|localhost|0\.0\.0\.0)(?=[:/]|$)")
_ENGINE_ERRORS = (125, 126, 127)  # `run`'s own failures, not the container's
_NO_IMAGE = ("image not known", "No such image", "Unable to find image", "manifest unknown")
_ENGINE_DOWN = ("Cannot connect to the Docker daemon", "unable to connect to Podman")
_PORT_TAKEN = "address already in use"
_PING = aiohttp.ClientTimeout(total=5)
_TAIL = 2048


class ContainerRuntime(SandboxRuntime):
    """`ContainerRuntime("localhost/my-agent:latest", env={...})`: each session a container of
    the image (which must exist here: nothing is pulled), serving the agent on 8080 as
    AgentCore runs it.

    `env` is all the agent's environment (AWS region, credentials and endpoint URLs for its
    results, say); its values reach the engine's CLI through its environment, not its
    arguments. `cpus` and `memory_mb` bound each container. A container starts when its
    session's first invocation comes and is healthy once `GET /ping` answers; `ready_timeout`
    bounds how long it may go without progress (its processes using no CPU) before that, ten
    times as long in all. `aclose()` removes every container it started; those of a process
    that ended before it (killed, say) are removed by the first start of the next one here.
    """

    def __init__(
        self,
        image: str,
        *,
        engine: str = "podman",
        env: Mapping[str, str] | None = None,
        name: str | None = None,
        environment: str | None = None,
        max_live_sessions: int | None = None,
        start_rate: float | None = None,
        call_rate: float = 50.0,
        pool: str | None = None,
        cpus: float | None = None,
        memory_mb: int | None = None,
        ready_timeout: float = 60.0,
    ) -> None:
        if engine not in ENGINES:
            raise ValueError(f"container engine {engine!r} is none of {', '.join(ENGINES)}")
        self.image = image
        self.engine = engine
        self.name = name or f"{engine}:{image}"
        self.environment = environment
        self.owner = owner_label()
        """The value of `RUNTIME_LABEL` on this runtime's containers."""
        host = _HOST[engine]
        self._env = {k: _LOOPBACK.sub(f"//{host}", v) for k, v in (env or {}).items()}
        cores = os.cpu_count() or 1
        given = max_live_sessions is not None
        self._limits = RuntimeLimits(
            # a start (the CLI, the agent's imports) took about 2 core-seconds, measured
            start_rate=start_rate or cores / 2,
            call_rate=call_rate,
            max_live_sessions=max_live_sessions or cores,
            pool=pool or self.name,
            source=(
                f"ContainerRuntime's arguments ({engine} on this machine)"
                if given
                else f"{engine} on this machine: a session per core, {cores} cores"
            ),
        )
        self._bounds = [f"--cpus={cpus:g}"] if cpus else []
        if memory_mb:  # swap included: without it the engines allow as much again
            self._bounds += [f"--memory={memory_mb}m", f"--memory-swap={memory_mb}m"]
        self._ready_timeout = ready_timeout
        self._rm = ("rm", "-f", "-t", "0") if engine == "podman" else ("rm", "-f")
        self._containers: dict[str, _Container] = {}
        self._http: aiohttp.ClientSession | None = None
        self._swept: asyncio.Future[None] | None = None

    async def limits(self) -> RuntimeLimits:
        return self._limits

    async def invoke(self, session_id: str, payload: bytes) -> dict[str, Any]:
        container = self._containers.get(session_id)
        if container is None or container.exited:  # ended since (crashed, killed): a new one
            ended, container = container, _Container(session_id)
            self._containers[session_id] = container
            container.ready = asyncio.ensure_future(self._start(container, ended))
            container.ready.add_done_callback(_retrieved)  # awaited by no one if cancelled
        try:
            await asyncio.shield(container.ready)  # an invoke cancelled leaves it to `stop`
        except Exception:
            if self._containers.get(session_id) is container:
                del self._containers[session_id]  # it removed its container
            raise
        return await self._post(container, payload)

    async def stop(self, session_id: str) -> None:
        container = self._containers.pop(session_id, None)
        if container is not None:
            container.stopped = True
            await self._remove(container)

    async def aclose(self) -> None:
        """Remove every container this runtime started, those whose start is under way too."""
        containers = list(self._containers.values())
        self._containers.clear()
        for container in containers:
            container.stopped = True
        await asyncio.gather(*(self._remove(c) for c in containers))
        found = await self._cli("ps", "-aq", "--filter", f"label={RUNTIME_LABEL}={self.owner}")
        if ids := found.out.split():  # any whose start raced the above
            await self._cli(*self._rm, *ids)
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def __aenter__(self) -> ContainerRuntime:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- a session's container --------------------------------------------------------------

    async def _start(self, c: _Container, ended: _Container | None = None) -> None:
        """Run the container (after removing the session's one that `ended`), attached: the
        CLI process lives as long as it does. Then wait until it is healthy. A failure removes
        it and raises `SessionCallError`, with `maybe_started=False`: nothing left to stop."""
        if self._swept is None:
            self._swept = asyncio.ensure_future(self._remove_orphans())
        await asyncio.shield(self._swept)
        if ended is not None:
            await self._remove(ended)
        with socket.socket() as sock:  # free now, bound by the engine's port forwarder next
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        c.url = f"http://127.0.0.1:{port}"
        argv = [
            # --init: an init as PID 1 passes signals on and reaps
            *("run", "--rm", "--init", "--pull=never", "--sig-proxy=false", "--name", c.name),
            *("--label", f"{RUNTIME_LABEL}={self.owner}", "--label", f"{SESSION_LABEL}={c.sid}"),
            *_NETWORK[self.engine],
            *("-p", f"127.0.0.1:{port}:8080"),
            *self._bounds,
            *(f"--env={k}" for k in sorted(self._env)),  # values from the CLI's environment
            self.image,
        ]
        try:
            c.process = await asyncio.create_subprocess_exec(
                self._binary(),
                *argv,
                env={**os.environ, **self._env},
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
            assert c.process.stdout is not None
            c.drain = asyncio.ensure_future(c.keep_tail(c.process.stdout))
            await self._until_healthy(c)
        except BaseException as e:
            await self._remove(c)
            if isinstance(e, SessionCallError):
                raise
            if isinstance(e, OSError):  # the CLI itself cannot run
                raise SessionCallError(
                    "EngineNotFound", f"{self.engine}: {e}", retryable=False, maybe_started=False
                ) from None
            raise

    def _binary(self) -> str:
        path = shutil.which(self.engine)
        if path is None:
            raise FileNotFoundError(f"no {self.engine} on PATH")
        return path

    async def _until_healthy(self, c: _Container) -> None:
        """Until `GET /ping` answers healthy, while the container runs and makes progress: its
        processes (and the CLI's, before they exist) use CPU at least every `ready_timeout`
        seconds, the whole start taking at most ten times that. Where the processes cannot
        be seen (no /proc: the engine in a VM), `ready_timeout` bounds the start."""
        began = time.monotonic()
        progress, cpu, next_look = began, -1, began + 1.0
        http = self._client()
        while True:
            if c.stopped:
                raise SessionCallError(
                    "Stopped", "stopped while starting", retryable=False, maybe_started=False
                )
            if c.exited:
                raise await self._exit_error(c)
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
                async with http.get(f"{c.url}{_invocation.PING_PATH}", timeout=_PING) as resp:
                    reply = await resp.json(content_type=None)
                    if resp.status == 200 and _invocation.healthy(reply):
                        c.healthy = True
                        return
            now = time.monotonic()
            if now >= next_look:
                next_look = now + 1.0
                if c.pid is None:
                    c.pid = await self._pid(c)
                # the CLI's until the container runs, then the container's alone (not the
                # port forwarder's, which the pings themselves keep busy)
                root = c.pid or (c.process.pid if c.process is not None else None)
                used = await asyncio.to_thread(_cpu_ticks, root)
                if used is not None and used != cpu:
                    progress, cpu = now, used
            stalled = now - progress > self._ready_timeout
            if stalled or now - began > 10 * self._ready_timeout:
                why = (
                    f"{now - progress:.0f}s of it without progress"
                    if stalled
                    else "the most a start may take, ten times ready_timeout"
                )
                raise SessionCallError(
                    "NotHealthy",
                    f"container not healthy (GET /ping) after {now - began:.0f}s, {why} "
                    f"(ready_timeout={self._ready_timeout:g})",
                    retryable=False,
                    maybe_started=False,
                )
            await asyncio.sleep(0.1 if now - began < 2 else 0.25)

    async def _pid(self, c: _Container) -> int | None:
        """The container's first process, as the host numbers it (None until it runs)."""
        shown = await self._cli("inspect", "--format", "{{.State.Pid}}", c.name)
        pid = shown.out.strip()
        return int(pid) if shown.code == 0 and pid.isdigit() and int(pid) else None

    async def _exit_error(self, c: _Container) -> SessionCallError:
        """Why a container ended before it was healthy, from the CLI's code and last line."""
        if c.drain is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(c.drain), timeout=1)
        assert c.process is not None
        code = c.process.returncode
        text = c.tail.decode(errors="replace")
        lines = text.strip().splitlines()
        last = lines[-1][:300] if lines else "no output"
        if code in _ENGINE_ERRORS:
            if any(s in text for s in _NO_IMAGE):
                return SessionCallError(
                    "ImageNotFound",
                    f"{self.image} is not an image {self.engine} has here: {last}",
                    retryable=False,
                    maybe_started=False,
                )
            down = any(s in text for s in _ENGINE_DOWN)
            taken = _PORT_TAKEN in text  # its port taken after all, in the moment before
            return SessionCallError(
                "ContainerNotStarted",
                f"{self.engine} could not start the container (code {code}): {last}",
                retryable=down or taken,
                outage=down,
                maybe_started=False,
            )
        return SessionCallError(
            "ContainerExited",
            f"container exited with code {code} before it was healthy: {last}",
            retryable=False,
            maybe_started=False,
        )

    async def _post(self, c: _Container, payload: bytes) -> dict[str, Any]:
        """The invocation: failing to reach an agent that was healthy may have started the
        rollout, and is worth a retry (a new container if this one ended)."""
        timeout = aiohttp.ClientTimeout(sock_connect=30, sock_read=self._ready_timeout)
        try:
            async with self._client().post(
                f"{c.url}{_invocation.PATH}",
                data=payload,
                headers=_invocation.headers(c.sid),
                timeout=timeout,
            ) as resp:
                status, body = resp.status, await resp.read()
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            raise SessionCallError(
                type(e).__name__, f"invoking the container: {e}", retryable=True
            ) from None
        return _invocation.accepted(status, body)

    async def _remove(self, c: _Container) -> None:
        """Remove the container (SIGKILL: a stopped session ends at once, as a stopped microVM,
        no result written) and end its CLI process; one the CLI was still creating is removed
        again once the CLI ended."""
        if c.process is not None and c.process.returncode is None:
            await self._cli(*self._rm, c.name)
            try:
                await asyncio.wait_for(c.process.wait(), timeout=30)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    c.process.kill()
                await c.process.wait()
        if not c.healthy:  # created after the first rm, or never run
            await self._cli(*self._rm, c.name)
        if c.drain is not None:
            c.drain.cancel()

    async def _remove_orphans(self) -> None:
        """Remove the containers of runtimes gone before their `aclose` (a process killed),
        those of runtimes still running, here or elsewhere, kept."""
        found = await self._cli("ps", "-aq", "--filter", f"label={RUNTIME_LABEL}")
        if not (ids := found.out.split()):
            return
        template = '{{.Id}} {{index .Config.Labels "' + RUNTIME_LABEL + '"}}'
        shown = await self._cli("inspect", "--format", template, *ids)  # some may be gone
        labelled = (line.split(" ", 1) for line in shown.out.splitlines() if " " in line)
        if orphans := [cid for cid, owner in labelled if gone(owner)]:
            await self._cli(*self._rm, *orphans)

    async def _cli(self, *args: str, timeout: float = 60) -> _Done:
        """One engine command to its end, output captured (the caller checks the code)."""
        try:
            process = await asyncio.create_subprocess_exec(
                self._binary(),
                *args,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as e:
            return _Done(-1, "", str(e))
        try:
            out, err = await asyncio.wait_for(process.communicate(), timeout)
        except TimeoutError:
            process.kill()
            await process.wait()
            return _Done(-1, "", f"{self.engine} {args[0]} timed out")
        finally:
            if process.returncode is None:  # cancelled: no CLI process outlives its call
                process.kill()
                await process.wait()
        return _Done(process.returncode or 0, out.decode(errors="replace"), err.decode())

    def _client(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession()
        return self._http


def _retrieved(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()


@dataclass
class _Container:
    sid: str
    name: str = field(default_factory=lambda: f"agentcore-rollout-{uuid.uuid4().hex[:12]}")
    url: str = ""
    process: asyncio.subprocess.Process | None = None
    pid: int | None = None
    ready: asyncio.Future[None] | None = None
    drain: asyncio.Future[None] | None = None
    tail: bytes = b""  # the end of its output, for a failed start's message
    healthy: bool = False
    stopped: bool = False

    @property
    def exited(self) -> bool:
        return self.process is not None and self.process.returncode is not None

    async def keep_tail(self, stream: asyncio.StreamReader) -> None:
        """Read its output as it comes (a full pipe would block it), keeping the end."""
        while chunk := await stream.read(4096):
            self.tail = (self.tail + chunk)[-_TAIL:]


@dataclass(frozen=True)
class _Done:
    code: int
    out: str
    err: str


def _cpu_ticks(root: int | None) -> int | None:
    """The CPU time (clock ticks) process `root` and its descendants used, reaped children
    included; None where /proc does not show it."""
    proc = Path("/proc")
    if root is None or not (proc / str(root)).exists():
        return None
    children: dict[int, list[int]] = {}
    ticks: dict[int, int] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        pid = int(entry.name)
        children.setdefault(int(fields[1]), []).append(pid)  # field 4, counted after ")"
        ticks[pid] = sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
    total, pending, seen = 0, [root], set()
    while pending:
        pid = pending.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += ticks.get(pid, 0)
        pending += children.get(pid, [])
    return total
