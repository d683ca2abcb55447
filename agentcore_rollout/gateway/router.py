"""SGLangRouter: sglang-router (0.3.2) as a managed subprocess on loopback, spreading `/generate`
over workers that come and go at run time (how a trainer swaps in fresh inference servers).

Measured on 0.3.2: its Prometheus exporter binds 0.0.0.0:29000 unless told otherwise (so it gets
a loopback port), and adding or removing a worker is asynchronous (so each waits until visible).
Workers must not report a `model_path` (the router would fetch that tokenizer from the hub); its
gRPC probe of each worker is logged once by aiohttp workers as a bad request: harmless."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class RouterError(RuntimeError):
    """The router could not be started, did not become healthy, or refused a worker change."""


_BIND_ATTEMPTS = 3


def free_ports(n: int) -> list[int]:
    """`n` distinct loopback TCP ports that are free now (the router cannot bind port 0 and
    report it): held together while chosen, so they differ; another process may still take one
    before the router binds it."""
    with contextlib.ExitStack() as held:
        socks = [held.enter_context(socket.socket()) for _ in range(n)]
        for sock in socks:
            sock.bind((LOOPBACK, 0))
        return [int(sock.getsockname()[1]) for sock in socks]


class SGLangRouter:
    """`async with SGLangRouter([worker_url, ...]) as router: router.url`.

    `policy` is sglang-router's load-balancing policy (random, round_robin, cache_aware,
    power_of_two). `startup_timeout` bounds both the router's own start and each worker's
    registration. `extra_args` are appended to the command line verbatim. The router's log goes
    to `log_path` (a temporary file by default, removed on stop).
    """

    def __init__(
        self,
        workers: Sequence[str] = (),
        *,
        port: int = 0,
        policy: str = "round_robin",
        startup_timeout: float = 30.0,
        stop_timeout: float = 5.0,
        log_level: str = "warn",
        log_path: str | os.PathLike[str] | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.initial_workers = list(workers)
        self.port = port
        self.prometheus_port = 0
        self.policy = policy
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.log_level = log_level
        self.extra_args = list(extra_args)
        self._log_path = Path(log_path) if log_path is not None else None
        self._own_log = log_path is None
        self._proc: subprocess.Popen[bytes] | None = None
        self._http: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def command(self) -> list[str]:
        """The router's command line (after ports are chosen)."""
        return [
            *(sys.executable, "-m", "sglang_router.launch_router"),
            *("--host", LOOPBACK, "--port", str(self.port)),
            *("--prometheus-host", LOOPBACK, "--prometheus-port", str(self.prometheus_port)),
            *("--policy", self.policy, "--log-level", self.log_level),
            *("--shutdown-grace-period-secs", str(max(1, int(self.stop_timeout)))),
            *self.extra_args,
        ]

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Spawn the router, wait for /health, then register the initial workers."""
        if self._proc is not None:
            raise RouterError("router already started")
        chosen = not self.port  # ports we picked may be taken before the router binds them
        for attempt in range(_BIND_ATTEMPTS):
            if chosen:
                self.port, self.prometheus_port = free_ports(2)
            else:
                (self.prometheus_port,) = free_ports(1)
            try:
                await self._launch()
                break
            except RouterError as e:
                if "Address already in use" not in str(e) or attempt == _BIND_ATTEMPTS - 1:
                    raise
                log.warning("sglang-router: a port was taken meanwhile; trying others")
        log.info("sglang-router on %s (pid %s)", self.url, self.pid)

    async def _launch(self) -> None:
        if self._log_path is None:
            fd, name = tempfile.mkstemp(prefix="sglang-router-", suffix=".log")
            os.close(fd)
            self._log_path = Path(name)
        self._proc = _spawn(self.command(), self._log_path)
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        try:
            await self._wait_healthy()
            for url in self.initial_workers:
                await self.add_worker(url)
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """SIGTERM the router's process group, SIGKILL after `stop_timeout`; idempotent."""
        proc, self._proc = self._proc, None
        if self._http is not None:
            await self._http.close()
            self._http = None
        if proc is not None:
            await _terminate(proc, self.stop_timeout)
        if self._own_log and self._log_path is not None:
            with contextlib.suppress(OSError):
                self._log_path.unlink()
            self._log_path = None

    async def __aenter__(self) -> SGLangRouter:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while True:
            proc = self._proc
            if proc is None or proc.poll() is not None:
                code = None if proc is None else proc.returncode
                raise RouterError(f"sglang-router exited with code {code}: {self.log_tail()}")
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with self._client().get(f"{self.url}/health") as response:
                    if response.status == 200:
                        return
            if time.monotonic() > deadline:
                raise RouterError(
                    f"sglang-router not healthy on {self.url} after {self.startup_timeout:g}s: "
                    f"{self.log_tail()}"
                )
            await asyncio.sleep(0.05)

    def log_tail(self, lines: int = 8) -> str:
        """The last lines of the router's log (ANSI colours stripped), for error messages."""
        if self._log_path is None or not self._log_path.exists():
            return "(no log)"
        text = _ANSI.sub("", self._log_path.read_text(errors="replace")).strip().splitlines()
        return " | ".join(line.strip() for line in text[-lines:]) or "(empty log)"

    # -- workers ------------------------------------------------------------------------------

    def _client(self) -> aiohttp.ClientSession:
        if self._http is None:
            raise RouterError("router is not running")
        return self._http

    async def workers(self) -> list[dict[str, Any]]:
        """The router's worker list (`url`, `id`, `is_healthy`, `load`, ...)."""
        async with self._client().get(f"{self.url}/workers") as response:
            if response.status != 200:
                raise RouterError(f"GET /workers -> {response.status}: {await response.text()}")
            data = await response.json()
        return list(data.get("workers") or [])

    async def add_worker(self, url: str, timeout: float | None = None) -> str:
        """Register a worker and wait until the router lists it healthy; returns its id."""
        url = url.rstrip("/")
        async with self._client().post(f"{self.url}/workers", json={"url": url}) as response:
            if response.status not in (200, 201, 202):
                detail = await response.text()
                raise RouterError(f"router refused worker {url}: {response.status} {detail}")
        worker = await self._wait_for(url, present=True, timeout=timeout)
        log.info("router worker added: %s", url)
        return str(worker["id"])

    async def remove_worker(self, url: str, timeout: float | None = None) -> None:
        """Deregister a worker and wait until the router no longer lists it."""
        url = url.rstrip("/")
        worker = next((w for w in await self.workers() if w.get("url") == url), None)
        if worker is None:
            raise RouterError(f"worker {url} is not registered")
        async with self._client().delete(f"{self.url}/workers/{worker['id']}") as response:
            if response.status not in (200, 202, 204):
                detail = await response.text()
                raise RouterError(f"router refused to remove {url}: {response.status} {detail}")
        await self._wait_for(url, present=False, timeout=timeout)
        log.info("router worker removed: %s", url)

    async def _wait_for(self, url: str, *, present: bool, timeout: float | None) -> dict[str, Any]:
        limit = self.startup_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        while True:
            workers = {w.get("url"): w for w in await self.workers()}
            worker = workers.get(url)
            if present and worker is not None and worker.get("is_healthy"):
                return worker
            if not present and worker is None:
                return {}
            if time.monotonic() > deadline:
                state = "healthy in" if present else "removed from"
                raise RouterError(
                    f"worker {url} not {state} the router after {limit:g}s "
                    f"(is it up and answering GET /health?): {self.log_tail(3)}"
                )
            await asyncio.sleep(0.05)


def _spawn(argv: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    with open(log_path, "ab") as out:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stop() signals all of it
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )


async def _terminate(proc: subprocess.Popen[bytes], grace: float) -> None:
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            await asyncio.to_thread(proc.wait, wait)
            break
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # anything left in the group


def _die_with_parent() -> None:  # runs in the child between fork and exec
    PR_SET_PDEATHSIG = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
