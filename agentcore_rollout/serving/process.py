"""Child processes of the local stack: started, awaited until they print their URL, stopped.

A child is waited for as long as it makes progress (a line on its stderr, or CPU time used), not
for a fixed time: one loading a model on a busy machine can take minutes (the bounds:
docs/local-stack.md). Each child runs in its own session, so a Ctrl-C reaches only the parent,
which stops them in order (the engine may still need S3); children exit if their parent dies."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import suppress
from typing import Any

STALL_SETTING = "local.start_stall_seconds"
LIMIT_SETTING = "local.start_limit_seconds"
CPU_PROGRESS = 0.1  # seconds of CPU time that count as progress (an idle child uses ~0)
POLL = 0.25  # seconds between looks at a starting child


class ServiceProcess:
    """`python -m <module> <args>` that prints its URL as its first line of output (a server
    with several listeners prints them all on that line, its `url` first: `urls`). `stall` and
    `limit` bound its start (see the module docstring)."""

    def __init__(
        self,
        name: str,
        module: str,
        *args: str,
        env: dict[str, str] | None = None,
        stall: float = 60.0,
        limit: float = 1800.0,
    ):
        self.name = name
        self._argv = [sys.executable, "-m", module, *args]
        self._env = env
        self._process: subprocess.Popen[str] | None = None
        self.url = ""
        self.urls: tuple[str, ...] = ()
        self.stall, self.limit = stall, limit
        self._last_output = 0.0  # monotonic time of its last stderr line

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    @property
    def exit_code(self) -> int | None:
        """Its exit code if it has died since it started; None while it runs (or never ran)."""
        return self._process.poll() if self._process else None

    def start(self, timeout: float | None = None) -> str:
        """Start it and wait for its URL while it makes progress; `timeout` overrides `stall`.
        RuntimeError naming why if it exits first or a bound is reached (it is killed then)."""
        stall = self.stall if timeout is None else timeout
        env = {**os.environ, **(self._env or {}), "AGENTCORE_ROLLOUT_PARENT_PID": str(os.getpid())}
        self._process = process = subprocess.Popen(
            self._argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            env=env,
        )
        assert process.stdout is not None and process.stderr is not None
        started = self._last_output = time.monotonic()
        # Its stderr goes where ours goes, each line counted as progress; its first stdout line
        # is read aside, so the wait below can look at the child meanwhile.
        threading.Thread(
            target=self._forward_stderr,
            args=(process.stderr,),
            daemon=True,
            name=f"{self.name} stderr",
        ).start()
        first: list[str] = []
        reader = threading.Thread(
            target=lambda: first.append(process.stdout.readline()),
            daemon=True,  # type: ignore[union-attr]
        )
        reader.start()
        cpu, progressed = _cpu_seconds(process.pid), started
        why = ""
        while True:
            reader.join(POLL)
            if not reader.is_alive():
                break
            now = time.monotonic()
            used = _cpu_seconds(process.pid)
            if used is not None and cpu is not None and used - cpu >= CPU_PROGRESS:
                cpu, progressed = used, now
            progressed = max(progressed, self._last_output)
            if now - progressed >= stall:
                why = (
                    f"no progress (no output, no CPU time used) for {stall:g} s: the bound "
                    f"{STALL_SETTING} sets (raise it on a busy machine)"
                )
            elif now - started >= self.limit:
                why = (
                    f"no URL after {self.limit:g} s, though it was still working: the bound "
                    f"{LIMIT_SETTING} sets"
                )
            if why:
                process.kill()
                reader.join()
                break
        line = (first[0] if first else "").strip()
        urls = tuple(line.split())
        if not urls or not all(url.startswith(("http://", "https://")) for url in urls):
            code = process.wait() if why else process.poll()
            self.stop()
            if why:
                raise RuntimeError(f"{self.name} did not start: killed after {why}")
            raise RuntimeError(f"{self.name} did not start (exit code {code}, printed {line!r})")
        self.url, self.urls = urls[0], urls
        # What it prints later (an in_process agent's prints among it) goes where its stderr
        # goes: a pipe nobody read would fill and block the child at its next print.
        threading.Thread(
            target=_forward, args=(process.stdout,), daemon=True, name=self.name
        ).start()
        return line

    def _forward_stderr(self, stderr: Any) -> None:
        with suppress(OSError, ValueError):
            for line in stderr:
                self._last_output = time.monotonic()
                sys.stderr.write(line)

    def stop(self, timeout: float = 10.0) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stdout is not None:
            process.stdout.close()


def _cpu_seconds(pid: int) -> float | None:
    """The CPU time `pid` and its reaped children used (/proc/<pid>/stat); None off Linux or
    once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # After the name: state is fields[0], so utime, stime, cutime, cstime are fields[11:15].
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def _forward(stdout: Any) -> None:
    with suppress(OSError, ValueError):  # closed by stop()
        for line in stdout:
            sys.stderr.write(line)


def exit_with_parent() -> None:
    """In a child: exit when the parent that started us is gone (its pid is in the env)."""
    parent = os.environ.get("AGENTCORE_ROLLOUT_PARENT_PID")
    if not parent:
        return

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != int(parent):
                os._exit(0)

    threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()


async def serve_until_signalled(server: Any) -> None:
    """In a child: run an `async with` server, print its URLs (the line `ServiceProcess`
    waits for), and stop cleanly on SIGINT or SIGTERM, or exit with the parent."""
    exit_with_parent()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        print(*server.urls, flush=True)
        await stop.wait()
