"""Gateway: the OpenAI-compatible endpoint agents call, which records exact token traces.

Agents speak plain OpenAI chat completions (any SDK, streaming or not, with tools); the gateway
renders each conversation to token ids itself, samples through a backend that returns token ids
and log-probs, parses the sampled ids back into an assistant message (with tool calls), and
appends the turn to the session's trajectory. The trainer gets the ids the policy actually saw and
sampled, with a loss mask and the sampling log-probs, instead of re-tokenized text.

Built on aiohttp.web (`serving.Server`, as the local policy server and runtime emulator are):
already a core dependency, and it runs inside the engine's event loop without uvicorn.

Routes (agent routes take `Authorization: Bearer <per-session key>`, admin routes the admin token;
every error is one line of OpenAI-style JSON, `{"error": {"message", "type", "param", "code"}}`):

  POST   /v1/chat/completions             OpenAI chat; `stream`, `tools`, `logprobs` supported
  GET    /v1/models                       the served model name
  GET    /health                          liveness, no auth: {"status": "ok", "sessions": n, ...}
  POST   /admin/sessions                  {"request_id", "sampling"?, "max_context"?, "max_turns"?}
                                          -> 201 {"session_id", "api_key", "model"}
  POST   /admin/sessions/{id}/finish      -> 200 trace (see client.GatewayAdmin.finish_session);
                                          the session is closed, its key stops working
  DELETE /admin/sessions/{id}             -> 200 {"session_id", "dropped": true}; no trace
  GET    /admin/stats                     -> 200 {"sessions", "turns", "render", "prompt_tokens"}
                                          (see client.GatewayAdmin.stats)

Limits: past `max_turns` a turn is refused with 429 (and `x-should-retry: false`, so OpenAI SDKs
do not retry it); a prompt that reaches `max_context` gets an empty answer with finish_reason
`length` without calling the backend, and shorter prompts get max_tokens capped to what fits.

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
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import secrets
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

from aiohttp import web

from ..serving.http import (
    Handler,
    boolean,
    chat_chunks,
    openai_usage,
    read_json_object,
    sse_response,
)
from ..serving.server import Server
from . import _fastjson
from .backends import Backend, BackendError, Completion, TurnRequest
from .render import IncrementalRenderer, Parsed, Renderer
from .sampling import request_sampling
from .sessions import Session, SessionLimitError, SessionStore
from .trajectory import RENDER_KINDS, Turn

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
        # An isinstance check against a Protocol is slow: decided once, not per turn.
        self._incremental = renderer if isinstance(renderer, IncrementalRenderer) else None
        self.render_counts = dict.fromkeys(RENDER_KINDS, 0)
        self.prompt_tokens = {"reused": 0, "encoded": 0}

    def __repr__(self) -> str:
        return f"Gateway(url={self.url!r}, backend={self.backend.name!r}, admin_token='***')"

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        await super().start()
        log.info("gateway listening on %s (backend %s)", self.url, self.backend.name)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[_errors], client_max_size=MAX_BODY_BYTES)
        app.add_routes(
            [
                web.post("/v1/chat/completions", self._chat),
                web.get("/v1/models", self._models),
                web.get("/health", self._health),
                web.post("/admin/sessions", self._create),
                web.post("/admin/sessions/{session_id}/finish", self._finish),
                web.delete("/admin/sessions/{session_id}", self._drop),
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
        session = self.sessions.by_key(_bearer(request))
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

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        session = self._agent_session(request)
        body = await read_json_object(request, _fastjson.loads)
        tools = _tools(body.get("tools"))
        sampling = request_sampling(body, session.sampling)
        stream = boolean(body.get("stream"), "stream")
        want_logprobs = boolean(body.get("logprobs"), "logprobs")
        model = body["model"] if isinstance(body.get("model"), str) else self.model_name
        messages = body.get("messages")
        # Render before reserving a turn: a malformed request is a 400 and costs no turn.
        prompt_ids, render, reused = self._render(session, messages, tools)
        try:
            index = session.begin_turn()
        except SessionLimitError as exc:
            raise GatewayHTTPError(
                429, str(exc), code="turn_limit", headers={"x-should-retry": "false"}
            ) from None
        turn: Turn | None = None
        try:
            request_ = TurnRequest(
                messages=messages,
                tools=tools,
                tool_choice=body.get("tool_choice"),
                sampling=sampling,
                prompt_ids=prompt_ids,
                stop_token_ids=self.renderer.stop_token_ids if self.renderer else (),
                model=model,
            )
            turn, completion, parsed = await self._run_turn(session, index, request_)
            turn.render, turn.reused_prompt_tokens = render, reused
        finally:
            session.end_turn(turn)
        answer = self._answer(turn, completion, parsed, model, want_logprobs)
        if stream:
            return await sse_response(request, _chunks(answer, body.get("stream_options")))
        return _json(answer)

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
            completion = await self.backend.complete(request)
        if completion.output_ids is not None and self.renderer is not None:
            parsed = self.renderer.parse(completion.output_ids, tools_enabled=bool(request.tools))
        else:
            parsed = Parsed(completion.message or {"role": "assistant", "content": ""})
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
        )
        return turn, completion, parsed

    def _answer(
        self, turn: Turn, completion: Completion, parsed: Parsed, model: str, logprobs: bool
    ) -> dict[str, Any]:
        """The chat.completion object for a finished turn."""
        message: dict[str, Any] = {"role": "assistant", "content": parsed.message.get("content")}
        if parsed.tool_calls:
            message["tool_calls"] = parsed.tool_calls
        content_logprobs = None
        if logprobs and completion.output_ids is not None and self.renderer is not None:
            content_logprobs = [
                _logprob_entry(self.renderer.token_text(t), lp)
                for t, lp in zip(completion.output_ids, completion.logprobs or [], strict=True)
            ]
        return {
            "id": f"chatcmpl-{turn.rid}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None if content_logprobs is None else {"content": content_logprobs},
                    "finish_reason": turn.finish_reason,
                }
            ],
            "usage": openai_usage(turn.prompt_tokens or 0, turn.completion_tokens or 0),
        }

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
        return _json({"session_id": session.id, "dropped": True})

    async def _stats(self, request: web.Request) -> web.StreamResponse:
        self._check_admin(request)
        return _json(self.stats())

    def stats(self) -> dict[str, Any]:
        """The counters /admin/stats answers (see `client.GatewayAdmin.stats`)."""
        return {
            "sessions": len(self.sessions),
            "turns": sum(self.render_counts.values()),
            "render": dict(self.render_counts),
            "prompt_tokens": dict(self.prompt_tokens),
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


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list) or not all(
        isinstance(t, dict) and isinstance(t.get("function"), dict) for t in tools
    ):
        raise ValueError("tools must be a list of {'type': 'function', 'function': {...}}")
    return tools


# -- responses ------------------------------------------------------------------------------------


def _json(data: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    body = _fastjson.dumps(data)
    return web.Response(body=body, status=status, headers=headers, content_type="application/json")


def _logprob_entry(text: str, logprob: float) -> dict[str, Any]:
    return {"token": text, "logprob": logprob, "bytes": list(text.encode()), "top_logprobs": []}


def _chunks(answer: dict[str, Any], options: Any) -> Iterator[dict[str, Any]]:
    """The SSE chunks of a finished answer: its content, then one chunk per tool call."""
    choice = answer["choices"][0]
    message = choice["message"]
    deltas = [({"content": message["content"]}, choice["logprobs"])] if message["content"] else []
    for i, call in enumerate(message.get("tool_calls") or []):
        deltas.append(({"tool_calls": [{"index": i, **call}]}, None))
    head = {k: answer[k] for k in ("id", "created", "model")}
    finish = {"finish_reason": choice["finish_reason"]}
    return chat_chunks(head, deltas, finish, answer["usage"], options)


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure becomes one line of OpenAI-style error JSON with the right status."""
    try:
        return await handler(request)
    except GatewayHTTPError as exc:
        return _error(exc.status, str(exc), "invalid_request_error", exc.code, exc.headers)
    except BackendError as exc:
        kind = "invalid_request_error" if exc.status < 500 else "api_error"
        return _error(exc.status, str(exc), kind, "backend_error")
    except ValueError as exc:
        return _error(400, str(exc), "invalid_request_error", None)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _error(exc.status, exc.reason, "invalid_request_error", None)
    except Exception:
        log.exception("gateway error on %s %s", request.method, request.path)
        return _error(500, "internal gateway error", "api_error", None)


def _error(
    status: int,
    message: str,
    kind: str,
    code: str | None,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    line = " ".join(message.split()) or "error"
    body = {"error": {"message": line, "type": kind, "param": None, "code": code}}
    return _json(body, status, headers)
