"""GatewayAdmin: the engine's client for the gateway's admin API, one session per rollout: open
it, hand its key to the agent, then finish it (its trace goes on the outcome) or drop it (the
request failed: only its usage comes back).

The core's own client (aiohttp's), so the core imports nothing of `gateway/`, which re-exports it.
The trace's JSON shape and the merge rule: docs/gateway.md#the-traces-json-shape."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import aiohttp


class GatewayError(Exception):
    """An admin call failed; `status` is the HTTP status (0 if the gateway was unreachable)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class GatewaySession:
    """A created session. The key is secret: pass it to the agent, never log it. `url` is the
    gateway's agents' API as the gateway knows it (its own listener's address): what agents call
    unless the config names another (`public_url`)."""

    session_id: str
    api_key: str
    model: str = ""
    url: str = ""

    def __repr__(self) -> str:
        return (
            f"GatewaySession(session_id={self.session_id!r}, api_key='***', model={self.model!r}"
            f", url={self.url!r})"
        )


@dataclass(frozen=True)
class HeldSession:
    """A live session found by its request id: `turns` the agent has taken in it so far (none:
    its sandbox session may never have started)."""

    session_id: str
    turns: int


class GatewayAdmin:
    """Async client for the admin routes; one pooled HTTP session, `async with` or `close()`."""

    def __init__(self, url: str, admin_token: str, *, timeout: float = 60.0) -> None:
        """`url`: the gateway's admin listener (`Gateway.admin_url`), not the agents' one."""
        self.url = url.rstrip("/")
        self._token = admin_token
        # A replica that is down answers nothing: the engine moves on after 5 s, not `timeout`.
        self._timeout = aiohttp.ClientTimeout(total=timeout, sock_connect=min(timeout, 5.0))
        self._http: aiohttp.ClientSession | None = None

    def __repr__(self) -> str:
        return f"GatewayAdmin(url={self.url!r}, admin_token='***')"

    async def __aenter__(self) -> GatewayAdmin:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def create_session(
        self,
        request_id: str,
        *,
        sampling: dict[str, Any] | None = None,
        max_context: int | None = None,
        max_turns: int | None = None,
        traceparent: str | None = None,
    ) -> GatewaySession:
        """A new session with sampling defaults and limits; its key goes into `_rollout.llm`.
        With `traceparent` (the rollout's span), its turns join the rollout's trace."""
        body = {
            "request_id": request_id,
            "sampling": sampling,
            "max_context": max_context,
            "max_turns": max_turns,
        }
        if traceparent is not None:  # only then: a gateway before it needs no new field
            body["traceparent"] = traceparent
        data = await self._call("POST", "/admin/sessions", body)
        return GatewaySession(
            data["session_id"], data["api_key"], data.get("model", ""), data.get("url", "")
        )

    async def finish_session(self, session_id: str) -> dict[str, Any]:
        """Close the session and return its trace (shape in the module docstring)."""
        return await self._call("POST", f"/admin/sessions/{session_id}/finish")

    async def drop_session(self, session_id: str) -> dict[str, int] | None:
        """Close the session without a trace: its tokens so far (a trace's `usage`); None if
        it was already gone (idempotent), or from a gateway that predates the answer's usage."""
        try:
            answer = await self._call("DELETE", f"/admin/sessions/{session_id}")
        except GatewayError as exc:
            if exc.status == 404:
                return None
            raise
        usage = answer.get("usage")
        counts = isinstance(usage, dict) and all(type(n) is int for n in usage.values())
        return usage if counts else None

    async def session_of(self, request_id: str) -> HeldSession | None:
        """The live session the gateway opened for `request_id` (None if it holds none): an
        engine that restarted finds an earlier engine's sessions, and their traces, this way."""
        try:
            data = await self._call("GET", f"/admin/requests/{request_id}")
        except GatewayError as exc:
            if exc.status == 404:
                return None
            raise
        return HeldSession(data["session_id"], int(data["turns"]))

    async def stats(self) -> dict[str, Any]:
        """The gateway's counters: {"sessions": live, "turns": rendered since start,
        "render": {"incremental", "shared", "fallback", "full"},
        "prompt_tokens": {"reused", "encoded"},
        "ignored_fields": {field name: turns that sent it with no effect},
        "undelivered_turns": int, "count_tokens": int (requests answered)}."""
        return await self._call("GET", "/admin/stats")

    async def _call(self, method: str, path: str, body: Any = None) -> Any:
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(timeout=self._timeout)
        headers = {"Authorization": f"Bearer {self._token}"}
        try:
            async with self._http.request(
                method, self.url + path, json=body, headers=headers
            ) as response:
                text = await response.text()
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise GatewayError(f"gateway unreachable at {self.url}: {exc!r}") from None
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        if status >= 400:
            error = data.get("error") if isinstance(data, dict) else None
            message = error.get("message") if isinstance(error, dict) else text[:200]
            raise GatewayError(f"gateway {method} {path} -> {status}: {message}", status)
        if not isinstance(data, dict):
            raise GatewayError(f"gateway {method} {path} answered non-JSON", status)
        return data
