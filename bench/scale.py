"""Scale benchmark: 10,000 sessions live at once, then 10,000 results, the engine in its own
process.

Why: a trainer's batch can be 10,000 long-running agents. The engine holds every one of them
(a task, a live-session slot, a buffer waiter, a deadline) while they run, then drains their
results through S3 and SQS; the issue's targets are engine RSS < 1 GB with 10,000 sessions
live and <= 3 ms of engine CPU per rollout (issue 23).

Three processes besides this one, all on 127.0.0.1, each read from /proc:
- moto in server mode (`agentcore_rollout.local.moto`): S3 and SQS, with the bucket's real
  `s3:ObjectCreated` notifications to the results queue, provisioned as the infra does;
- a fast AgentCore runtime (`bench/_fast_runtime.py`) speaking the real InvokeAgentRuntime /
  StopRuntimeSession REST-JSON wire: it accepts each invocation at once and holds the session
  live until told to finish, then writes each session's signed result with the agent SDK's
  `ResultWriter` at a controlled rate;
- the engine (this file, `--child-engine`): an unmodified `RolloutEngine` over its real
  aiobotocore clients, submitting every request at once, as `rollout()` does.

Phases: *start* (first submit until every session has started: `on_start` called for each),
then *results* (the runtime writes results, paced; until the caller has every outcome).
Measured and printed as JSON (also written to `--out`, bench/results by default, as
scale.json, plus scale.png):
- `live_sessions`: the engine's `peak_live_sessions` (live-session slots held, taken before a
  session starts), and `runtime_peak_live`, the sessions the runtime held open at once: both
  must be the whole batch, as no result is written before every session has started;
- `engine_rss_mb_peak`: the engine process's VmHWM;
- `engine_cpu_ms_per_rollout`: the engine process's utime+stime from the first submit to the
  last outcome, per rollout, and split by phase;
- `handoff_s`: the result's `timings.finished` (stamped by the writer just before its S3 put,
  same clock) to its outcome's `finished_at` (when the request's task returns the outcome,
  i.e. when the caller's await of that request returns), p50/p99;
- `bottleneck`: from each process's CPU per result and share of a core during the results
  phase (and the SQS backlog: moto's SQS walks its whole queue for every message sent and
  received, so it slows as the backlog grows; the runtime therefore holds writes back while
  `--max-pending` results await their session's stop).

Agents send their small results inline (`results.notify_directly`): the engine verifies the
result the agent's own SQS message carries and reads nothing from S3 (`s3:GetObject` 0 in
`api_calls_per_rollout`); the bucket's notification of each is deleted as a duplicate.

To see where the engine's time goes, `--profile FILE` runs the engine under cProfile (CPU
time) and writes its stats there (`python -m pstats FILE`); the profiler slows it several
times over, so read shares from it, not milliseconds.

    python bench/scale.py [--sessions 10000] [--start-rate 400] [--result-rate 50]
                          [--max-pending 50] [--out bench/results]
                          [--profile FILE] [--smoke]

`--smoke` (CI's): 20 sessions, 200 starts/s, 10 pending, into out/bench-smoke/.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import itertools
import json
import logging
import math
import os
import resource
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

SCRIPT = Path(__file__).resolve()
ROOT = SCRIPT.parent.parent
sys.path.insert(0, str(ROOT))

from agentcore_rollout.local.moto import (  # noqa: E402
    LOCAL_CREDENTIALS,
    MotoServer,
    provision_results_channel,
)
from bench import _smoke  # noqa: E402

RUNTIME_ARN = "arn:aws:bedrock-agentcore:us-east-1:000000000000:runtime/scale_bench-0000"
REGION = "us-east-1"
SAMPLE_EVERY = 0.5  # seconds between /proc samples
STALL_S = 180.0  # no session started and no outcome returned for this long: the run failed
KEYS = (  # the figures the issue asks for
    "live_sessions",
    "engine_rss_mb_peak",
    "engine_cpu_ms_per_rollout",
    "handoff_s",
    "bottleneck",
)
ENGINE_STATS = (  # the engine's counters copied into the figures
    "invokes",
    "stops",
    "peak_starts_in_flight",
    "messages",
    "downloads",
    "inline_results",
    "duplicates",
    "s3_lookups",
    "invoke_errors",
    "stop_errors",
    "handler_errors",
    "throttles",
    "rate_cuts",
)
_CLK_TCK = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------- /proc


def cpu_s(pid: int | str = "self") -> float:
    """utime + stime of a process, seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK  # fields 14, 15 of stat(5)


