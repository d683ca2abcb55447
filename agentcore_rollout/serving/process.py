"""Child processes of the local stack: started, awaited until they print their URL, stopped.

Each child runs in its own session, so a Ctrl-C at the terminal reaches only the parent,
which then stops the children in order (the engine may still need S3 while it shuts down).
Children also watch their parent and exit if it dies, so a killed parent leaves no orphans.
"""

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


class ServiceProcess:
    """`python -m <module> <args>` that prints its URL as its first line of output (a server
    with several listeners prints them all on that line, its `url` first: `urls`)."""

    def __init__(self, name: str, module: str, *args: str, env: dict[str, str] | None = None):
        self.name = name
        self._argv = [sys.executable, "-m", module, *args]
        self._env = env
        self._process: subprocess.Popen[str] | None = None
        self.url = ""
        self.urls: tuple[str, ...] = ()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    @property
    def exit_code(self) -> int | None:
        """Its exit code if it has died since it started; None while it runs (or never ran)."""
        return self._process.poll() if self._process else None

    def start(self, timeout: float = 60.0) -> str:
        env = {**os.environ, **(self._env or {}), "AGENTCORE_ROLLOUT_PARENT_PID": str(os.getpid())}
        self._process = subprocess.Popen(
            self._argv, stdout=subprocess.PIPE, text=True, start_new_session=True, env=env
        )
        assert self._process.stdout is not None
        timer = threading.Timer(timeout, self._process.kill)
        timer.start()
        try:
            line = self._process.stdout.readline().strip()
        finally:
            timer.cancel()
        urls = tuple(line.split())
        if not urls or not all(url.startswith(("http://", "https://")) for url in urls):
            code = self._process.poll()
            self.stop()
            raise RuntimeError(f"{self.name} did not start (exit code {code}, printed {line!r})")
        self.url, self.urls = urls[0], urls
        # What it prints later (an in_process agent's prints among it) goes where its stderr
        # goes: a pipe nobody read would fill and block the child at its next print.
        stdout = self._process.stdout
        threading.Thread(target=_forward, args=(stdout,), daemon=True, name=self.name).start()
        return line

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
