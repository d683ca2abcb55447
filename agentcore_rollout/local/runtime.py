"""An AgentCore Runtime emulator that behaves like the service wherever a client or an agent can
tell: its data plane, REST-JSON as botocore's model describes it (`wire`), so unmodified
boto3/aiobotocore clients talk to it through `endpoint_url`. What it does and does not do as the
service does: docs/local-stack.md#what-the-emulator-does-as-the-service-does."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shlex
import time
from collections import Counter

import aiohttp
from aiohttp import web

from ..serving.http import Handler
from ..serving.server import Server
from .config import DEFAULT_RUNTIME_ARN, EmulatorConfig
from .host import AppLoadError
from .quotas import Quotas, json11_error, list_service_quotas
from .sessions import Key, Session, Sessions
from .wire import (
    DEFAULT_QUALIFIER,
    REQUEST_ID_HEADER,
    RUNTIME_ARN,
    SESSION_HEADER,
    ApiError,
    check_headers,
    check_signed,
    container_headers,
    new_request_id,
    read_payload,
    resolve_runtime,
)

log = logging.getLogger("agentcore_rollout.local.runtime")

_STREAM_TYPES = ("text/event-stream",)
# Headers aiohttp would add on its own: the agent gets these only as the caller sent them.
_NOT_ADDED = ("Accept", "Accept-Encoding", "Content-Type", "User-Agent")
_REQUEST_ID = web.RequestKey("request_id", str)  # each request's, set by the middleware

__all__ = ["DEFAULT_RUNTIME_ARN", "SESSION_HEADER", "EmulatorConfig", "RuntimeEmulator"]


class RuntimeEmulator(Server):
    """`async with RuntimeEmulator(EmulatorConfig(app="pkg.agent:app")) as emu: emu.url`"""

    def __init__(self, config: EmulatorConfig, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(host, port)
        self.config = config
        self.runtimes = config.runtime_arns or (DEFAULT_RUNTIME_ARN,)
        for arn in config.runtime_arns:
            if not RUNTIME_ARN.fullmatch(arn):
                raise ValueError(f"not an AgentCore runtime ARN: {arn}")
        self.counts: Counter[str] = Counter()
        self.quotas = Quotas(
            new_sessions_per_second=config.new_sessions_per_second,
            data_plane_tps=config.data_plane_tps,
            max_sessions=config.max_sessions,
            throttle_every=config.throttle_every,
        )
        self.sessions = Sessions(config, self.quotas)

    def app(self) -> web.Application:
        # The body is read by the handler, which answers an oversized one with the modelled
        # ValidationException instead of aiohttp's plain-text 413.
        app = web.Application(client_max_size=2**62, middlewares=[self._as_the_service_answers])
        app.router.add_post(r"/runtimes/{arn:.+}/invocations", self._invoke)
        app.router.add_post(r"/runtimes/{arn:.+}/stopruntimesession", self._stop_session)
        app.router.add_post("/", self._service_quotas)
        app.on_startup.append(lambda _: self.sessions.setup())
        # No longer listening, before the replies in flight are awaited: every agent is
        # stopped first, so no reply still waits on one.
        app.on_shutdown.append(lambda _: self.sessions.shutdown())
        return app

    def _identify(self, request: web.Request, *, invoke: bool) -> Key:
        """The session's key (runtime ARN, endpoint, session id), checked in the service's
        order: signature, runtime, endpoint, headers."""
        region = check_signed(request)
        arn = resolve_runtime(
            request.match_info["arn"], request.query.get("accountId"), region, self.runtimes
        )
        qualifier = request.query.get("qualifier") or DEFAULT_QUALIFIER
        if qualifier not in self.config.qualifiers:
            raise ApiError(
                "ResourceNotFoundException",
                f"No endpoint {qualifier!r} found for agent runtime {arn}",
            )
        return arn, qualifier, check_headers(request, invoke=invoke)

    @web.middleware
    async def _as_the_service_answers(
        self, request: web.Request, handler: Handler
    ) -> web.StreamResponse:
        """Every answer carries a request id and every error is a modelled one: an ApiError as
        it says (counted by code), an unknown path or method UnknownOperationException (as
        AWS's REST front ends say), a bug here InternalServerException, never a plain 500."""
        request_id = request[_REQUEST_ID] = new_request_id()
        try:
            return await handler(request)
        except ApiError as e:
            self.counts[e.code] += 1
            return e.response(request_id)
        except web.HTTPException as e:
            if e.status not in (404, 405):
                raise
            error = ApiError("UnknownOperationException", f"{request.method} {request.path}")
            return error.response(request_id)
        except Exception:
            log.exception("emulator error on %s %s", request.method, request.path)
            return ApiError("InternalServerException", "Internal server error").response(request_id)

    async def _invoke(self, request: web.Request) -> web.StreamResponse:
        self.counts["invoke"] += 1
        key = self._identify(request, invoke=True)
        payload = await read_payload(request)
        self.quotas.admit_invoke(key[:2])
        async with self.sessions.attached(key) as session:
            return await self._forward(session, payload, request)

    async def _stop_session(self, request: web.Request) -> web.StreamResponse:
        self.counts["stop"] += 1
        key = self._identify(request, invoke=False)
        await request.read()  # clientToken: idempotency is moot for a stop of one session
        self.quotas.admit_call(key[:2])
        if not await self.sessions.stop(key):
            raise ApiError("ResourceNotFoundException", f"Session {key[2]} not found")
        headers = {SESSION_HEADER: key[2], REQUEST_ID_HEADER: request[_REQUEST_ID]}
        return web.json_response({}, headers=headers)

    async def _service_quotas(self, request: web.Request) -> web.StreamResponse:
        """Service Quotas, its one operation the engine calls, answered in its own protocol."""
        target = request.headers.get("X-Amz-Target", "")
        self.counts[target.rpartition(".")[2] or "service-quotas"] += 1
        try:
            denied = not self.config.service_quotas
            return await list_service_quotas(request, self.quotas, self.runtimes, denied=denied)
        except ApiError as e:
            self.counts[e.code] += 1
            return json11_error(e, request[_REQUEST_ID])

    async def _forward(
        self, session: Session, payload: bytes, request: web.Request
    ) -> web.StreamResponse:
        """Send the invocation to the session's agent and pass its reply through as it comes:
        headers first, then each chunk as the agent writes it (an SSE stream stays a stream).
        The service's caps bound it: `sync_timeout` until the reply's headers and for a plain
        reply's body, `stream_timeout` for an event stream."""
        if session.failed is not None:
            raise ApiError("RuntimeClientError", session.failed)
        if session.ended is not None:
            # It ended (a stop, its max lifetime) before this reached its agent: a conflict a
            # retry resolves, in a new session, rather than a request sent to a dying agent.
            raise ApiError(
                "RetryableConflictException",
                f"Session {session.session_id} ended ({session.ended}) before the invocation "
                "reached it; retry to start a new one",
            )
        if session.agent is None or not session.agent.alive():
            raise ApiError("RuntimeClientError", "agent is not running")
        return await self._exchange(session, payload, request)

    async def _exchange(
        self, session: Session, payload: bytes, request: web.Request
    ) -> web.StreamResponse:
        http = self.sessions.http
        assert http is not None and session.agent is not None
        headers, echoed = container_headers(request, session.session_id, request[_REQUEST_ID])
        began = time.monotonic()
        cap = self.config.sync_timeout
        try:
            async with contextlib.AsyncExitStack() as stack:
                async with asyncio.timeout(cap):
                    upstream = await stack.enter_async_context(
                        http.post(
                            f"{session.agent.url}/invocations",
                            data=payload,
                            headers=headers,
                            skip_auto_headers=_NOT_ADDED,
                        )
                    )
                    if upstream.status >= 400:
                        text = (await upstream.content.read(500)).decode(errors="replace")
                        raise ApiError(
                            "RuntimeClientError",
                            f"Received error ({upstream.status}) from runtime: {text}",
                        )
                ctype = upstream.headers.get("Content-Type", "application/json")
                if ctype.split(";")[0].strip() in _STREAM_TYPES:
                    cap = self.config.stream_timeout
                reply = web.StreamResponse(status=upstream.status)
                reply.headers.update(echoed)
                reply.headers["Content-Type"] = ctype
                reply.headers[REQUEST_ID_HEADER] = request[_REQUEST_ID]
                if (length := upstream.headers.get("Content-Length")) is not None:
                    reply.content_length = int(length)
                for name in ("Mcp-Session-Id", "Mcp-Protocol-Version"):
                    if name in upstream.headers:
                        reply.headers[name] = upstream.headers[name]
                return await self._relay(session, upstream, reply, request, began + cap)
        except (aiohttp.ClientError, TimeoutError) as e:
            if session.ended is not None:  # stopped under it: say so, not how the socket broke
                why = f"session ended ({session.ended}) during the invocation"
                raise ApiError("RuntimeClientError", why) from None
            why = f"timed out after {cap:.0f}s" if isinstance(e, TimeoutError) else str(e)
            raise ApiError("RuntimeClientError", f"agent unreachable: {why}") from None

    async def _relay(
        self,
        session: Session,
        upstream: aiohttp.ClientResponse,
        reply: web.StreamResponse,
        request: web.Request,
        deadline: float,
    ) -> web.StreamResponse:
        """Copy the agent's body chunk by chunk; past the cap the stream is cut, as the
        service ends an invocation that runs over."""
        await reply.prepare(request)
        try:
            async with asyncio.timeout_at(
                asyncio.get_running_loop().time() + deadline - time.monotonic()
            ):
                async for chunk in upstream.content.iter_any():
                    await reply.write(chunk)
            await reply.write_eof()
        except (aiohttp.ClientError, TimeoutError, ConnectionError) as e:
            self.counts["cut"] += 1
            log.info("invocation of session %s cut: %s", session.session_id, type(e).__name__)
            with contextlib.suppress(Exception):
                request.transport.close()  # type: ignore[union-attr]
        return reply


def main(argv: list[str] | None = None) -> None:
    """`python -m agentcore_rollout.local.runtime APP [options]`: serve the emulator until
    SIGINT/SIGTERM (then every session's agent is stopped). Agents inherit this process's
    environment. Prints the URL on one line once listening."""
    import argparse

    from ..serving.flags import add_flags, from_flags
    from ..serving.process import serve_until_signalled

    parser = argparse.ArgumentParser(prog="python -m agentcore_rollout.local.runtime")
    parser.add_argument("app", nargs="?", default="", help="module:attribute of the agent app")
    parser.add_argument(
        "--command", type=shlex.split, default=(), help="a command serving on $PORT"
    )
    add_flags(parser, RuntimeEmulator)
    add_flags(parser, EmulatorConfig, exclude={"app", "command", "env"})
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    try:
        emulator = from_flags(RuntimeEmulator, args, config=from_flags(EmulatorConfig, args))
    except ValueError as e:
        parser.error(str(e))
    try:
        asyncio.run(serve_until_signalled(emulator))
    except AppLoadError as e:
        raise SystemExit(str(e)) from None


if __name__ == "__main__":
    main()