def status_mb(pid: int | str, key: str) -> float:
    """`VmRSS` (now) or `VmHWM` (peak) from /proc/<pid>/status, MB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    raise KeyError(key)


def fd_count(pid: int | str) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def machine_busy_s() -> float:
    """Busy CPU seconds of the whole machine, all cores, from /proc/stat."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    idle = ticks[3] + ticks[4]  # idle + iowait
    total = sum(ticks[:8])  # guest time is already inside user
    return (total - idle) / _CLK_TCK


# ---------------------------------------------------------------------- the engine process


def _emit(event: str, **fields: Any) -> None:
    print(json.dumps({"ev": event, "t": time.time(), "cpu": cpu_s(), **fields}), flush=True)


async def engine_child(spec: dict[str, Any]) -> None:
    """Runs in the engine's own process: one `RolloutEngine`, every request submitted at once;
    reports progress and the figures as JSON lines on stdout."""
    from agentcore_rollout import EngineConfig, RolloutEngine, RolloutRequest, RolloutStart
    from agentcore_rollout.serving.process import exit_with_parent

    exit_with_parent()
    n = spec["sessions"]
    cfg = EngineConfig(
        exp_id="scale",
        bucket=spec["bucket"],
        prefix=spec["prefix"],
        queue_url=spec["queue_url"],
        runtime_arn=RUNTIME_ARN,
        service_urls={"s3": spec["moto"], "sqs": spec["moto"], "agentcore": spec["runtime"]},
        dispatch={
            "start_rate": spec["start_rate"],
            "stop_rate": spec["stop_rate"],
            "max_live_sessions": max(n, 1),
        },
        limits={"rollout_timeout": spec["rollout_timeout"]},  # no deadline lookups while live
        results={"wait_time": 20, "notify_directly": True},  # small results come inline
    )
    requests = [
        RolloutRequest({"i": i}, input_id=f"q{i // 8}", sample_index=i % 8, request_id=f"r{i:06d}")
        for i in range(n)
    ]
    started = 0

    def on_start(_: RolloutStart) -> None:
        nonlocal started
        started += 1

    async with RolloutEngine(cfg) as engine:
        _emit("ready", rss=status_mb("self", "VmRSS"))
        _emit("submitting")
        handles = [engine.submit(r, on_start=on_start) for r in requests]
        _emit("submitted")

        async def report() -> None:
            # Outcomes returned, counted in submission order (the order results are written
            # in): a lower bound, exact at the end, for O(1) work per report rather than a
            # scan of every handle, which would bill the engine for the bench's own counting.
            returned, all_started = 0, False
            while True:
                await asyncio.sleep(0.25)
                while returned < n and handles[returned].done():
                    returned += 1
                s = engine.stats()
                fields = {
                    "live": s.live_sessions,
                    "peak_live": s.peak_live_sessions,
                    "started": started,
                    "invokes": s.invokes,
                    "starting": s.starts_in_flight,
                    "stops": s.stops,
                    "messages": s.messages,
                    "results": s.inline_results + s.downloads,  # two messages each, inline
                    "returned": returned,
                    "rss": status_mb("self", "VmRSS"),
                }
                # every session started, or ended before it could
                if not all_started and started + fields["returned"] >= n:
                    all_started = True
                    _emit("all_started", **fields)
                else:
                    _emit("progress", **fields)

        reporter = asyncio.create_task(report())
        outcomes = [await h for h in handles]
        reporter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reporter
        _emit("done", **_engine_figures(outcomes, engine.stats()))
    _emit("closed", hwm=status_mb("self", "VmHWM"))


