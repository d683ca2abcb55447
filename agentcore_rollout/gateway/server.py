"""Gateway: the endpoint agents call, in the API they already speak, which records exact traces.

Agents speak OpenAI chat completions (any SDK, streaming or not, with tools); each API is a
`turns.Dialect` that turns its request into one `ChatTurn`, so the gateway renders each
conversation to token ids itself, samples through a backend that returns token ids
and log-probs, parses the sampled ids back into an assistant message (with tool calls), and
appends the turn to the session's trajectory. The trainer gets the ids the policy actually saw and
sampled, with a loss mask and the sampling log-probs, instead of re-tokenized text.

Built on aiohttp.web (`serving.Server`, as the local policy server and runtime emulator are):
already a core dependency, and it runs inside the engine's event loop without uvicorn.

Routes (agent routes take `Authorization: Bearer <per-session key>` or `x-api-key`, admin routes
the admin token; every error is one line of JSON in the shape of the API called, and an unknown
route's 404 names the routes served):

  POST   /v1/chat/completions             OpenAI chat (`chat.ChatDialect`); every field honoured
                                          or refused
  POST   /v1/responses                    OpenAI Responses (`responses.ResponsesDialect`): items,
                                          function calls, reasoning, its event stream;
                                          `previous_response_id` within the session
  POST   /v1/messages, /v1/v1/messages    Anthropic Messages (`messages.MessagesDialect`), at the
                                          root URL and at the agents' base URL (gateway + /v1);
                                          `.../count_tokens` renders and counts the prompt
  GET    /v1/models                       the served model name
  GET    /health                          liveness, no auth: {"status": "ok", "sessions": n, ...}
  POST   /admin/sessions                  {"request_id", "sampling"?, "max_context"?, "max_turns"?}
                                          -> 201 {"session_id", "api_key", "model"}
  POST   /admin/sessions/{id}/finish      -> 200 trace (see GatewayAdmin.finish_session);
                                          the session is closed, its key stops working
  DELETE /admin/sessions/{id}             -> 200 {"session_id", "dropped": true, "usage"}; no
                                             trace, its tokens only (what a failure spent)
  GET    /admin/requests/{request_id}     -> 200 {"session_id", "turns"}: the live session
                                          opened for that request (404 if none), for an
                                          engine that restarted to find an earlier's trace
  GET    /admin/stats                     -> 200 {"sessions", "turns", "render", "prompt_tokens"}
                                          (see GatewayAdmin.stats)

Limits end a turn the way agent loops stop on, never with a retryable error: past `max_turns` a
turn gets an empty answer with finish_reason `length` (unrecorded; the trace counts it under
`rejected_turns`), as does a prompt that reaches `max_context` (recorded); shorter prompts get
max_tokens capped to what fits. Refusals that retrying cannot change carry
`x-should-retry: false`, which the OpenAI and Anthropic SDKs obey.

Per turn the gateway renders incrementally when the renderer can (`render.IncrementalRenderer`):
each session keeps the states of its last few renders, and a prompt that extends one of them
encodes only its new part. Every render is counted as `incremental`, `fallback` (the session had
earlier renders but the prompt extends none of them: an edited history, changed tools, a branch)
or `full` (nothing to extend: a session's first turn, or a renderer without the capability), in
the trace's turns and in /admin/stats. The hot path does no per-turn logging and encodes JSON
with orjson when installed (`_fastjson`).

Streaming: the backend call is not streamed (the whole turn is needed to parse tool calls and to
record it atomically); the answer is then sent as standard SSE chunks. For rollouts the agent's
wall time is the same either way.

Weight updates: a generation the backend aborts (an update with `abort_all_requests`) is resumed
(`resume`): the turn continues from the tokens sampled so far under the new weights, and the
agent gets its one answer, streamed or not; the trace says which version sampled each token.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import logging
import secrets
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from aiohttp import web

from ..serving.http import Handler, read_json_object, sse_events
from ..serving.server import Server
from . import _fastjson
from .backends import Backend, BackendError, Completion, TurnRequest
from .chat import ChatDialect
from .messages import MessagesDialect
from .render import IncrementalRenderer, Parsed, Renderer, TextRenderer
from .responses import ResponsesDialect
from .resume import ResumePolicy, complete
from .sessions import Session, SessionLimitError, SessionStore
from .trajectory import RENDER_KINDS, Turn
from .turns import ChatTurn, Dialect, ToolChoice, TurnAnswer

log = logging.getLogger(__name__)

DEFAULT_SESSION_TTL = 6 * 3600.0
MAX_BODY_BYTES = 64 * 1024 * 1024


class GatewayHTTPError(Exception):
    """A request refused: status, one-line message, OpenAI error code, extra headers."""

    def __init__(
        self, status: int, message: str, *, code: str, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.headers = status, code, headers


class Gateway(Server):
    """The token-capture gateway; `async with Gateway(backend, renderer) as gw: gw.url`.

    `backend` samples turns (the gateway closes it on stop); `renderer` turns messages into ids
    and is required when the backend captures tokens. `admin_token` protects the admin routes (a
    random one is made if not given; read it from `.admin_token`). Sessions idle for longer
    than `session_ttl` seconds are dropped, so a crashed engine cannot leak them forever.
    `resume` bounds how aborted turns are resumed (`resume.ResumePolicy`). `strict_fields`
    refuses the request fields that change nothing sampled, rather than ignoring them (`turns`).
    """

    def __init__(
        self,
        backend: Backend,
        renderer: Renderer | None = None,
        *,
        admin_token: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        model_name: str = "policy",
        session_ttl: float | None = DEFAULT_SESSION_TTL,
        resume: ResumePolicy | None = None,
        strict_fields: bool = False,
    ) -> None:
        if backend.token_capture and renderer is None:
            raise ValueError(f"the {backend.name} backend captures tokens and needs a renderer")
        if admin_token is not None and len(admin_token) < 16:
            raise ValueError("admin_token must be at least 16 characters")
        super().__init__(host, port)
        self.backend = backend
        self.renderer = renderer
        self.admin_token = admin_token or secrets.token_urlsafe(32)
        self.model_name = model_name
        self.sessions = SessionStore(ttl=session_ttl)
        self.resume = resume or ResumePolicy()
        # An isinstance check against a Protocol is slow: decided once, not per turn.
        self._incremental = renderer if isinstance(renderer, IncrementalRenderer) else None
        self.render_counts = dict.fromkeys(RENDER_KINDS, 0)
        self.prompt_tokens = {"reused": 0, "encoded": 0}
        self.ignored_fields: Counter[str] = Counter()  # per field name, the turns that sent it
        self._messages = MessagesDialect(strict_fields)
        self.dialects: tuple[Dialect, ...] = (
            ChatDialect(strict_fields),
            ResponsesDialect(strict_fields),
            self._messages,
        )

    def __repr__(self) -> str:
        return f"Gateway(url={self.url!r}, backend={self.backend.name!r}, admin_token='***')"

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        await super().start()
        log.info("gateway listening on %s (backend %s)", self.url, self.backend.name)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._errors], client_max_size=MAX_BODY_BYTES)
        for dialect in self.dialects:
            handler = functools.partial(self._serve, dialect=dialect)
            app.add_routes([web.post(path, handler) for path in dialect.paths])
        counts = [web.post(f"{p}/count_tokens", self._count_tokens) for p in self._messages.paths]
        app.add_routes(counts)
        app.add_routes(
            [
                web.get("/v1/models", self._models),
                web.get("/health", self._health),
                web.post("/admin/sessions", self._create),
                web.post("/admin/sessions/{session_id}/finish", self._finish),
                web.delete("/admin/sessions/{session_id}", self._drop),
                web.get("/admin/requests/{request_id}", self._session_of),
                web.get("/admin/stats", self._stats),
            ]
        )
        app.cleanup_ctx.append(self._lifespan)
        return app

    async def _lifespan(self, app: web.Application) -> AsyncIterator[None]:
        """While serving, sessions idle past the TTL are dropped; once the requests in flight
        are answered, the rest are closed, and the backend too."""
        ttl = self.sessions.ttl
        reaper = asyncio.create_task(self._reap(ttl)) if ttl is not None else None
        yield
        if reaper is not None:
            reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reaper
        self.sessions.close_all()
        await self.backend.close()

    async def _reap(self, ttl: float) -> None:
        while True:
            await asyncio.sleep(min(max(ttl / 4, 0.05), 60.0))
            for session_id in self.sessions.expire():
                log.warning("session %s expired unfinished", session_id)

    # -- auth ---------------------------------------------------------------------------------

    def _agent_session(self, request: web.Request) -> Session:
        session = self.sessions.by_key(_bearer(request) or request.headers.get("x-api-key"))
        if session is None:
            log.info("rejected an agent request with a missing, unknown or closed key")
            raise GatewayHTTPError(
                401,
                "invalid or expired gateway API key: use the per-session key from _rollout.llm",
                code="invalid_api_key",
            )
        return session

    def _check_admin(self, request: web.Request) -> None:
        token = _bearer(request) or ""
        if not hmac.compare_digest(token.encode(), self.admin_token.encode()):
            log.warning("rejected an admin request with a missing or wrong admin token")
            raise GatewayHTTPError(401, "admin token required", code="invalid_admin_token")

    # -- OpenAI routes ------------------------------------------------------------------------

    async def _health(self, request: web.Request) -> web.StreamResponse:
        return _json(
            {
                "status": "ok",
                "sessions": len(self.sessions),
                "backend": self.backend.name,
                "token_capture": self.backend.token_capture,
            }
        )

    async def _models(self, request: web.Request) -> web.StreamResponse:
        self._agent_session(request)
        card = {"id": self.model_name, "object": "model", "created": 0, "owned_by": "gateway"}
        return _json({"object": "list", "data": [card]})

    async def _serve(self, request: web.Request, dialect: Dialect) -> web.StreamResponse:
        """One turn in any dialect: check and convert the request, answer it, reply."""
        session = self._agent_session(request)
        body = await read_json_object(request, _fastjson.loads)
        turn = dialect.turn(body, session, self.model_name)
        self.ignored_fields.update(turn.ignored)
        answer = await self.answer(session, turn)
        if turn.stream:
            return await sse_events(request, dialect.events(answer, turn))
        return _json(dialect.reply(answer, turn))

    async def answer(self, session: Session, turn: ChatTurn) -> TurnAnswer:
        """Render, sample, parse and record one turn of `session`. Past the session's turn
        limit the turn ends at once as `length` (what agent loops stop on), unrecorded."""
        # Render before reserving a turn: a malformed request is a 400 and costs no turn.
        prompt_ids, render, reused = self._render(session, turn.messages, turn.tools)
        try:
            index = session.begin_turn()
        except SessionLimitError:
            message = {"role": "assistant", "content": ""}
            return TurnAnswer(uuid.uuid4().hex, message, "length", len(prompt_ids or ()))
        recorded: Turn | None = None
        try:
            request = TurnRequest(
                messages=turn.messages,
                tools=turn.tools,
                tool_choice=turn.tool_choice,
                parallel_tool_calls=turn.parallel_tool_calls,
                sampling=dict(turn.sampling),
                json_schema=turn.json_schema,
                logprobs=turn.logprobs,
                top_logprobs=turn.top_logprobs,
                prompt_ids=prompt_ids,
                stop_token_ids=self.renderer.stop_token_ids if self.renderer else (),
                model=turn.model,
            )
            recorded, completion, parsed = await self._run_turn(session, index, request)
            recorded.render, recorded.reused_prompt_tokens = render, reused
            recorded.ignored = list(turn.ignored)
        finally:
            session.end_turn(recorded)
        return TurnAnswer(
            id=recorded.rid,
            message=parsed.message,
            finish_reason=recorded.finish_reason,
            prompt_tokens=recorded.prompt_tokens or 0,
            completion_tokens=recorded.completion_tokens or 0,
            logprobs=self._logprobs(completion) if turn.logprobs else None,
            stop_sequence=completion.stop_sequence,
        )

    async def _count_tokens(self, request: web.Request) -> web.StreamResponse:
        """Anthropic's `count_tokens`: the prompt a Messages request renders to, counted."""
        session = self._agent_session(request)
        if self.renderer is None:
            raise GatewayHTTPError(400, "count_tokens needs a renderer", code="no_renderer")
        body = await read_json_object(request, _fastjson.loads)
        turn = self._messages.turn({**body, "max_tokens": 1}, session, self.model_name)
        return _json({"input_tokens": len(self.renderer.render(turn.messages, turn.tools))})

    def _render(
        self, session: Session, messages: Any, tools: list[dict[str, Any]] | None
    ) -> tuple[list[int] | None, str | None, int]:
        """Prompt ids, how they were rendered (one of RENDER_KINDS; None without a renderer),
        and how many of them were reused from an earlier render of the session."""
        if self.renderer is None:
            return None, None, 0
        if self._incremental is None:
            ids, render, reused = self.renderer.render(messages, tools), "full", 0
        else:
            rendered = self._incremental.render_from(messages, tools, session.render_states)
            ids, reused = rendered.ids, rendered.reused
            render = "incremental" if reused else "fallback" if session.render_states else "full"
            session.remember_render(rendered)
        self.render_counts[render] += 1
        self.prompt_tokens["reused"] += reused
        self.prompt_tokens["encoded"] += len(ids) - reused
        return ids, render, reused

    async def _run_turn(
        self, session: Session, index: int, request: TurnRequest
    ) -> tuple[Turn, Completion, Parsed]:
        started = time.perf_counter()
        prompt_ids = request.prompt_ids
        context_limited = False
        if prompt_ids is not None and session.max_context is not None:
            budget = session.max_context - len(prompt_ids)
            context_limited = budget <= 0
            if not context_limited:
                cap = request.sampling.get("max_tokens")
                request.sampling["max_tokens"] = budget if cap is None else min(cap, budget)
        if context_limited:
            completion = Completion("length", [], [], prompt_tokens=len(prompt_ids or []))
        else:
            completion = await complete(
                self.backend,
                request,
                self.resume,
                decode=self._decode,
                live=lambda: not session.closed,
            )
        parsed = self._parse(completion, request)
        finish = completion.finish_reason
        if parsed.tool_calls and finish == "stop":
            finish = "tool_calls"
        n_prompt = completion.prompt_tokens
        turn = Turn(
            index=index,
            rid=request.rid,
            prompt_ids=prompt_ids,
            output_ids=completion.output_ids,
            logprobs=completion.logprobs,
            finish_reason=finish,
            ill_formed=parsed.ill_formed,
            error=parsed.error,
            weight_version=completion.weight_version,
            context_limited=context_limited,
            latency=time.perf_counter() - started,
            prompt_tokens=len(prompt_ids) if n_prompt is None and prompt_ids else n_prompt,
            completion_tokens=completion.completion_tokens
            if completion.output_ids is None
            else len(completion.output_ids),
            version_runs=completion.version_runs,
            resumed=completion.resumed,
        )
        return turn, completion, parsed

    def _parse(self, completion: Completion, request: TurnRequest) -> Parsed:
        """The assistant message of a completion, held to the request's tool rules: a turn
        that breaks them is the model's text, ill-formed (see `turns`)."""
        if completion.output_ids is None or self.renderer is None:
            return Parsed(completion.message or {"role": "assistant", "content": ""})
        choice = request.tool_choice
        tools_enabled = bool(request.tools) and choice.mode != "none"
        parsed = self.renderer.parse(completion.output_ids, tools_enabled=tools_enabled)
        broken = _broken_rule(parsed, choice, request.parallel_tool_calls)
        if broken is None or parsed.ill_formed:
            return parsed
        text = self.renderer.parse(completion.output_ids, tools_enabled=False).message
        return Parsed(text, ill_formed=True, error=broken)

    def _decode(self, ids: Sequence[int]) -> str:
        """The text of sampled ids, for stop strings across a resumed turn's seam."""
        if isinstance(self.renderer, TextRenderer):
            return self.renderer.decode(ids)
        assert self.renderer is not None  # only token backends resume: they need a renderer
        return "".join(map(self.renderer.token_text, ids))

    def _logprobs(self, completion: Completion) -> list[dict[str, Any]] | None:
        """OpenAI chat log-prob entries for the sampled tokens (and their top alternatives)."""
        if completion.logprob_entries is not None:
            return completion.logprob_entries
        if completion.output_ids is None or self.renderer is None:
            return None
        text = self.renderer.token_text
        tops = completion.top_logprobs or [()] * len(completion.output_ids)
        pairs = zip(completion.output_ids, completion.logprobs or [], tops, strict=True)
        entry = _logprob_entry
        return [
            {**entry(text(t), lp), "top_logprobs": [entry(text(i), x) for i, x in alt]}
            for t, lp, alt in pairs
        ]

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Every failure becomes one line of error JSON in the shape of the API called, with
        the right status; a refusal that retrying cannot change says so (`x-should-retry`)."""
        try:
            return await handler(request)
        except GatewayHTTPError as exc:
            return self._error(request, exc.status, str(exc), exc.code, exc.headers)
        except BackendError as exc:
            return self._error(request, exc.status, str(exc), "backend_error")
        except ValueError as exc:
            return self._error(request, 400, str(exc), None)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            reason = exc.reason
            if exc.status in (404, 405):
                reason = f"no route {request.method} {request.path[:100]}: {self._route_list()}"
            return self._error(request, exc.status, reason, None)
        except ConnectionResetError:  # the agent went away mid-request (its session ended)
            log.info("%s %s: the client closed the connection", request.method, request.path)
            return self._error(request, 400, "the client closed the connection", None)
        except Exception:
            log.exception("gateway error on %s %s", request.method, request.path)
            return self._error(request, 500, "internal gateway error", None)

    def _error(
        self,
        request: web.Request,
        status: int,
        message: str,
        code: str | None,
        headers: Mapping[str, str] | None = None,
    ) -> web.Response:
        line = " ".join(message.split()) or "error"
        path = request.path
        dialect = next(
            (d for d in self.dialects if any(path.startswith(p) for p in d.paths)),
            self.dialects[0],
        )
        final = 400 <= status < 500 and status not in (408, 409, 429)
        extra = {"x-should-retry": "false"} if final else {}
        return _json(dialect.error(status, line, code), status, {**extra, **(headers or {})})

    def _route_list(self) -> str:
        posts = [f"POST {p}" for d in self.dialects for p in d.paths]
        return "the gateway serves " + ", ".join([*posts, "GET /v1/models", "GET /health"])

    # -- admin routes -------------------------------------------------------------------------

    async def _create(self, request: web.Request) -> web.StreamResponse:
        self._check_admin(request)
        body = await read_json_object(request, _fastjson.loads)
        session, key = self.sessions.create(
            body.get("request_id"),
            sampling=body.get("sampling"),
            max_context=body.get("max_context"),
            max_turns=body.get("max_turns"),
        )
        answer = {"session_id": session.id, "api_key": key, "model": self.model_name}
        return _json(answer, status=201)

    async def _finish(self, request: web.Request) -> web.StreamResponse:
        self._check_admin(request)
        session = self._remove(request, "finished")
        trace = session.trace(
            token_capture=self.backend.token_capture,
            backend=self.backend.name,
            model=self.model_name,
        )
        return _json(trace)

    async def _drop(self, request: web.Request) -> web.StreamResponse:
        self._check_admin(request)
        session = self._remove(request, "dropped")
        return _json({"session_id": session.id, "dropped": True, "usage": session.usage()})

    async def _session_of(self, request: web.Request) -> web.StreamResponse:
        self._check_admin(request)
        request_id = request.match_info["request_id"]
        session = self.sessions.by_request(request_id)
        if session is None:
            raise GatewayHTTPError(
                404, f"no live session for request {request_id[:64]!r}", code="session_not_found"
            )
        return _json({"session_id": session.id, "turns": session.turns_started})

    async def _stats(self, request: web.Request) -> web.StreamResponse:
        self._check_admin(request)
        return _json(self.stats())

    def stats(self) -> dict[str, Any]:
        """The counters /admin/stats answers (see `GatewayAdmin.stats`)."""
        return {
            "sessions": len(self.sessions),
            "turns": sum(self.render_counts.values()),
            "render": dict(self.render_counts),
            "prompt_tokens": dict(self.prompt_tokens),
            "ignored_fields": dict(self.ignored_fields),
        }

    def _remove(self, request: web.Request, reason: str) -> Session:
        session_id = request.match_info["session_id"]
        session = self.sessions.remove(session_id, reason=reason)
        if session is None:
            raise GatewayHTTPError(
                404, f"no live session {session_id[:64]!r}", code="session_not_found"
            )
        return session


# -- request parsing ------------------------------------------------------------------------------


def _bearer(request: web.Request) -> str | None:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


def _broken_rule(parsed: Parsed, choice: ToolChoice, parallel: bool) -> str | None:
    """Which of the request's tool rules a parsed turn breaks, if any (one line)."""
    calls = parsed.tool_calls
    if choice.mode == "required" and not calls:
        return f"tool_choice {choice} asked for a tool call; the model wrote none"
    if choice.name is not None and any(c["function"]["name"] != choice.name for c in calls):
        return f"tool_choice {choice} allows only that tool; the model called another"
    if not parallel and len(calls) > 1:
        return f"parallel_tool_calls is false; the model made {len(calls)} calls"
    return None


# -- responses ------------------------------------------------------------------------------------


def _json(data: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    body = _fastjson.dumps(data)
    return web.Response(body=body, status=status, headers=headers, content_type="application/json")


def _logprob_entry(text: str, logprob: float) -> dict[str, Any]:
    return {"token": text, "logprob": logprob, "bytes": list(text.encode())}
