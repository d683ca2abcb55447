"""Ctrl-C for every long command: the first SIGINT/SIGTERM asks the command to stop cleanly
(it still writes what it has), a second one interrupts for real."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Coroutine
from typing import Any

from .views import console


def run_async(
    make: Callable[[asyncio.Event], Coroutine[Any, Any, Any]],
    stopping: str = "stopping: cancelling unfinished rollouts (again to force)",
) -> Any:
    """Run `make(stop)`; the first signal sets `stop` (announced with `stopping`)."""

    async def body() -> Any:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, _on_signal, stop, loop, sig, stopping)
        return await make(stop)

    return asyncio.run(body())


def _on_signal(
    stop: asyncio.Event, loop: asyncio.AbstractEventLoop, sig: int, stopping: str
) -> None:
    if stop.is_set():
        loop.remove_signal_handler(sig)
        signal.raise_signal(sig)
        return
    console.print(f"[yellow]{stopping}")
    stop.set()
