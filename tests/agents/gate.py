"""Named one-shot signals that a test agent's stream waits on and another invocation on the
same session (same process) sets. Thread-safe: bedrock-agentcore runs handlers and streams on
different threads and event loops, so an asyncio.Event could not be shared."""

from __future__ import annotations

import asyncio
import threading

_gates: dict[str, threading.Event] = {}
_lock = threading.Lock()


def _gate(tag: str) -> threading.Event:
    with _lock:
        return _gates.setdefault(tag, threading.Event())


def release(tag: str) -> None:
    _gate(tag).set()


async def wait(tag: str, timeout: float) -> bool:
    """True once released; False after `timeout` seconds."""
    gate = _gate(tag)
    loop = asyncio.get_running_loop()
    give_up = loop.time() + timeout
    while not gate.is_set():
        if loop.time() > give_up:
            return False
        await asyncio.sleep(0.01)
    return True


def wait_blocking(tag: str, timeout: float) -> bool:
    """`wait` for code that runs in a thread (a synchronous generator)."""
    return _gate(tag).wait(timeout)