def _engine_figures(outcomes: list[Any], stats: Any) -> dict[str, Any]:
    from dataclasses import asdict

    ok = [o for o in outcomes if o.result is not None]
    starts = sorted(o.started_at for o in outcomes if o.started_at is not None)
    return {
        "outcomes": dict(Counter(str(o.outcome) for o in outcomes)),
        "handoff_s": _quantiles([o.finished_at - o.result.timings.finished for o in ok]),
        "write_to_buffer_handoff_s": _quantiles(
            [o.delivered_at - o.result.timings.finished for o in ok if o.delivered_at]
        ),
        "start_span_s": starts[-1] - starts[0] if len(starts) > 1 else 0.0,
        "engine": asdict(stats),
    }


def _quantiles(values: list[float]) -> dict[str, float]:
    """Nearest rank."""
    ordered = sorted(values)
    if not ordered:
        return {}
    return {
        f"p{q}": ordered[max(0, math.ceil(len(ordered) * q / 100) - 1)] for q in (50, 90, 99)
    } | {"max": ordered[-1]}


# ---------------------------------------------------------------------- the orchestrator


class Child:
    """A child process in its own session (Ctrl-C reaches only us; we stop it), which also
    exits by itself if we die (`exit_with_parent`). Reads its stdout lines."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        self.name, self._argv, self._env = name, argv, env
        self.process: asyncio.subprocess.Process | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    async def start(self) -> None:
        self.process = await asyncio.create_subprocess_exec(
            *self._argv,
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, **self._env, "AGENTCORE_ROLLOUT_PARENT_PID": str(os.getpid())},
            start_new_session=True,
            limit=2**20,  # the engine's last lines carry its stats
        )

    async def line(self, timeout: float | None = None) -> str:
        assert self.process is not None and self.process.stdout is not None
        raw = await asyncio.wait_for(self.process.stdout.readline(), timeout)
        if not raw:
            code = await self.process.wait()
            raise RuntimeError(f"{self.name} exited (code {code}) before it was done")
        return raw.decode().strip()

    async def stop(self, timeout: float = 15.0) -> None:
        process, self.process = self.process, None
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            await asyncio.wait_for(process.wait(), timeout)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()


def _fd_limit(needed: int) -> dict[str, int | bool]:
    """Raise the soft open-files limit to the hard one if it is below `needed` (children
    inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    raised = False
    if soft < needed and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft, raised = hard, True
    return {"soft": soft, "hard": hard, "raised": raised}


async def _runtime_call(url: str, path: str, body: dict[str, Any] | None = None) -> Any:
    """GET (or, with a body, POST) one of the fast runtime's `/bench/...` endpoints."""
    method = "GET" if body is None else "POST"
    async with aiohttp.ClientSession() as http, http.request(method, url + path, json=body) as r:
        r.raise_for_status()
        return await r.json()


def _say(quiet: bool, text: str) -> None:
    if not quiet:
        print(f"[scale {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


class _Sampler:
    """Every SAMPLE_EVERY seconds: CPU and RSS of each process, the runtime's counters and the
    engine's latest progress line."""

    def __init__(self, procs: dict[str, int], runtime_url: str, began: float) -> None:
        self.procs = procs
        self._url = runtime_url
        self.began = began
        self.rows: list[dict[str, Any]] = []
        self.engine: dict[str, Any] = {}
        self.runtime: dict[str, Any] = {}
        self.hwm = 0.0
        self.fds: dict[str, int] = {}

    def snapshot(self) -> dict[str, float]:
        """CPU seconds of each process and of the whole machine, now."""
        out = {name: cpu_s(pid) for name, pid in self.procs.items()}
        return out | {"machine_busy": machine_busy_s(), "t": time.time()}

    async def run(self) -> None:
        async with aiohttp.ClientSession() as http:
            while True:
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with http.get(f"{self._url}/bench/stats") as resp:
                        self.runtime = await resp.json()
                row: dict[str, Any] = {"t": time.time() - self.began}
                for name, pid in self.procs.items():
                    with contextlib.suppress(OSError, KeyError):
                        row[f"{name}_cpu"] = cpu_s(pid)
                        row[f"{name}_rss"] = status_mb(pid, "VmRSS")
                        self.fds[name] = max(self.fds.get(name, 0), fd_count(pid))
                with contextlib.suppress(OSError, KeyError):
                    self.hwm = max(self.hwm, status_mb(self.procs["engine"], "VmHWM"))
                row["engine_live"] = self.engine.get("live", 0)
                row["returned"] = self.engine.get("returned", 0)
                row["messages"] = self.engine.get("messages", 0)
                row["results"] = self.engine.get("results", 0)
                row["runtime_live"] = self.runtime.get("live", 0)
                row["written"] = self.runtime.get("written", 0)
                self.rows.append(row)
                await asyncio.sleep(SAMPLE_EVERY)


class _EngineLines:
    """The engine's JSON lines, read up to a given event. Each event is kept, with a CPU
    snapshot of every process when it was read (its `marks`); progress goes to the sampler
    and, every 5 s, to stderr. A dead engine, or one with no session started and no outcome
    returned for STALL_S, fails the run."""

    def __init__(self, engine: Child, sampler: _Sampler, n: int, quiet: bool) -> None:
        self._engine, self._sampler, self._n, self._quiet = engine, sampler, n, quiet
        self.events: dict[str, dict[str, Any]] = {}
        self.marks: dict[str, dict[str, float]] = {}
        self._moved_at, self._last = time.monotonic(), (0, 0)
        self._said_at = 0.0

    def mark(self, name: str, engine_cpu: float) -> None:
        self.marks[name] = self._sampler.snapshot() | {"engine": engine_cpu}

    async def until(self, event: str) -> dict[str, Any]:
        while event not in self.events:
            msg = json.loads(await self._engine.line(STALL_S))
            if msg["ev"] == "progress":
                self._progress(msg)
            if msg["ev"] in ("progress", "all_started"):
                self._sampler.engine = msg
            self.events[msg["ev"]] = msg
            if msg["ev"] != "progress":
                self.mark(msg["ev"], msg["cpu"])  # the engine's own reading, exact
        return self.events[event]

    def _progress(self, msg: dict[str, Any]) -> None:
        now = time.monotonic()
        if (msg["started"], msg["returned"]) != self._last:
            self._moved_at, self._last = now, (msg["started"], msg["returned"])
        elif now - self._moved_at > STALL_S:
            raise RuntimeError(f"no progress for {STALL_S:.0f}s: {msg}")
        if self._quiet or now - self._said_at < 5.0:
            return
        self._said_at = now
        runtime, n = self._sampler.runtime, self._n
        _say(
            False,
            f"started {msg['started']}/{n}, runtime live {runtime.get('live', '?')}, "
            f"written {runtime.get('written', 0)}, SQS messages in {msg['messages']}, "
            f"outcomes {msg['returned']}/{n}, engine RSS {msg['rss']:.0f} MB",
        )


async def run(
    sessions: int = 10_000,
    *,
    start_rate: float = 400.0,
    result_rate: float = 50.0,
    max_pending: int = 50,
    write_concurrency: int = 10,
    quiet: bool = False,
    profile: Path | None = None,
) -> dict[str, Any]:
    """Start moto, the fast runtime and the engine; run both phases; stop them all."""
    began = time.time()
    fd_limit = _fd_limit(4096)
    env = LOCAL_CREDENTIALS | {"AWS_DEFAULT_REGION": REGION}
    moto = MotoServer()
    runtime = engine = None
    sampler_task: asyncio.Task[None] | None = None
    try:
        await asyncio.to_thread(moto.start)
        assert moto.pid is not None
        channel = await asyncio.to_thread(
            provision_results_channel,
            moto.client("s3"),
            moto.client("sqs"),
            bucket="scale-bench",
            prefix="rollouts",
            queue="scale-bench",
        )
        runtime = Child(
            "runtime",
            [sys.executable, str(ROOT / "bench" / "_fast_runtime.py")],
            env | {"AWS_ENDPOINT_URL_S3": moto.url, "AWS_ENDPOINT_URL_SQS": moto.url},
        )
        await runtime.start()
        runtime_url = await runtime.line(timeout=60)
        spec = {
            "sessions": sessions,
            "bucket": channel.bucket,
            "prefix": channel.prefix,
            "queue_url": channel.queue_url,
            "moto": moto.url,
            "runtime": runtime_url,
            "start_rate": start_rate,
            "stop_rate": max(4 * result_rate, start_rate),
            # Deadlines far past the run: no S3 lookups while the sessions are live.
            "rollout_timeout": 600.0 + 2 * sessions / start_rate + 4 * sessions / result_rate,
            "profile": str(profile) if profile else None,
        }
        engine = Child(
            "engine", [sys.executable, str(SCRIPT), "--child-engine", json.dumps(spec)], env
        )
        await engine.start()
        sampler = _Sampler(
            {"engine": engine.pid, "moto": moto.pid, "runtime": runtime.pid, "bench": os.getpid()},
            runtime_url,
            began,
        )
        sampler_task = asyncio.create_task(sampler.run())
        lines = _EngineLines(engine, sampler, sessions, quiet)

        _say(quiet, f"moto {moto.url}, runtime {runtime_url}, engine pid {engine.pid}")
        await lines.until("ready")
        _say(quiet, f"engine ready; submitting {sessions} requests at {start_rate:g}/s")
        live = await lines.until("all_started")
        _say(quiet, f"all started: engine live {live['live']}, runtime {sampler.runtime}")
        finish = {"rate": result_rate, "max_pending": max_pending, "concurrency": write_concurrency}
        await _runtime_call(runtime_url, "/bench/finish", finish)
        lines.mark("finishing", cpu_s(engine.pid))
        _say(quiet, f"results: writing {sessions} at {result_rate:g}/s")
        await lines.until("done")
        await lines.until("closed")
        runtime_stats = await _runtime_call(runtime_url, "/bench/stats")
        assert engine.process is not None
        await engine.process.wait()
    finally:
        if sampler_task is not None:
            sampler_task.cancel()
            await asyncio.gather(sampler_task, return_exceptions=True)
        for child in (engine, runtime):
            if child is not None:
                await child.stop()
        await asyncio.to_thread(moto.stop)
    figures = _figures(spec, lines.events, lines.marks, runtime_stats, sampler, fd_limit)
    figures["bench_wall_s"] = round(time.time() - began, 1)
    figures["_series"] = sampler.rows
    figures["_pids"] = dict(sampler.procs)
    return figures


# ---------------------------------------------------------------------- figures


def _share(marks: dict[str, dict[str, float]], a: str, b: str, name: str) -> float:
    """CPU seconds per wall second (1.0 = one full core) of `name` between two marks."""
    wall = marks[b]["t"] - marks[a]["t"]
    return (marks[b][name] - marks[a][name]) / wall if wall > 0 else math.nan


def _rounded(q: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 4) for k, v in q.items()}


def _figures(
    spec: dict[str, Any],
    events: dict[str, dict[str, Any]],
    marks: dict[str, dict[str, float]],
    runtime: dict[str, Any],
    sampler: _Sampler,
    fd_limit: dict[str, Any],
) -> dict[str, Any]:
    n = spec["sessions"]
    ready, live, done = events["ready"], events["all_started"], events["done"]
    cores = os.cpu_count() or 1
    start_cpu = live["cpu"] - events["submitting"]["cpu"]
    results_cpu = done["cpu"] - live["cpu"]
    start_wall = live["t"] - events["submitting"]["t"]
    results_wall = done["t"] - marks["finishing"]["t"]
    procs = ("engine", "moto", "runtime", "bench")
    shares = {p: round(_share(marks, "finishing", "done", p), 3) for p in procs}
    start_shares = {p: round(_share(marks, "submitting", "all_started", p), 3) for p in procs}
    busy = _share(marks, "finishing", "done", "machine_busy")
    others = round(busy - sum(shares.values()), 3)  # other users' processes, in cores
    per_result = {
        p: round((marks["done"][p] - marks["finishing"][p]) * 1000 / n, 3)
        for p in ("engine", "moto", "runtime")
    }
    per_result["engine"] = round(results_cpu * 1000 / n, 3)  # its own reading, exact
    finish = runtime.get("finish", {})
    starts = done["start_span_s"]
    stats = done["engine"]
    results_began = marks["finishing"]["t"] - sampler.began
    figures: dict[str, Any] = {
        "live_sessions": stats["peak_live_sessions"],
        "engine_rss_mb_peak": round(max(events["closed"]["hwm"], sampler.hwm), 1),
        "engine_cpu_ms_per_rollout": round((start_cpu + results_cpu) * 1000 / n, 3),
        "handoff_s": _rounded(done["handoff_s"]),
        "bottleneck": "",
        "sessions": n,
        "outcomes": done["outcomes"],
        "runtime_peak_live": runtime["peak_live"],
        "engine_cpu_ms_per_rollout_by_phase": {
            "start": round(start_cpu * 1000 / n, 3),
            "results": round(results_cpu * 1000 / n, 3),
        },
        "engine_cpu_s_setup": round(ready["cpu"], 2),
        "engine_rss_mb": {
            "ready": round(ready["rss"], 1),
            "all_live": round(live["rss"], 1),
            "per_live_session_kb": round((live["rss"] - ready["rss"]) * 1024 / n, 2),
        },
        "start_rate": {
            "configured": spec["start_rate"],
            "achieved": round((n - 1) / starts, 1) if starts > 0 else None,
            "phase_s": round(start_wall, 2),
        },
        "result_rate": {
            "target": finish.get("rate"),
            "achieved_writes": finish.get("achieved_rate"),
            "achieved_outcomes": round(n / results_wall, 2),
            "held_by_max_pending_s": finish.get("held_by_max_pending_s"),
            "max_pending": finish.get("max_pending"),
            "phase_s": round(results_wall, 2),
        },
        "write_to_buffer_handoff_s": _rounded(done["write_to_buffer_handoff_s"]),
        # the same figure as `handoff_s` (both are read from `finished_at`), kept for reports
        "write_to_finished_at_s": _rounded(done["handoff_s"]),
        "s3_put_ms_at_writer": runtime.get("put_ms"),
        "sqs_backlog_peak": max((r["written"] - r["results"] for r in sampler.rows), default=0),
        "cpu_share_results_phase": shares | {"other_processes": others},
        "cpu_ms_per_result": per_result,
        "capacity_results_per_s": {
            p: round(1000 / v, 1) if v > 0 else math.inf for p, v in per_result.items()
        },
        "cpu_ms_per_result_by_progress": _by_progress(sampler.rows, results_began, n),
        "moto_cpu_ms_per_result_by_backlog": _by_backlog(sampler.rows, results_began),
        "cpu_share_start_phase": start_shares,
        "machine_busy_cores_results_phase": round(busy, 3),
        "cores": cores,
        "api_calls_per_rollout": {
            k: round(v / n, 3) for k, v in sorted(stats.get("api_calls", {}).items())
        },
        "engine_stats": {k: stats[k] for k in ENGINE_STATS},
        "peak_fds": sampler.fds,
        "fd_limit": fd_limit,
        "config": {k: spec[k] for k in ("start_rate", "stop_rate", "rollout_timeout")}
        | {"max_live_sessions": n, "wait_time": 20},
    }
    figures["bottleneck"] = _bottleneck(figures, shares, busy, cores)
    return figures


def _by_backlog(rows: list[dict[str, Any]], began: float) -> dict[str, float]:
    """moto's CPU ms per result received by the engine, by the SQS backlog at the time
    (results written whose notification the engine has not received yet)."""
    edges = (50, 200, 1000, 3000, math.inf)
    cpu: dict[str, float] = {}
    got: dict[str, int] = {}
    for prev, row in itertools.pairwise(rows):
        if row["t"] < began or "moto_cpu" not in prev or "moto_cpu" not in row:
            continue
        received = row["results"] - prev["results"]
        backlog = (row["written"] - row["results"] + prev["written"] - prev["results"]) / 2
        if received <= 0:
            continue
        edge = next(e for e in edges if backlog < e)
        label = f"<{edge}" if edge < math.inf else f">={edges[-2]}"
        cpu[label] = cpu.get(label, 0.0) + row["moto_cpu"] - prev["moto_cpu"]
        got[label] = got.get(label, 0) + received
    by_edge = sorted(got, key=lambda label: float(label.lstrip("<>=")))
    return {k: round(cpu[k] * 1000 / got[k], 2) for k in by_edge}


def _by_progress(rows: list[dict[str, Any]], began: float, n: int) -> dict[str, Any]:
    """Each process's CPU ms per result received, for each tenth of the results: whether a
    cost grows with what has accumulated (objects in S3, deleted receipts, heap)."""
    rows = [r for r in rows if r["t"] >= began and "moto_cpu" in r and "engine_cpu" in r]
    out: dict[str, Any] = {"results": [], "engine": [], "moto": [], "runtime": []}
    marks = [next((r for r in rows if r["results"] >= n * k / 10), None) for k in range(11)]
    marks[0] = rows[0] if rows else None
    for a, b in itertools.pairwise(marks):
        if a is None or b is None or b["results"] <= a["results"]:
            continue
        got = b["results"] - a["results"]
        out["results"].append(b["results"])
        for p in ("engine", "moto", "runtime"):
            out[p].append(round((b[f"{p}_cpu"] - a[f"{p}_cpu"]) * 1000 / got, 2))
    return out


def _bottleneck(f: dict[str, Any], shares: dict[str, float], busy: float, cores: int) -> str:
    """The process that limits throughput: the one that needs the most CPU per result. Each
    is one Python process (moto's threads share one GIL), so it saturates at one core:
    capacity = 1 s / its CPU per result."""
    per, cap = f["cpu_ms_per_result"], f["capacity_results_per_s"]
    top = min(cap, key=lambda p: cap[p])
    rate = f["result_rate"]
    text = (
        f"{top}: {per[top]} ms CPU per result, so it saturates one core at ~{cap[top]:.0f} "
        f"results/s (engine {per['engine']} ms -> ~{cap['engine']:.0f}/s, moto {per['moto']} "
        f"ms -> ~{cap['moto']:.0f}/s, runtime {per['runtime']} ms -> ~{cap['runtime']:.0f}/s). "
        f"In this run, at {rate['achieved_outcomes']} results/s ({rate['target']}/s targeted), "
        f"{top} used {shares[top]:.0%} of a core"
        + (" (saturated)" if shares[top] >= 0.85 else "")
        + f"; the machine {busy:.2f} of {cores} cores, other users' processes "
        f"{f['cpu_share_results_phase']['other_processes']:.2f}."
    )
    if top == "moto":
        text += (
            " moto's SQS recomputes every queue attribute (three walks of the whole queue, in-"
            "flight messages too, with a datetime per message) on each SendMessage (every S3 "
            "notification) and on each message it receives (a retention check), so its cost "
            "per result grows with the backlog: "
            f"{f['moto_cpu_ms_per_result_by_backlog']} ms by backlog here (peak "
            f"{f['sqs_backlog_peak']}); a result rate above its capacity snowballs."
        )
    return text


# ---------------------------------------------------------------------- plot


def plot(figures: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = figures["_series"]
    t = [r["t"] for r in rows]
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(16, 4.5))
    a.plot(t, [r["runtime_live"] for r in rows], label="sessions live (runtime)")
    a.plot(t, [r["engine_live"] for r in rows], "--", label="live slots held (engine)")
    a.plot(t, [r["written"] for r in rows], label="results written to S3")
    a.plot(t, [r["returned"] for r in rows], label="outcomes returned to the caller")
    a.set(xlabel="seconds", ylabel="count", title=f"{figures['sessions']} sessions")
    a.legend(fontsize=8)
    b.plot(t, [r.get("engine_rss", math.nan) for r in rows], label="engine")
    b.plot(t, [r.get("moto_rss", math.nan) for r in rows], label="moto")
    b.plot(t, [r.get("runtime_rss", math.nan) for r in rows], label="fast runtime")
    b.set(xlabel="seconds", ylabel="RSS (MB)", title="resident memory")
    b.legend(fontsize=8)
    for name in ("engine", "moto", "runtime"):
        xs, ys = [], []
        for prev, row in itertools.pairwise(rows):
            if f"{name}_cpu" in prev and f"{name}_cpu" in row and row["t"] > prev["t"]:
                xs.append(row["t"])
                ys.append((row[f"{name}_cpu"] - prev[f"{name}_cpu"]) / (row["t"] - prev["t"]))
        c.plot(xs, [y * 100 for y in ys], label=name)
    c.set(xlabel="seconds", ylabel="% of one core", title="CPU per process")
    c.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---------------------------------------------------------------------- main


async def _cancel_on_sigterm(work: Any, *args: Any, **kwargs: Any) -> Any:
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    return await work(*args, **kwargs)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--start-rate", type=float, default=400.0, help="sessions per second")
    parser.add_argument("--result-rate", type=float, default=50.0, help="results per second")
    parser.add_argument(
        "--max-pending", type=int, default=50, help="results written, session not stopped yet"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=_smoke.RESULTS,
        metavar="DIR",
        help="where scale.json and scale.png go",
    )
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="FILE",
        help="run the engine under cProfile and write its stats (pstats) to FILE",
    )
    parser.add_argument("--child-engine", metavar="SPEC", help=argparse.SUPPRESS)
    args = _smoke.parse(parser, argv, sessions=20, start_rate=200.0, max_pending=10)
    logging.basicConfig(level=logging.WARNING)
    if args.child_engine:
        spec = json.loads(args.child_engine)
        # CPU time, not wall time: a shared machine's waits do not count
        profile = cProfile.Profile(time.process_time) if spec.get("profile") else None
        with contextlib.suppress(asyncio.CancelledError):  # stopped by the bench: quietly
            if profile is not None:
                profile.enable()
            try:
                asyncio.run(_cancel_on_sigterm(engine_child, spec))
            finally:
                if profile is not None:
                    profile.disable()
                    profile.dump_stats(spec["profile"])
        return
    # Ctrl-C and SIGTERM cancel the run, whose `finally` stops every child, even when started
    # in the background (where a shell leaves SIGINT ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        figures = asyncio.run(
            _cancel_on_sigterm(
                run,
                args.sessions,
                start_rate=args.start_rate,
                result_rate=args.result_rate,
                max_pending=args.max_pending,
                quiet=args.quiet,
                profile=args.profile,
            )
        )
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("[scale] interrupted; every child process stopped", file=sys.stderr)
        sys.exit(130)
    public = {k: v for k, v in figures.items() if not k.startswith("_")}
    args.out.mkdir(parents=True, exist_ok=True)
    plot(figures, args.out / "scale.png")
    (args.out / "scale.json").write_text(json.dumps(public, indent=2) + "\n")
    print(json.dumps(public, indent=2))


if __name__ == "__main__":
    main()
