"""What keeps one agent from stalling the others: bounded bodies, read deadlines, bounded nesting, a
bound on a session's requests in flight, and a thread pool for big requests' CPU work.

The defaults, why each, and what happens past it:
docs/gateway.md#limits-one-agent-cannot-stall-the-others."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from aiohttp import web

from ..serving.http import json_object
from . import _fastjson
from ._http import GatewayHTTPError

T = TypeVar("T")

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
READ_TIMEOUT = 20.0
DEFAULT_SESSION_REQUESTS = 16
MAX_DEPTH = 64
POOL_BYTES = 64 * 1024


def cpu_count() -> int:
    """The CPUs this process may run on (os.process_cpu_count from Python 3.13)."""
    counted = getattr(os, "process_cpu_count", None)
    if counted is not None:
        return counted() or 1
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def new_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=cpu_count(), thread_name_prefix="gateway-cpu")


async def in_pool(pool: ThreadPoolExecutor | None, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` in `pool`, or here without one (a small request's work, or a pipeline used
    outside a server)."""
    if pool is None:
        return fn(*args)
    return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)


@contextlib.asynccontextmanager
async def in_flight(session: Any, limit: int) -> AsyncIterator[None]:
    """Count a request against its session's bound: past `limit` in flight, a 429."""
    if session.requests >= limit:
        raise GatewayHTTPError(
            429,
            f"this session already has {limit} requests in flight (the gateway's "
            "max_session_requests): wait for one to finish",
            code="rate_limit_exceeded",
        )
    session.requests += 1
    try:
        yield
    finally:
        session.requests -= 1


async def read_body(request: web.Request, max_bytes: int) -> bytes:
    """The body's bytes: a 413 past `max_bytes` (before reading it when its length is
    declared), a 408 if it is not all in within READ_TIMEOUT."""
    if request.content_length is not None and request.content_length > max_bytes:
        raise _too_large(max_bytes)
    try:
        async with asyncio.timeout(READ_TIMEOUT):
            return await request.read()
    except TimeoutError:
        message = f"the request body did not arrive within {READ_TIMEOUT:g} s"
        raise GatewayHTTPError(408, message, code="request_timeout") from None
    except web.HTTPRequestEntityTooLarge:
        raise _too_large(max_bytes) from None


def pool_for(raw: bytes, pool: ThreadPoolExecutor | None) -> ThreadPoolExecutor | None:
    """Where a request's CPU work runs: `pool` for a body over POOL_BYTES, else the loop (a
    hop to a thread costs about 60 µs of CPU, more than a short turn's render or parse)."""
    return pool if len(raw) > POOL_BYTES else None


def parse_body(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object no deeper than MAX_DEPTH; a 400 otherwise."""
    body = json_object(raw, _fastjson.loads)
    path = too_deep(body, 1)
    if path is not None:
        where = ".".join(map(str, path[:6])) + (".…" if len(path) > 6 else "")
        raise ValueError(f"{where} nests deeper than {MAX_DEPTH} levels: the gateway refuses it")
    return body


def _too_large(max_bytes: int) -> GatewayHTTPError:
    message = f"the request body is over the gateway's limit of {max_bytes} bytes (max_body_bytes)"
    return GatewayHTTPError(413, message, code="request_too_large")


def too_deep(value: dict[str, Any] | list[Any], depth: int) -> list[Any] | None:
    """The path to the first container nested past MAX_DEPTH in `value` (itself at `depth`),
    or None. Recursive, but never deeper than MAX_DEPTH."""
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, item in items:
        if isinstance(item, dict | list):
            if depth >= MAX_DEPTH:
                return [key]
            path = too_deep(item, depth + 1)
            if path is not None:
                return [key, *path]
    return None
