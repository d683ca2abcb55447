"""An AgentCore Runtime emulator that behaves like the service wherever a client or an agent
can tell.

`POST /runtimes/{arn}/invocations` and `POST /runtimes/{arn}/stopruntimesession`, REST-JSON as
botocore's service model describes them (`wire.py`), so the unmodified boto3/aiobotocore clients
talk to it through `endpoint_url`: signed requests only, a runtime registry (its ARNs and
endpoint qualifiers; anything else is ResourceNotFoundException), either way of naming the
runtime the model allows, modelled errors with a request id on every response, trace headers.

Each new session gets its own agent (`agents.py`), which receives the headers the service
forwards; replies are passed through as the agent produces them (streams stay streams), within
the service's time caps.

Simulated: cold start, the three quotas as the service counts them (`quotas.py`: per account
and region, shared by every runtime and endpoint it serves there), the idle timeout and max
lifetime as the service judges them (`_watch`), and injected throttling. It also answers
Service Quotas' ListServiceQuotas (`POST /`, JSON 1.1, as botocore's service model describes
it) with its quotas, for the account of its runtime in the signing region, so a client reads
them as it would on AWS. Counters and peaks let tests check a client's bounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shlex
import time
from collections import Counter
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web
from pydantic import Field, model_validator

from .._agentcore import MAX_PAYLOAD_BYTES, SERVICE_QUOTAS_CODE, SYNC_TIMEOUT_S
from .._limits import Gauge
from ..serving.http import Handler
from ..serving.server import Server
from .agents import (
    Agent,
    ContainerAgent,
    InProcessAgent,
    ProcessAgent,
    SharedApp,
    container_env,
)
from .config import EmulatorSettings
from .containers import ContainerEngine, container_engine, loopback_ports
from .host import AppLoadError
from .quotas import (
    JSON_11,
    SERVICE_QUOTAS_SIGNING_NAME,
    SERVICE_QUOTAS_TARGET,
    Quotas,
    json11_error,
)
from .relay import LoopbackRelay
from .wire import (
    CONTAINER_REQUEST_ID_HEADER,
    CUSTOM_HEADER_PREFIX,
    DEFAULT_QUALIFIER,
    MCP_HEADERS,
    REQUEST_ID_HEADER,
    RUNTIME_ARN,
    SESSION_HEADER,
    TRACE_HEADERS,
    TRACE_ID_HEADER,
    USER_ID_HEADER,
    ApiError,
    check_headers,
    check_signed,
    invalid,
    new_request_id,
    new_trace_id,
    resolve_runtime,
)

log = logging.getLogger("agentcore_rollout.local.runtime")

DEFAULT_RUNTIME_ARN = "arn:aws:bedrock-agentcore:us-east-1:000000000000:runtime/local_agent-0000"
STREAM_TIMEOUT = 60 * 60.0  # the service's cap on a streaming invocation
PING_EVERY_MAX = 2.0  # an idle session's agent is asked `/ping` at least this often
_STREAM_TYPES = ("text/event-stream",)
# Headers aiohttp would add on its own: the agent gets these only as the caller sent them.
_NOT_ADDED = ("Accept", "Accept-Encoding", "Content-Type", "User-Agent")
_REQUEST_ID = web.RequestKey("request_id", str)  # each request's, set by the middleware

__all__ = ["DEFAULT_RUNTIME_ARN", "SESSION_HEADER", "EmulatorConfig", "RuntimeEmulator"]


class EmulatorConfig(EmulatorSettings):
    """What the emulator runs: the simulated service's settings (`EmulatorSettings`, those of
    `local.*`), the agent, its runtimes, and what tests vary. Each field but `app`, `command`
    and `env` is also a flag of its `main`."""

    app: str = Field(
        default="",
        description="module:attr of the app each session runs: any BedrockAgentCoreApp "
        "(RolloutApp included) or ASGI app serving POST /invocations and GET /ping",
    )
    command: tuple[str, ...] = Field(
        default=(), description="instead of app: a command serving the contract on $PORT"
    )
    image: str = Field(
        default="",
        description="the image each session runs as a container (mode container; app unused)",
    )
    host_urls: tuple[str, ...] = Field(
        default=(),
        description="loopback services of the host agents are told of in their invocations "
        "(the gateway, the policy), besides the URLs of their environment: Docker's "
        "containers reach them through the emulator's relay",
        json_schema_extra={"flag": "--host-url"},
    )
    runtime_arns: tuple[str, ...] = Field(
        default=(),
        description="the runtimes that exist (none: DEFAULT_RUNTIME_ARN alone); others are "
        "not found",
        json_schema_extra={"flag": "--runtime-arn"},
    )
    qualifiers: tuple[str, ...] = Field(
        default=(DEFAULT_QUALIFIER,),
        description="endpoint names each runtime has; a request without one means DEFAULT",
        json_schema_extra={"flag": "--qualifier"},
    )
    service_quotas: bool = Field(
        default=True,
        description="answer ListServiceQuotas (no: AccessDeniedException, as for a caller "
        "without servicequotas:ListServiceQuotas)",
    )
    sync_timeout: float = Field(default=SYNC_TIMEOUT_S, gt=0, description="a reply's cap, s")
    stream_timeout: float = Field(default=STREAM_TIMEOUT, gt=0, description="a stream's cap, s")
    throttle_every: int = Field(
        default=0, ge=0, description="fault injection: every k-th invocation answers 429 (0: never)"
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="extra environment of agent processes"
    )
    agent_ready_timeout: float = Field(
        default=60.0, gt=0, description="seconds a new session's agent may take to be ready"
    )

    @model_validator(mode="after")
    def _runnable(self) -> EmulatorConfig:
        """A config no emulator can run is refused when made."""
        if self.mode == "container":
            if not self.image or self.command:
                raise ValueError("mode='container' needs an image and no command")
            return self
        if bool(self.app) == bool(self.command):
            raise ValueError("EmulatorConfig needs exactly one of app and command")
        if self.command and self.mode != "process":
            raise ValueError("a command agent needs mode='process'")
        return self


@dataclass
class _Session:
    session_id: str
    key: tuple[str, str, str]
    created: float
    agent: Agent | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    failed: str | None = None
    """Why its agent did not start."""
    ended: str | None = None
    """Why it ended: what an invocation still attached to it is told."""
    in_flight: int = 0
    """Invocations attached to it, from their arrival to the end of their reply: a session
    with one is busy, whatever its agent's ping says."""
    idle_since: float | None = None
    """When it last became idle (nothing in flight, its agent not HealthyBusy); None: busy."""
    watcher: asyncio.Task[None] | None = None


