"""An AgentCore Runtime emulator that speaks the real data-plane wire protocol.

`POST /runtimes/{arn}/invocations` and `POST /runtimes/{arn}/stopruntimesession`, REST-JSON,
errors by `x-amzn-ErrorType`, so the unmodified boto3/aiobotocore client talks to it through
`endpoint_url`. Each new session gets its own agent: by default a fresh process serving a
RolloutApp on a loopback socket (isolated, killable); `in_process` mode serves one app
instance in a thread for tests and benchmarks that need hundreds of sessions quickly.

Simulated: cold start, an invoke TPS limit (429), a live-session quota (402), idle timeout,
max lifetime, and injected throttling. Counters and peaks let tests check the client's bounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol
from urllib.parse import unquote

import aiohttp
from aiohttp import web

from .._limits import Gauge, TokenBucket

log = logging.getLogger("agentcore_rollout.local.runtime")

SESSION_HEADER = "X-Amzn-Bedrock-AgentCore-Runtime-Session-Id"


@dataclass
class EmulatorConfig:
    app: str
    """`module:attr` of the RolloutApp each session runs."""
    mode: Literal["process", "in_process"] = "process"
    runtime_arns: tuple[str, ...] = ()
    """ARNs that exist; empty accepts any."""
    cold_start: float = 0.0
    invoke_tps: float | None = None
    max_sessions: int = 1000
    idle_timeout: float = 900.0
    max_lifetime: float = 8 * 3600.0
    throttle_every: int = 0
    """Fault injection: every k-th invocation answers 429 (0: never)."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment for agent processes (endpoints, credentials)."""
    agent_ready_timeout: float = 60.0
    log_dir: str | None = None


class _Agent(Protocol):
    url: str

    def alive(self) -> bool: ...
    async def busy(self, http: aiohttp.ClientSession) -> bool: ...
    async def terminate(self) -> None: ...


class _ApiError(Exception):
    def __init__(self, status: int, error_type: str, message: str) -> None:
        super().__init__(message)
        self.status, self.error_type, self.message = status, error_type, message


@dataclass
class _Session:
    session_id: str
    created: float
    last_active: float
    agent: _Agent | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    failed: str | None = None


