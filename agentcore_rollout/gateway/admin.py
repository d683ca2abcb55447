"""The admin API: the routes the engine (`GatewayAdmin`) opens, finishes, drops and finds sessions
with, and reads the counters from; each takes the admin token as `Authorization: Bearer`.

A listener of its own (`AdminAPI`), apart from the agents' API, on 127.0.0.1 and plain HTTP by
default: exposing the agents' port exposes no admin route. The routes:
docs/gateway.md#the-admin-api."""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware

from ..serving.http import read_json_object
from ..serving.server import Server
from . import _fastjson
from ._http import GatewayHTTPError, bearer, json_response
from .pipeline import TurnPipeline
from .sessions import Session, SessionStore

log = logging.getLogger(__name__)


class AdminAPI(Server):
    """The admin routes over a gateway's `sessions` and the counters of its `pipeline`, behind
    `token`, on `host:port`; `model` is the model name sessions and traces report, `agents_url`
    where the gateway serves the agents (a created session's `url`), `errors` the gateway's
    error middleware (one shape of error for both listeners)."""

    def __init__(
        self,
        sessions: SessionStore,
        pipeline: TurnPipeline,
        *,
        token: str,
        model: str,
        agents_url: Callable[[], str],
        errors: Middleware,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        super().__init__(host, port)
        self.sessions = sessions
        self.pipeline = pipeline
        self.token = token
        self.model = model
        self._agents_url = agents_url
        self._errors = errors

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._errors])
        app.add_routes(
            [
                web.post("/admin/sessions", self._create),
                web.post("/admin/sessions/{session_id}/finish", self._finish),
                web.delete("/admin/sessions/{session_id}", self._drop),
                web.get("/admin/requests/{request_id}", self._session_of),
                web.get("/admin/stats", self._stats),
            ]
        )
        return app

    def stats(self) -> dict[str, Any]:
        """The counters /admin/stats answers (see `GatewayAdmin.stats`)."""
        return {"sessions": len(self.sessions), **self.pipeline.stats()}

    def _check(self, request: web.Request) -> None:
        token = bearer(request) or ""
        if not hmac.compare_digest(token.encode(), self.token.encode()):
            log.warning("rejected an admin request with a missing or wrong admin token")
            raise GatewayHTTPError(401, "admin token required", code="invalid_admin_token")

    async def _create(self, request: web.Request) -> web.StreamResponse:
        self._check(request)
        body = await read_json_object(request, _fastjson.loads)
        session, key = self.sessions.create(
            body.get("request_id"),
            sampling=body.get("sampling"),
            max_context=body.get("max_context"),
            max_turns=body.get("max_turns"),
            traceparent=body.get("traceparent"),
        )
        answer = {
            "session_id": session.id,
            "api_key": key,
            "model": self.model,
            "url": self._agents_url(),
        }
        return json_response(answer, status=201)

    async def _finish(self, request: web.Request) -> web.StreamResponse:
        self._check(request)
        session = self._remove(request, "finished")
        backend = self.pipeline.backend
        trace = session.trace(
            token_capture=backend.token_capture,
            backend=backend.name,
            model=self.model,
            renderer=getattr(self.pipeline.renderer, "name", None),  # None: a pass-through
        )
        return json_response(trace)

    async def _drop(self, request: web.Request) -> web.StreamResponse:
        self._check(request)
        session = self._remove(request, "dropped")
        return json_response({"session_id": session.id, "dropped": True, "usage": session.usage()})

    async def _session_of(self, request: web.Request) -> web.StreamResponse:
        self._check(request)
        request_id = request.match_info["request_id"]
        session = self.sessions.by_request(request_id)
        if session is None:
            raise GatewayHTTPError(
                404, f"no live session for request {request_id[:64]!r}", code="session_not_found"
            )
        return json_response({"session_id": session.id, "turns": session.turns_started})

    async def _stats(self, request: web.Request) -> web.StreamResponse:
        self._check(request)
        return json_response(self.stats())

    def _remove(self, request: web.Request, reason: str) -> Session:
        session_id = request.match_info["session_id"]
        session = self.sessions.remove(session_id, reason=reason)
        if session is None:
            raise GatewayHTTPError(
                404, f"no live session {session_id[:64]!r}", code="session_not_found"
            )
        return session