class RuntimeEmulator(Server):
    """`async with RuntimeEmulator(EmulatorConfig(app="pkg.agent:app")) as emu: emu.url`"""

    def __init__(self, config: EmulatorConfig, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(host, port)
        self.config = config
        self.runtimes = frozenset(config.runtime_arns or (DEFAULT_RUNTIME_ARN,))
        for arn in config.runtime_arns:
            if not RUNTIME_ARN.fullmatch(arn):
                raise ValueError(f"not an AgentCore runtime ARN: {arn}")
        self._sessions: dict[tuple[str, str, str], _Session] = {}
        self.starting = Gauge()
        self.live = Gauge()
        self.started: list[str] = []
        self.created: list[tuple[float, str, str]] = []
        """Each session's creation: (monotonic time, runtime ARN, qualifier)."""
        self.stopped: list[str] = []
        self.expired: list[str] = []
        self.counts: Counter[str] = Counter()
        self.quotas = Quotas(
            new_sessions_per_second=config.new_sessions_per_second,
            data_plane_tps=config.data_plane_tps,
            max_sessions=config.max_sessions,
            throttle_every=config.throttle_every,
        )
        self._http: aiohttp.ClientSession | None = None
        self._watchers: set[asyncio.Task[None]] = set()
        self._shared: SharedApp | None = None
        self._engine: ContainerEngine | None = None
        self._loopback: LoopbackRelay | None = None  # docker's containers' way to the host
        self._label = f"{os.getpid()}-{id(self):x}"  # its containers', for the sweep at stop

    @property
    def sessions(self) -> dict[str, _Session]:
        """Live sessions by id (a session id is unique per runtime endpoint on AWS; tests
        here use one runtime)."""
        return {s.session_id: s for s in self._sessions.values()}

    def app(self) -> web.Application:
        # The body is read by the handler, which answers an oversized one with the modelled
        # ValidationException instead of aiohttp's plain-text 413.
        app = web.Application(client_max_size=2**62, middlewares=[self._as_the_service_answers])
        app.router.add_post(r"/runtimes/{arn:.+}/invocations", self._invoke)
        app.router.add_post(r"/runtimes/{arn:.+}/stopruntimesession", self._stop_session)
        app.router.add_post("/", self._service_quotas)
        app.on_startup.append(self._startup)
        app.on_shutdown.append(self._shutdown)
        return app

    async def _startup(self, app: web.Application) -> None:
        if self.config.mode == "in_process":
            self._shared = SharedApp(self.config.app)
            await asyncio.to_thread(self._shared.start)
        if self.config.mode == "container":  # fails at start, in one line, if none works
            engine = await asyncio.to_thread(container_engine, self.config.container_engine)
            self._engine = engine
            await asyncio.to_thread(engine.remove_orphans)  # an earlier emulator's
            if not await asyncio.to_thread(engine.image_exists, self.config.image):
                raise RuntimeError(
                    f"image {self.config.image} not found: build it (agentcore-rollout local build)"
                )
            if engine.subnet is not None:
                urls = [*container_env(self.config.env).values(), *self.config.host_urls]
                self._loopback = LoopbackRelay(engine.host, engine.subnet, loopback_ports(urls))
                await self._loopback.start()
        # No total timeout: the service's caps (sync_timeout, stream_timeout) are applied per
        # invocation; a connect that hangs is still bounded. No connection limit either: open
        # streams must not queue other sessions' invocations (only the quotas bound them).
        # A pooled connection is dropped after 1 s unused, before an agent's server drops it
        # (uvicorn: 5 s): one reused as the agent closes it fails the request mid-write.
        self._http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=1.0),
            timeout=aiohttp.ClientTimeout(total=None, connect=10),
            auto_decompress=False,
        )

    async def _shutdown(self, app: web.Application) -> None:
        """No longer listening, before the replies in flight are awaited: every agent is
        stopped first, so no reply still waits on one."""
        sessions = list(self._sessions.values())
        await asyncio.gather(*(self._end(s, "shutdown", self.expired) for s in sessions))
        await asyncio.gather(*self._watchers, return_exceptions=True)  # ends under way
        if self._shared is not None:
            await asyncio.to_thread(self._shared.stop)
        if self._engine is not None:  # any container whose start raced the stop
            await asyncio.to_thread(self._engine.remove_containers, self._label)
        if self._loopback is not None:
            await self._loopback.stop()
        if self._http is not None:
            await self._http.close()

    def kill_agent(self, session_id: str) -> None:
        """Kill a session's agent process abruptly (SIGKILL), as a crash would."""
        agent = self.sessions[session_id].agent
        if not isinstance(agent, ProcessAgent):
            raise RuntimeError("kill_agent needs mode='process' or 'container'")
        agent.kill()

    # ------------------------------------------------------------------ API

    def _identify(self, request: web.Request, *, invoke: bool) -> tuple[tuple[str, str, str], str]:
        """Who is asked for what, in the service's order: signature, runtime, endpoint,
        headers. The session's key is (runtime ARN, endpoint, session id)."""
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
        sid = check_headers(request, invoke=invoke)
        return (arn, qualifier, sid), sid

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
        key, _ = self._identify(request, invoke=True)
        payload = await _read_payload(request)
        self.quotas.admit_invoke(key[:2])
        session = self._sessions.get(key)
        opening = session is None
        if session is None:
            self.quotas.admit_session(key[:2])
            session = self._open(key)
        session.in_flight += 1  # busy from the invocation's arrival, its agent's start included
        session.idle_since = None
        try:
            if opening:
                with self.starting:
                    await self._launch(session)
            await session.ready.wait()
            return await self._forward(session, payload, request)
        finally:
            session.in_flight -= 1
            if not session.in_flight:
                session.idle_since = time.monotonic()

    async def _stop_session(self, request: web.Request) -> web.StreamResponse:
        self.counts["stop"] += 1
        key, sid = self._identify(request, invoke=False)
        await request.read()  # clientToken: idempotency is moot for a stop of one session
        self.quotas.admit_call(key[:2])
        session = self._sessions.get(key)
        if session is None:
            raise ApiError("ResourceNotFoundException", f"Session {sid} not found")
        await self._end(session, "stopped", self.stopped)
        headers = {SESSION_HEADER: sid, REQUEST_ID_HEADER: request[_REQUEST_ID]}
        return web.json_response({}, headers=headers)

    async def _service_quotas(self, request: web.Request) -> web.StreamResponse:
        """Service Quotas, its one operation the engine calls, answered in its own protocol."""
        target = request.headers.get("X-Amz-Target", "")
        self.counts[target.rpartition(".")[2] or "service-quotas"] += 1
        try:
            return await self._list_service_quotas(request, target)
        except ApiError as e:
            self.counts[e.code] += 1
            return json11_error(e, request[_REQUEST_ID])

    async def _list_service_quotas(self, request: web.Request, target: str) -> web.Response:
        """ListServiceQuotas for `bedrock-agentcore`: the emulator's quotas, as the account of
        its first runtime in the signing region (else its first) has them."""
        region = check_signed(request, SERVICE_QUOTAS_SIGNING_NAME)
        if target != f"{SERVICE_QUOTAS_TARGET}.ListServiceQuotas":
            raise ApiError("UnknownOperationException", f"{target or 'no X-Amz-Target'}")
        if not self.config.service_quotas:
            raise ApiError(
                "AccessDeniedException",
                "not authorized to perform: servicequotas:ListServiceQuotas",
            )
        asked = json.loads(await request.read() or b"{}")
        if asked.get("ServiceCode") != SERVICE_QUOTAS_CODE:
            raise ApiError("NoSuchResourceException", f"No service {asked.get('ServiceCode')!r}")
        arns = sorted(
            self.config.runtime_arns or (DEFAULT_RUNTIME_ARN,),
            key=lambda arn: arn.split(":")[3] != region,
        )
        listed = self.quotas.listed(arns[0].split(":")[4], region)
        start = int(asked.get("NextToken") or 0)
        end = start + int(asked.get("MaxResults") or 100)
        page: dict[str, object] = {"Quotas": listed[start:end]}
        if end < len(listed):
            page["NextToken"] = str(end)
        return web.json_response(page, content_type=JSON_11)

    def _open(self, key: tuple[str, str, str]) -> _Session:
        session = _Session(key[2], key, created=time.monotonic())
        self._sessions[key] = session
        self.live.add()
        self.started.append(session.session_id)
        self.created.append((session.created, key[0], key[1]))
        return session

    async def _launch(self, session: _Session) -> None:
        """Start the session's agent and its watcher; a session ended meanwhile (a stop)
        starts neither, and its invocations are told it ended."""
        cfg = self.config
        try:
            await asyncio.sleep(cfg.cold_start)
            if session.ended:
                return
            if self._shared is not None:
                session.agent = InProcessAgent(self._shared, session.session_id)
            else:
                agent = await self._spawn(session.session_id)
                session.agent = agent
                if session.ended:  # during the spawn, so `_end` saw no agent to stop
                    await agent.terminate()
                    return
                assert self._http is not None
                await agent.wait_ready(self._http, cfg.agent_ready_timeout)
        except Exception as e:
            if session.ended:  # stopped while starting: not the agent's failure
                return
            session.failed = f"agent failed to start: {e}"
            await self._end(session, session.failed, self.expired)
            raise ApiError("RuntimeClientError", session.failed) from None
        finally:
            session.ready.set()
        if not session.ended:
            session.watcher = watcher = asyncio.create_task(self._watch(session))
            self._watchers.add(watcher)
            watcher.add_done_callback(self._watchers.discard)

    async def _forward(
        self, session: _Session, payload: bytes, request: web.Request
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
        self, session: _Session, payload: bytes, request: web.Request
    ) -> web.StreamResponse:
        assert self._http is not None and session.agent is not None
        headers, echoed = _container_headers(request, session.session_id)
        began = time.monotonic()
        cap = self.config.sync_timeout
        try:
            async with contextlib.AsyncExitStack() as stack:
                async with asyncio.timeout(cap):
                    upstream = await stack.enter_async_context(
                        self._http.post(
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
        session: _Session,
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

    async def _spawn(self, session_id: str) -> ProcessAgent:
        """The session's agent: a container of the image, or a process on the host."""
        cfg = self.config
        if self._engine is not None:
            return await ContainerAgent.spawn_container(
                engine=self._engine,
                image=cfg.image,
                env=cfg.env,
                label=self._label,
                session_id=session_id,
                log_dir=cfg.agent_log_dir,
            )
        return await ProcessAgent.spawn(
            app=cfg.app,
            command=cfg.command,
            env=cfg.env,
            session_id=session_id,
            log_dir=cfg.agent_log_dir,
        )

    # ------------------------------------------------------------------ lifecycle

    async def _end(self, session: _Session, why: str, ledger: list[str]) -> None:
        if self._sessions.pop(session.key, None) is None:
            return
        session.ended = why
        self.live.remove()
        self.quotas.closed(session.key[:2])
        ledger.append(session.session_id)
        if session.watcher is not None and session.watcher is not asyncio.current_task():
            session.watcher.cancel()
        if session.agent is not None:
            await session.agent.terminate()

    async def _watch(self, session: _Session) -> None:
        """A started session's end, as the service judges it: when its agent exits, at its
        max lifetime (busy or not), or after `idle_timeout` idle. Idle is the agent's word:
        with no invocation in flight it is asked `/ping` every quarter of the idle timeout
        (at most `PING_EVERY_MAX` apart), HealthyBusy keeps it busy, and the timeout counts
        from when it last became idle, so work acknowledged at once and run in the background
        (`add_async_task`) is never cut short."""
        assert session.agent is not None and self._http is not None
        agent, cfg = session.agent, self.config
        end_of_life = session.created + cfg.max_lifetime
        every = min(cfg.idle_timeout / 4, PING_EVERY_MAX)
        while True:
            await asyncio.sleep(max(0.0, min(every, end_of_life - time.monotonic())))
            if not agent.alive():
                return await self._end(session, "its agent exited", self.expired)
            if time.monotonic() >= end_of_life:
                return await self._end(session, "max lifetime", self.expired)
            if session.in_flight:
                continue
            busy = await agent.busy(self._http)
            if session.in_flight:  # an invocation arrived while the agent answered
                continue
            now = time.monotonic()
            if busy:
                session.idle_since = None
            elif session.idle_since is None:
                session.idle_since = now
            elif now - session.idle_since >= cfg.idle_timeout:
                return await self._end(session, "idle timeout", self.expired)


async def _read_payload(request: web.Request) -> bytes:
    """The body, up to the model's limit; an oversized one is read to the end (so the client,
    still sending, gets the answer) and refused as the service does."""
    declared = request.content_length
    if declared is None or declared <= MAX_PAYLOAD_BYTES:
        body = bytearray()
        async for chunk in request.content.iter_any():
            body += chunk
            if len(body) > MAX_PAYLOAD_BYTES:
                break
        else:
            return bytes(body)
    async for _ in request.content.iter_any():
        pass
    raise invalid("payload", f"payload must be at most {MAX_PAYLOAD_BYTES} bytes")


def _container_headers(
    request: web.Request, session_id: str
) -> tuple[dict[str, str], dict[str, str]]:
    """(headers for the agent, headers echoed to the caller). The agent gets the session and
    request ids, the trace headers (a trace id is started if the caller sent none), the user
    id, custom headers, MCP headers, and Content-Type and Accept as sent; never the caller's
    signature."""
    src = request.headers
    trace = {h: src[h] for h in TRACE_HEADERS if h in src}
    trace.setdefault(TRACE_ID_HEADER, new_trace_id())
    headers = {
        SESSION_HEADER: session_id,
        CONTAINER_REQUEST_ID_HEADER: request[_REQUEST_ID],
        **trace,
        **{h: src[h] for h in (USER_ID_HEADER, *MCP_HEADERS, "Content-Type", "Accept") if h in src},
        **{k: v for k, v in src.items() if k.lower().startswith(CUSTOM_HEADER_PREFIX.lower())},
    }
    echoed = {SESSION_HEADER: session_id, **trace}
    return headers, echoed


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