class RuntimeEmulator:
    """`async with RuntimeEmulator(EmulatorConfig(app="pkg.agent:app")) as emu: emu.url`"""

    def __init__(self, config: EmulatorConfig, host: str = "127.0.0.1", port: int = 0) -> None:
        self.config = config
        self._host, self._port = host, port
        self.sessions: dict[str, _Session] = {}
        self.starting = Gauge()
        self.live = Gauge()
        self.started: list[str] = []
        self.stopped: list[str] = []
        self.expired: list[str] = []
        self.counts: Counter[str] = Counter()
        self._invoke_tps = (
            TokenBucket(config.invoke_tps, burst=config.invoke_tps) if config.invoke_tps else None
        )
        self._runner: web.AppRunner | None = None
        self._http: aiohttp.ClientSession | None = None
        self._reaper: asyncio.Task[None] | None = None
        self._shared: _SharedApp | None = None
        self.url = ""

    async def __aenter__(self) -> RuntimeEmulator:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        app = web.Application(client_max_size=100 * 1024 * 1024)
        app.router.add_post(r"/runtimes/{arn:.+}/invocations", self._invoke)
        app.router.add_post(r"/runtimes/{arn:.+}/stopruntimesession", self._stop_session)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://{self._host}:{port}"
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
        if self.config.mode == "in_process":
            self._shared = _SharedApp(self.config.app)
            await asyncio.to_thread(self._shared.start)
        self._reaper = asyncio.create_task(self._reap())

    async def stop(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        await asyncio.gather(*(self._end(s, self.expired) for s in list(self.sessions.values())))
        if self._shared is not None:
            await asyncio.to_thread(self._shared.stop)
        if self._http is not None:
            await self._http.close()
        if self._runner is not None:
            await self._runner.cleanup()

    def agent_pids(self) -> list[int]:
        agents = [s.agent for s in self.sessions.values()]
        return [a.process.pid for a in agents if isinstance(a, _ProcessAgent)]

    def kill_agent(self, session_id: str) -> None:
        """Kill a session's agent process abruptly (SIGKILL), as a crash would."""
        agent = self.sessions[session_id].agent
        if not isinstance(agent, _ProcessAgent):
            raise RuntimeError("kill_agent needs mode='process'")
        agent.process.kill()

    # ------------------------------------------------------------------ API

    async def _invoke(self, request: web.Request) -> web.StreamResponse:
        self.counts["invoke"] += 1
        try:
            self._check_arn(request)
            session_id = self._session_header(request)
            payload = await request.read()
            if session_id in self.sessions:
                session = self.sessions[session_id]
                await session.ready.wait()
                return await self._forward(session, payload, request)
            with self.starting:
                self._admit()
                session = self._open(session_id)
                await self._launch(session)
                return await self._forward(session, payload, request)
        except _ApiError as e:
            self.counts[e.error_type] += 1
            return _error(e)

    async def _stop_session(self, request: web.Request) -> web.StreamResponse:
        self.counts["stop"] += 1
        try:
            self._check_arn(request)
            session_id = self._session_header(request)
            session = self.sessions.get(session_id)
            if session is None:
                raise _ApiError(404, "ResourceNotFoundException", f"session {session_id} not found")
            await self._end(session, self.stopped)
        except _ApiError as e:
            self.counts[e.error_type] += 1
            return _error(e)
        return web.json_response({}, headers={SESSION_HEADER: session_id})

    def _check_arn(self, request: web.Request) -> None:
        arn = unquote(request.match_info["arn"])
        if self.config.runtime_arns and arn not in self.config.runtime_arns:
            raise _ApiError(404, "ResourceNotFoundException", f"runtime {arn} not found")

    @staticmethod
    def _session_header(request: web.Request) -> str:
        sid = request.headers.get(SESSION_HEADER, "")
        if not 33 <= len(sid) <= 256:
            raise _ApiError(
                400, "ValidationException", "runtimeSessionId must be 33-256 characters"
            )
        return sid

    def _admit(self) -> None:
        """Throttling and quota, checked before a new session is created."""
        n = self.counts["invoke"]
        if self.config.throttle_every and n % self.config.throttle_every == 0:
            raise _ApiError(429, "ThrottlingException", "Rate exceeded (injected)")
        if self._invoke_tps is not None and not self._invoke_tps.try_acquire():
            raise _ApiError(429, "ThrottlingException", "Rate exceeded")
        if len(self.sessions) >= self.config.max_sessions:
            raise _ApiError(
                402,
                "ServiceQuotaExceededException",
                f"active sessions quota ({self.config.max_sessions}) reached",
            )

    def _open(self, session_id: str) -> _Session:
        now = time.monotonic()
        session = _Session(session_id, created=now, last_active=now)
        self.sessions[session_id] = session
        self.live.add()
        self.started.append(session_id)
        return session

    async def _launch(self, session: _Session) -> None:
        try:
            await asyncio.sleep(self.config.cold_start)
            if self._shared is not None:
                session.agent = _InProcessAgent(self._shared, session.session_id)
            else:
                session.agent = await _ProcessAgent.spawn(self.config, session.session_id)
                await session.agent.wait_ready(self._http, self.config.agent_ready_timeout)  # type: ignore[arg-type]
        except Exception as e:
            session.failed = f"agent failed to start: {e}"
            await self._end(session, self.expired)
            raise _ApiError(424, "RuntimeClientError", session.failed) from None
        finally:
            session.ready.set()

    async def _forward(
        self, session: _Session, payload: bytes, request: web.Request
    ) -> web.Response:
        if session.agent is None or not session.agent.alive():
            raise _ApiError(424, "RuntimeClientError", session.failed or "agent is not running")
        session.last_active = time.monotonic()
        assert self._http is not None
        headers = {SESSION_HEADER: session.session_id, "Content-Type": "application/json"}
        try:
            async with self._http.post(
                f"{session.agent.url}/invocations", data=payload, headers=headers
            ) as resp:
                body = await resp.read()
                status, ctype = resp.status, resp.headers.get("Content-Type", "application/json")
        except (aiohttp.ClientError, TimeoutError) as e:
            raise _ApiError(424, "RuntimeClientError", f"agent unreachable: {e}") from None
        if status >= 400:
            text = body[:500].decode(errors="replace")
            raise _ApiError(424, "RuntimeClientError", f"agent answered {status}: {text}")
        return web.Response(
            body=body,
            status=200,
            headers={SESSION_HEADER: session.session_id, "Content-Type": ctype},
        )

    # ------------------------------------------------------------------ lifecycle

    async def _end(self, session: _Session, ledger: list[str]) -> None:
        if self.sessions.pop(session.session_id, None) is None:
            return
        self.live.remove()
        ledger.append(session.session_id)
        if session.agent is not None:
            await session.agent.terminate()

    async def _reap(self) -> None:
        """Idle timeout (agent not busy), max lifetime, and agents that died."""
        while True:
            await asyncio.sleep(0.25)
            now = time.monotonic()
            for session in list(self.sessions.values()):
                agent = session.agent
                if agent is None:
                    continue
                if not agent.alive() or now - session.created > self.config.max_lifetime:
                    await self._end(session, self.expired)
                    continue
                if now - session.last_active > self.config.idle_timeout:
                    assert self._http is not None
                    if await agent.busy(self._http):
                        session.last_active = now
                    else:
                        await self._end(session, self.expired)


def _error(e: _ApiError) -> web.Response:
    return web.json_response(
        {"message": e.message, "__type": e.error_type},
        status=e.status,
        headers={"x-amzn-ErrorType": e.error_type},
    )


# ---------------------------------------------------------------------- agents


class _ProcessAgent:
    """One OS process per session, serving on a socket the emulator bound for it."""

    def __init__(self, process: asyncio.subprocess.Process, url: str) -> None:
        self.process = process
        self.url = url

    @classmethod
    async def spawn(cls, config: EmulatorConfig, session_id: str) -> _ProcessAgent:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        port = sock.getsockname()[1]
        out: Any = asyncio.subprocess.DEVNULL
        if config.log_dir:
            os.makedirs(config.log_dir, exist_ok=True)
            out = open(os.path.join(config.log_dir, f"{session_id}.log"), "ab")  # noqa: SIM115, ASYNC230
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "agentcore_rollout.agent.serve",
                config.app,
                "--fd",
                str(sock.fileno()),
                pass_fds=(sock.fileno(),),
                env={**os.environ, **config.env, "AGENTCORE_ROLLOUT_PARENT_PID": str(os.getpid())},
                stdout=out,
                stderr=out,
                start_new_session=True,
            )
        finally:
            sock.close()
            if out is not asyncio.subprocess.DEVNULL:
                out.close()
        return cls(process, f"http://127.0.0.1:{port}")

    def alive(self) -> bool:
        return self.process.returncode is None

    async def wait_ready(self, http: aiohttp.ClientSession, timeout: float) -> None:
        give_up = time.monotonic() + timeout
        while time.monotonic() < give_up:
            if not self.alive():
                raise RuntimeError(f"agent process exited with code {self.process.returncode}")
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with http.get(f"{self.url}/ping") as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.05)
        await self.terminate()
        raise RuntimeError(f"agent not healthy within {timeout:.0f}s")

    async def busy(self, http: aiohttp.ClientSession) -> bool:
        try:
            async with http.get(f"{self.url}/ping") as resp:
                return (await resp.json()).get("status") == "HealthyBusy"
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return False

    async def terminate(self) -> None:
        if self.alive():
            self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), timeout=5)
            except TimeoutError:
                self.process.kill()
        await self.process.wait()


