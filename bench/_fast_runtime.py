"""A fast AgentCore Runtime for `bench/scale.py`: the real data-plane wire protocol, no agents.

`POST /runtimes/{arn}/invocations` and `POST /runtimes/{arn}/stopruntimesession` are answered
as `agentcore_rollout.local.runtime` answers them (REST-JSON, the session id in
`X-Amzn-Bedrock-AgentCore-Runtime-Session-Id`, errors by `x-amzn-ErrorType`), so the engine's
unmodified aiobotocore client talks to it through `endpoint_url`. An invocation is answered at
once with `{"status": "accepted"}`; the session's `RolloutControl` (result key, signing key,
...) is kept, and the session stays live, as a long-running agent's would, until the engine
stops it.

Two bench-only endpoints drive and watch it:
- `POST /bench/finish {"rate": r, "max_pending": w, "concurrency": c}`: every live session
  "finishes": its valid, signed result is written to S3 with the agent SDK's `ResultWriter`
  (endpoints from `AWS_ENDPOINT_URL_S3` and `_SQS`: with a queue in the control block, the
  writer also sends the result there, inline), `r` per second, at most `c` puts in flight and at
  most `w` results written whose session the engine has not stopped yet (so a slow moto is
  not buried under a backlog it only gets slower at draining).
- `GET /bench/stats`: counters, peaks, and the S3 put latencies seen by the writer.

    python bench/_fast_runtime.py [--host 127.0.0.1] [--port 0]   # prints its URL, then serves
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any

from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agentcore_rollout.agent import ResultWriter  # noqa: E402
from agentcore_rollout.contract import (  # noqa: E402
    ContractError,
    RolloutControl,
    RolloutResult,
    Timings,
    split_payload,
)
from agentcore_rollout.serving.process import exit_with_parent, serve_until_signalled  # noqa: E402

SESSION_HEADER = "X-Amzn-Bedrock-AgentCore-Runtime-Session-Id"
log = logging.getLogger("bench.fast_runtime")


class FastRuntime:
    """`async with FastRuntime() as rt: rt.url`; see the module docstring."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._host, self._port = host, port
        # session id -> (its control block, when it was invoked); insertion order = start order
        self.sessions: dict[str, tuple[RolloutControl, float]] = {}
        self._written: set[str] = set()  # live sessions whose result is in S3
        self.invokes = self.stops = self.unknown_stops = self.peak_live = 0
        self.written = self.write_errors = self.stopped_after_write = 0
        self.put_ms: list[float] = []
        self.finish: dict[str, Any] = {}
        self._finisher: asyncio.Task[None] | None = None
        self._stopped = asyncio.Event()  # set by each stop of a session whose result is in S3
        self._writer = ResultWriter()
        self._runner: web.AppRunner | None = None
        self.url = ""

    @property
    def urls(self) -> tuple[str, ...]:
        """What `serve_until_signalled` prints for the parent: its one URL."""
        return (self.url,)

    async def __aenter__(self) -> FastRuntime:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_post(r"/runtimes/{arn:.+}/invocations", self._invoke)
        app.router.add_post(r"/runtimes/{arn:.+}/stopruntimesession", self._stop)
        app.router.add_post("/bench/finish", self._start_finishing)
        app.router.add_get("/bench/stats", self._stats)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port, backlog=1024)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://{self._host}:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._finisher is not None:
            self._finisher.cancel()
            await asyncio.gather(self._finisher, return_exceptions=True)
        await self._writer.close()
        if self._runner is not None:
            await self._runner.cleanup()

    # ------------------------------------------------------------------ AgentCore wire

    async def _invoke(self, request: web.Request) -> web.Response:
        self.invokes += 1
        sid = request.headers.get(SESSION_HEADER, "")
        if not 33 <= len(sid) <= 256:
            return _error(400, "ValidationException", "runtimeSessionId must be 33-256 characters")
        try:
            _, control = split_payload(json.loads(await request.read()))
        except (ContractError, ValueError) as e:
            return _error(400, "ValidationException", f"bad payload: {e}")
        if sid not in self.sessions:  # a repeated invoke of a live session changes nothing
            self.sessions[sid] = (control, time.time())
            self.peak_live = max(self.peak_live, len(self.sessions))
        return web.json_response({"status": "accepted"}, headers={SESSION_HEADER: sid})

    async def _stop(self, request: web.Request) -> web.Response:
        self.stops += 1
        sid = request.headers.get(SESSION_HEADER, "")
        if self.sessions.pop(sid, None) is None:
            self.unknown_stops += 1
            return _error(404, "ResourceNotFoundException", f"session {sid} not found")
        if sid in self._written:
            self._written.discard(sid)
            self.stopped_after_write += 1
            self._stopped.set()
        return web.json_response({}, headers={SESSION_HEADER: sid})

    # ------------------------------------------------------------------ bench control

    async def _start_finishing(self, request: web.Request) -> web.Response:
        if self._finisher is not None:
            return _error(409, "ConflictException", "already finishing")
        spec = await request.json()
        self._finisher = asyncio.create_task(
            self._finish_all(
                float(spec.get("rate", 100.0)),
                int(spec.get("max_pending", 200)),
                int(spec.get("concurrency", 10)),
            )
        )
        return web.json_response({"sessions": len(self.sessions)})

    async def _stats(self, _: web.Request) -> web.Response:
        return web.json_response(self.stats())

    def stats(self) -> dict[str, Any]:
        return {
            "live": len(self.sessions),
            "peak_live": self.peak_live,
            "invokes": self.invokes,
            "stops": self.stops,
            "unknown_stops": self.unknown_stops,
            "written": self.written,
            "write_errors": self.write_errors,
            "pending": self.written - self.stopped_after_write,
            "finish": self.finish,
            "put_ms": _quantiles(self.put_ms),
        }

    async def _finish_all(self, rate: float, max_pending: int, concurrency: int) -> None:
        """Write every live session's result: `rate` per second, paced; held back while
        `max_pending` results await their session's stop, or `concurrency` puts are in
        flight. A pause does not turn into a catch-up burst afterwards."""
        todo = [(sid, c) for sid, (c, _) in self.sessions.items() if sid not in self._written]
        self.finish = {"sessions": len(todo), "rate": rate, "max_pending": max_pending}
        slots = asyncio.Semaphore(concurrency)
        writes: set[asyncio.Task[None]] = set()
        began = next_at = time.monotonic()
        self.finish["began"] = time.time()
        held = 0.0
        for sid, control in todo:
            now = time.monotonic()
            if next_at > now:
                await asyncio.sleep(next_at - now)
            if self.written - self.stopped_after_write >= max_pending:
                t = time.monotonic()
                while self.written - self.stopped_after_write >= max_pending:
                    self._stopped.clear()
                    await self._stopped.wait()
                held += time.monotonic() - t
            await slots.acquire()
            next_at = max(next_at + 1 / rate, time.monotonic() - 0.05)  # 50 ms of catch-up
            task = asyncio.create_task(self._write(sid, control))
            writes.add(task)
            task.add_done_callback(writes.discard)
            task.add_done_callback(lambda _: slots.release())
        await asyncio.gather(*writes)
        wall = time.monotonic() - began
        self.finish |= {
            "ended": time.time(),
            "wall_s": round(wall, 3),
            "achieved_rate": round(len(todo) / wall, 2) if wall > 0 else None,
            "held_by_max_pending_s": round(held, 3),
        }

    async def _write(self, sid: str, control: RolloutControl) -> None:
        received = self.sessions.get(sid, (control, time.time()))[1]
        now = time.time()
        result = RolloutResult(
            exp_id=control.exp_id,
            step=control.step,
            request_id=control.request_id,
            input_id=control.input_id,
            session_id=sid,
            status="ok",
            stop_reason="done",
            rewards=1.0,
            metrics={"turns": 1.0},
            timings=Timings(received=received, started=received, finished=now),
        )
        try:
            await self._writer.write(result, control)
        except Exception as e:  # counted and reported; the engine then times it out
            self.write_errors += 1
            log.warning("writing the result of %s failed: %r", sid, e)
            return
        self.put_ms.append((time.time() - now) * 1000)
        self.written += 1
        if sid in self.sessions:
            self._written.add(sid)
        else:  # stopped before its put returned (the engine saw it first): not pending
            self.stopped_after_write += 1


def _error(status: int, error_type: str, message: str) -> web.Response:
    return web.json_response(
        {"message": message, "__type": error_type},
        status=status,
        headers={"x-amzn-ErrorType": error_type},
    )


def _quantiles(values: list[float]) -> dict[str, float]:
    """Nearest rank, in the unit given."""
    ordered = sorted(values)
    if not ordered:
        return {}
    at = lambda q: ordered[max(0, math.ceil(len(ordered) * q) - 1)]  # noqa: E731
    return {"p50": round(at(0.5), 2), "p99": round(at(0.99), 2), "max": round(ordered[-1], 2)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python bench/_fast_runtime.py")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    exit_with_parent()
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(serve_until_signalled(FastRuntime(args.host, args.port)))


if __name__ == "__main__":
    main()
