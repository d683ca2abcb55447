"""Gateway: the endpoint agents call, in the API they already speak, which records exact traces.

Each API is a `turns.Dialect`; every turn is answered the same way (`pipeline`), and the dialect
turns the answer back into its reply or stream. Two listeners, the agents' (`url`) and the admin
API (`admin.AdminAPI`), so exposing the agents' port exposes no admin route. Built on aiohttp
(`serving.Server`): it runs inside the engine's event loop without uvicorn. Routes and listeners:
docs/gateway.md#two-listeners-the-agents-api-and-the-admin-api."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import WSMsgType, web

from .._engine.tracing import TRACEPARENT, child_span, flush, tracer
from ..serving.http import Handler, sent, sse_events
from ..serving.server import Server, tls_context
from . import _fastjson, responses
from ._http import GatewayHTTPError, bearer, json_response
from ._limits import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_SESSION_REQUESTS,
    READ_TIMEOUT,
    in_flight,
    in_pool,
    new_pool,
    parse_body,
    pool_for,
    read_body,
)
from .admin import AdminAPI
from .backends import Backend, BackendError
from .chat import ChatDialect
from .messages import MessagesDialect
from .pipeline import TurnPipeline
from .render import Renderer
from .responses import ResponsesDialect
from .resume import ResumePolicy
from .sessions import Session, SessionStore
from .turns import Dialect, TurnAnswer

log = logging.getLogger(__name__)

DEFAULT_SESSION_TTL = 6 * 3600.0


class Gateway(Server):
    """The token-capture gateway; `async with Gateway(backend, renderer) as gw: gw.url`.

    `backend` samples turns (the gateway closes it on stop); `renderer` turns messages into ids
    and is required when the backend captures tokens. Agents call `url` (`host:port`; HTTPS with
    `tls_cert` and `tls_key`, PEM files); the engine calls `admin_url` (`admin_host:admin_port`,
    plain HTTP), with `admin_token` (a random one is made if not given; read it from
    `.admin_token`), which opens no agent route. Sessions idle for longer
    than `session_ttl` seconds are dropped, so a crashed engine cannot leak them forever.
    `resume` bounds how aborted turns are resumed (`resume.ResumePolicy`). `strict_fields`
    refuses the request fields that change nothing sampled, rather than ignoring them (`turns`).
    A request body over `max_body_bytes` is a 413; past `max_session_requests` requests in
    flight on one session, the next is a 429 (`gateway/_limits.py` says why these defaults).
    """

    def __init__(
        self,
        backend: Backend,
        renderer: Renderer | None = None,
        *,
        admin_token: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        admin_host: str = "127.0.0.1",
        admin_port: int = 0,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        model_name: str = "policy",
        session_ttl: float | None = DEFAULT_SESSION_TTL,
        resume: ResumePolicy | None = None,
        strict_fields: bool = False,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_session_requests: int = DEFAULT_SESSION_REQUESTS,
    ) -> None:
        if backend.token_capture and renderer is None:
            raise ValueError(f"the {backend.name} backend captures tokens and needs a renderer")
        if admin_token is not None and len(admin_token) < 16:
            raise ValueError("admin_token must be at least 16 characters")
        if (tls_cert is None) != (tls_key is None):
            raise ValueError("TLS needs both tls_cert and tls_key (PEM files), or neither")
        if max_body_bytes < 1024 or max_session_requests < 1:
            raise ValueError("max_body_bytes must be at least 1024, max_session_requests 1")
        tls = tls_context(tls_cert, tls_key) if tls_cert and tls_key else None
        super().__init__(host, port, ssl_context=tls)
        self.max_body_bytes, self.max_session_requests = max_body_bytes, max_session_requests
        self._pool: ThreadPoolExecutor | None = None  # while serving: big requests' CPU work
        self.admin_token = admin_token or secrets.token_urlsafe(32)
        self.model_name = model_name
        self.sessions = SessionStore(ttl=session_ttl)
        self.pipeline = TurnPipeline(backend, renderer, resume or ResumePolicy())
        self._tracer = tracer("agentcore-rollout-gateway")  # None: OpenTelemetry not configured
        self.admin = AdminAPI(
            self.sessions,
            self.pipeline,
            token=self.admin_token,
            model=model_name,
            agents_url=lambda: self.url,
            errors=self._errors,
            host=admin_host,
            port=admin_port,
        )
        self._messages = MessagesDialect(strict_fields)
        self._responses = ResponsesDialect(strict_fields)
        self.websocket_connections = 0  # Responses WebSockets opened
        self.websocket_requests = 0  # response.create messages over them
        self.dialects: tuple[Dialect, ...] = (
            ChatDialect(strict_fields),
            self._responses,
            self._messages,
        )

    def __repr__(self) -> str:
        backend = self.pipeline.backend.name
        return (
            f"Gateway(url={self.url!r}, admin_url={self.admin_url!r}, backend={backend!r}, "
            "admin_token='***')"
        )

    @property
    def admin_url(self) -> str:
        """Where the admin API listens (plain HTTP; loopback by default)."""
        return self.admin.url

    @property
    def urls(self) -> tuple[str, ...]:
        return (self.url, self.admin_url)

    def stats(self) -> dict[str, Any]:
        """The counters /admin/stats answers (see `GatewayAdmin.stats`)."""
        return self.admin.stats()

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """The agents' listener (its app runs the session reaper), then the admin's."""
        await super().start()
        try:
            await self.admin.start()
        except BaseException:
            await super().stop()
            raise
        backend = self.pipeline.backend.name
        log.info("gateway: agents %s, admin %s (backend %s)", self.url, self.admin_url, backend)

    async def stop(self) -> None:
        """The admin listener first (no session opens while the agents' requests drain)."""
        try:
            await self.admin.stop()
        finally:
            await super().stop()
        if self._tracer is not None:
            await flush()  # the turns' spans still batched

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._errors], client_max_size=self.max_body_bytes)
        for dialect in self.dialects:
            handler = functools.partial(self._serve, dialect=dialect)
            app.add_routes([web.post(path, handler) for path in dialect.paths])
        counts = [web.post(f"{p}/count_tokens", self._count_tokens) for p in self._messages.paths]
        app.add_routes(counts)
        app.add_routes([web.get("/v1/models", self._models), web.get("/health", self._health)])
        app.add_routes([web.get(path, self._responses_ws) for path in self._responses.paths])
        app.cleanup_ctx.append(self._lifespan)
        return app

    async def _lifespan(self, app: web.Application) -> AsyncIterator[None]:
        """While serving, sessions idle past the TTL are dropped; once the requests in flight
        are answered, the rest are closed, and the backend too."""
        ttl = self.sessions.ttl
        reaper = asyncio.create_task(self._reap(ttl)) if ttl is not None else None
        self._pool = pool = new_pool()
        yield
        if reaper is not None:
            reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reaper
        self.sessions.close_all()
        self._pool = None
        pool.shutdown(wait=False, cancel_futures=True)
        await self.pipeline.backend.close()

    def handler_options(self) -> dict[str, Any]:
        # aiohttp closes a connection still waiting for its request's headers when this fires
        return {"keepalive_timeout": READ_TIMEOUT}

    async def _reap(self, ttl: float) -> None:
        while True:
            await asyncio.sleep(min(max(ttl / 4, 0.05), 60.0))
            for session_id in self.sessions.expire():
                log.warning("session %s expired unfinished", session_id)

    # -- agent routes -------------------------------------------------------------------------

    def _agent_session(self, request: web.Request) -> Session:
        session = self.sessions.by_key(bearer(request) or request.headers.get("x-api-key"))
        if session is None:
            log.info("rejected an agent request with a missing, unknown or closed key")
            raise GatewayHTTPError(
                401,
                "invalid or expired gateway API key: use the per-session key from _rollout.llm",
                code="invalid_api_key",
            )
        return session

    async def _health(self, request: web.Request) -> web.StreamResponse:
        backend = self.pipeline.backend
        health = {"status": "ok", "sessions": len(self.sessions), "backend": backend.name}
        return json_response({**health, "token_capture": backend.token_capture})

    async def _models(self, request: web.Request) -> web.StreamResponse:
        self._agent_session(request)
        card = {"id": self.model_name, "object": "model", "created": 0, "owned_by": "gateway"}
        return json_response({"object": "list", "data": [card]})

    async def _serve(self, request: web.Request, dialect: Dialect) -> web.StreamResponse:
        """One turn in any dialect: check and convert the request, answer it, reply. A turn
        whose reply does not reach the agent is marked undelivered in the trace."""
        session = self._agent_session(request)
        async with in_flight(session, self.max_session_requests):
            body, pool = await self._read(request, session)
            turn = dialect.turn(body, session, self.model_name)
            work = self.pipeline.answer(session, turn, pool)
            answer = await (work if self._tracer is None else self._traced(request, session, work))
            try:
                if turn.stream:
                    return await sse_events(request, dialect.events(answer, turn), _fastjson.dumps)
                return await sent(request, json_response(dialect.reply(answer, turn)))
            except BaseException:
                self.pipeline.undelivered(session, answer.id)
                raise

    async def _responses_ws(self, request: web.Request) -> web.StreamResponse:
        """The Responses API over WebSocket (`GET /v1/responses`, as OpenAI serves it, and as
        Codex calls it first): each text message a `response.create` request (the POST body
        plus `"type"`), answered by the same events the POST streams, one JSON object each, on
        the same connection; the connection keeps its last response for `previous_response_id`
        (`responses.CONNECTION`). `generate: false` warms it up (`ResponsesDialect.prepared`);
        `response.processed` acknowledgements are read and dropped. A request that fails is an
        `error` event with its status, and the connection stays open."""
        session = self._agent_session(request)
        ws = web.WebSocketResponse(max_msg_size=self.max_body_bytes, heartbeat=30.0)
        if not ws.can_prepare(request).ok:
            raise GatewayHTTPError(
                426,
                "GET /v1/responses is the Responses API over WebSocket (send an Upgrade); "
                "POST /v1/responses serves it over HTTP",
                code="upgrade_required",
            )
        await ws.prepare(request)
        self.websocket_connections += 1
        responses.CONNECTION.set({})
        async for message in ws:
            if message.type != WSMsgType.TEXT:
                continue  # requests are JSON text; pings are answered by aiohttp
            try:
                await self._ws_request(request, ws, session, message.data)
            except ConnectionResetError:  # the agent went away mid-reply
                break
            except Exception as exc:
                if not isinstance(exc, (GatewayHTTPError, BackendError, ValueError)):
                    log.exception("gateway error on a Responses WebSocket")
                    exc = GatewayHTTPError(500, "internal gateway error", code="server_error")
                status = getattr(exc, "status", 400)
                code = getattr(exc, "code", None) or (
                    "backend_error" if isinstance(exc, BackendError) else None
                )
                error = self._responses.error(status, " ".join(str(exc).split()), code)["error"]
                if not ws.closed:
                    await _send(ws, {"type": "error", "status": status, "error": error})
        return ws

    async def _ws_request(
        self, request: web.Request, ws: web.WebSocketResponse, session: Session, text: str
    ) -> None:
        """One `response.create` (or an acknowledgement) on a Responses WebSocket."""
        if session.closed:  # finished or expired since the connection opened: as a POST would
            raise GatewayHTTPError(
                401,
                "invalid or expired gateway API key: use the per-session key from _rollout.llm",
                code="invalid_api_key",
            )
        raw = text.encode()
        pool = pool_for(raw, self._pool)
        async with in_flight(session, self.max_session_requests):
            async with session.cpu:
                body = await in_pool(pool, parse_body, raw)
            kind = body.pop("type", None)
            if kind == "response.processed":
                return
            self.websocket_requests += 1
            if kind != "response.create":
                raise ValueError(
                    f"a WebSocket message of type {kind!r}: the gateway serves 'response.create'"
                )
            generate = body.pop("generate", None)
            body["stream"] = True  # the events are the reply
            turn = self._responses.turn(body, session, self.model_name)
            if generate is False:
                for _, data in self._responses.prepared(turn):
                    await _send(ws, data)
                return
            work = self.pipeline.answer(session, turn, pool)
            answer = await (work if self._tracer is None else self._traced(request, session, work))
            try:
                for _, data in self._responses.events(answer, turn):
                    await _send(ws, data)
            except BaseException:
                self.pipeline.undelivered(session, answer.id)
                raise

    async def _traced(
        self, request: web.Request, session: Session, work: Awaitable[TurnAnswer]
    ) -> TurnAnswer:
        """A turn in a `gateway.turn` span, the child of the agent's `traceparent` header, else
        of its session's rollout: the turn joins the rollout's trace."""
        parent = request.headers.get(TRACEPARENT) or session.traceparent
        named = {"gateway.session_id": session.id, "rollout.request_id": session.request_id}
        with child_span(self._tracer, "gateway.turn", parent, named) as span:
            answer = await work
            span.set_attributes(_turn_attributes(session, answer))
        return answer

    async def _count_tokens(self, request: web.Request) -> web.StreamResponse:
        """Anthropic's `count_tokens`: the prompt a Messages request renders to, counted; one
        of the session's requests in flight, rendered in the pool."""
        session = self._agent_session(request)
        if self.pipeline.renderer is None:
            raise GatewayHTTPError(400, "count_tokens needs a renderer", code="no_renderer")
        async with in_flight(session, self.max_session_requests):
            body, pool = await self._read(request, session)
            turn = self._messages.turn({**body, "max_tokens": 1}, session, self.model_name)
            counted = await self.pipeline.count(session, turn, pool)
        return json_response({"input_tokens": counted})

    async def _read(
        self, request: web.Request, session: Session
    ) -> tuple[dict[str, Any], ThreadPoolExecutor | None]:
        """The request's JSON object, parsed in the session's turn of the CPU, and where the
        rest of its CPU work runs (`_limits.pool_for`: the pool for a big body)."""
        raw = await read_body(request, self.max_body_bytes)
        pool = pool_for(raw, self._pool)
        async with session.cpu:
            return await in_pool(pool, parse_body, raw), pool

    # -- errors -------------------------------------------------------------------------------

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Every failure becomes one line of error JSON in the shape of the API called, with
        the right status; a refusal that retrying cannot change says so (`x-should-retry`)."""
        try:
            return await handler(request)
        except GatewayHTTPError as exc:
            return self._error(request, exc.status, str(exc), exc.code)
        except BackendError as exc:
            return self._error(request, exc.status, str(exc), "backend_error")
        except ValueError as exc:
            return self._error(request, 400, str(exc), None)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            reason = exc.reason
            if exc.status in (404, 405):
                reason = f"no route {request.method} {request.path[:100]}: {_routes(request.app)}"
            return self._error(request, exc.status, reason, None)
        except ConnectionResetError:  # the agent went away mid-request (its session ended)
            log.info("%s %s: the client closed the connection", request.method, request.path)
            return self._error(request, 400, "the client closed the connection", None)
        except Exception:
            log.exception("gateway error on %s %s", request.method, request.path)
            return self._error(request, 500, "internal gateway error", None)

    def _error(
        self, request: web.Request, status: int, message: str, code: str | None
    ) -> web.Response:
        line = " ".join(message.split()) or "error"
        path = request.path
        dialect = next(
            (d for d in self.dialects if any(path.startswith(p) for p in d.paths)),
            self.dialects[0],
        )
        final = 400 <= status < 500 and status not in (408, 409, 429)
        headers = {"x-should-retry": "false"} if final else None
        return json_response(dialect.error(status, line, code), status, headers)


async def _send(ws: web.WebSocketResponse, data: Any) -> None:
    """One event on a Responses WebSocket: a text message of JSON, as OpenAI sends them."""
    await ws.send_str(_fastjson.dumps(data).decode())


def _routes(app: web.Application) -> str:
    """The routes `app` serves (one listener's: the agents' never name the admin's)."""
    routes = [f"{r.method} {r.resource.canonical}" for r in app.router.routes() if r.resource]
    return "this listener serves " + ", ".join(r for r in routes if not r.startswith("HEAD "))


def _turn_attributes(session: Session, answer: TurnAnswer) -> dict[str, Any]:
    """What a turn's span says of it: its usage, and how it was recorded, if it was."""
    found: dict[str, Any] = {
        "gateway.finish_reason": answer.finish_reason,
        "gateway.prompt_tokens": answer.prompt_tokens,
        "gateway.completion_tokens": answer.completion_tokens,
    }
    turn = next((t for t in reversed(session.trajectory.turns) if t.rid == answer.id), None)
    if turn is not None:
        found["gateway.turn"] = turn.index
        found["gateway.reused_prompt_tokens"] = turn.reused_prompt_tokens
        found["gateway.render"] = turn.render or "none"
        found["gateway.resumed"] = turn.resumed
        if turn.weight_version is not None:
            found["gateway.weight_version"] = turn.weight_version
    return found