class _SharedApp:
    """One RolloutApp served by uvicorn in a background thread (in_process mode)."""

    def __init__(self, spec: str) -> None:
        from ..agent.serve import load_app

        self.app = load_app(spec)
        self.url = ""
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        import uvicorn

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self._server = uvicorn.Server(
            uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="off")
        )
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._server.serve(sockets=[sock])), daemon=True
        )
        self._thread.start()
        give_up = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > give_up or not self._thread.is_alive():
                raise RuntimeError("in-process agent server did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)


class _InProcessAgent:
    def __init__(self, shared: _SharedApp, session_id: str) -> None:
        self._shared = shared
        self._session_id = session_id
        self.url = shared.url

    def alive(self) -> bool:
        return True

    async def busy(self, http: aiohttp.ClientSession) -> bool:
        return self._shared.app.session_busy(self._session_id)

    async def terminate(self) -> None:
        self._shared.app.cancel_session(self._session_id)


def main(argv: list[str] | None = None) -> None:
    """`python -m agentcore_rollout.local.runtime APP [options]`: serve the emulator until
    SIGINT/SIGTERM (then every session's agent is stopped). Agents inherit this process's
    environment. Prints the URL on one line once listening."""
    import argparse

    from .._process import exit_with_parent, serve_until_signalled

    parser = argparse.ArgumentParser(prog="python -m agentcore_rollout.local.runtime")
    parser.add_argument("app", help="module:attribute of the RolloutApp each session runs")
    parser.add_argument("--mode", choices=["process", "in_process"], default="process")
    parser.add_argument("--runtime-arn", action="append", default=[], help="ARNs that exist")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--cold-start", type=float, default=0.0)
    parser.add_argument("--invoke-tps", type=float, default=None)
    parser.add_argument("--max-sessions", type=int, default=1000)
    parser.add_argument("--idle-timeout", type=float, default=900.0)
    parser.add_argument("--max-lifetime", type=float, default=8 * 3600.0)
    parser.add_argument("--log-dir", default=None, help="each agent process's output goes here")
    args = parser.parse_args(argv)
    exit_with_parent()
    logging.basicConfig(level=logging.WARNING)
    config = EmulatorConfig(
        app=args.app,
        mode=args.mode,
        runtime_arns=tuple(args.runtime_arn),
        cold_start=args.cold_start,
        invoke_tps=args.invoke_tps,
        max_sessions=args.max_sessions,
        idle_timeout=args.idle_timeout,
        max_lifetime=args.max_lifetime,
        log_dir=args.log_dir,
    )
    asyncio.run(serve_until_signalled(RuntimeEmulator(config, host=args.host, port=args.port)))


if __name__ == "__main__":
    main()
