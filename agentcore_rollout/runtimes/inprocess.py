"""`SandboxRuntime` in this process: every session is one ASGI app (a `RolloutApp`) called
directly, without a socket. For tests, the engine's and users': sessions start in
microseconds, and refusals and throttling can be asked for.

A RolloutApp keeps its sessions apart itself (by the session id of each payload), so one
instance serves them all; stopping a session cancels its rollouts (`cancel_session`), as a
stopped microVM ends them, no result written. The app's lifespan is not run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from . import _invocation
from .base import RuntimeLimits, SandboxRuntime, SessionCallError

ASGIApp = Callable[
    [
        MutableMapping[str, Any],
        Callable[[], Awaitable[MutableMapping[str, Any]]],
        Callable[[MutableMapping[str, Any]], Awaitable[None]],
    ],
    Awaitable[None],
]


class InProcessRuntime(SandboxRuntime):
    """`InProcessRuntime(app)`: sessions of `app` (a RolloutApp, or any ASGI app answering
    `POST /invocations` as one does). Its limits are generous unless given; a session past
    `max_live_sessions` is refused as AgentCore's quota refuses it, and `refuse_next` throttles
    the next starts."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        name: str = "in-process",
        environment: str | None = None,
        start_rate: float = 1000.0,
        call_rate: float = 1000.0,
        max_live_sessions: int = 1000,
        pool: str | None = None,
    ) -> None:
        self.app = app
        self.name = name
        self.environment = environment
        self._limits = RuntimeLimits(
            start_rate=start_rate,
            call_rate=call_rate,
            max_live_sessions=max_live_sessions,
            pool=pool or name,
            source="InProcessRuntime's arguments",
        )
        self._live: set[str] = set()
        self._refusals = 0

    @property
    def live(self) -> frozenset[str]:
        """The sessions started and not stopped."""
        return frozenset(self._live)

    def refuse_next(self, count: int = 1) -> None:
        """Throttle the next `count` session starts (a ThrottlingException: retryable, slows
        the start rate, started nothing)."""
        self._refusals += count

    async def limits(self) -> RuntimeLimits:
        return self._limits

    async def invoke(self, session_id: str, payload: bytes) -> dict[str, Any]:
        if session_id not in self._live:
            self._admit()
            self._live.add(session_id)
        try:
            status, body = await _post(self.app, session_id, payload)
        except Exception as e:  # what a server would answer 500 for
            raise SessionCallError(
                "NotAccepted", f"the app raised {type(e).__name__}: {e}", retryable=False
            ) from None
        return _invocation.accepted(status, body)

    def _admit(self) -> None:
        if self._refusals:
            self._refusals -= 1
            raise SessionCallError(
                "ThrottlingException",
                "refused, as asked (refuse_next)",
                retryable=True,
                throttled=True,
                maybe_started=False,
            )
        if len(self._live) >= self._limits.max_live_sessions:
            raise SessionCallError(
                "ServiceQuotaExceededException",
                f"{len(self._live)} sessions live, the most this runtime holds",
                retryable=True,
                maybe_started=False,
            )

    async def stop(self, session_id: str) -> None:
        self._live.discard(session_id)
        if (cancel := getattr(self.app, "cancel_session", None)) is not None:
            cancel(session_id)

    async def aclose(self) -> None:
        """Stop every live session."""
        for session_id in list(self._live):
            await self.stop(session_id)

    async def __aenter__(self) -> InProcessRuntime:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


async def _post(app: ASGIApp, session_id: str, body: bytes) -> tuple[int, bytes]:
    """`POST /invocations` of `session_id` to `app`, as one ASGI HTTP request; its status and
    body. The client disconnects only once the response is complete (an app watching for a
    disconnect while it streams must not see one earlier)."""
    headers = [(k.lower().encode(), v.encode()) for k, v in _invocation.headers(session_id).items()]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": _invocation.PATH,
        "raw_path": _invocation.PATH.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [*headers, (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 0),
        "server": ("in-process", 80),
    }
    sent, complete = False, asyncio.Event()
    status, chunks = 500, []

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await complete.wait()
        return {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = int(message["status"])
        elif message["type"] == "http.response.body":
            chunks.append(bytes(message.get("body", b"")))
            if not message.get("more_body", False):
                complete.set()

    try:
        await app(scope, receive, send)
    finally:
        complete.set()
    return status, b"".join(chunks)
