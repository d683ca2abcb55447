"""What OpenTelemetry tracing costs the gateway: its CPU per turn and turn latency, off vs on.

Prints JSON and writes bench/results/tracing.json and tracing.png. Two gateways run, each in its
own process, in front of bench/gateway.py's instant backend with the Hugging Face renderer (the
test fixture tokenizer): `off` without OpenTelemetry configured, `on` with
`OTEL_EXPORTER_OTLP_ENDPOINT` set, so it makes a `gateway.turn` span per turn and exports them
with the SDK's BatchSpanProcessor (its defaults: 5 s or 512 spans a batch) over OTLP/HTTP to an
aiohttp receiver of POST /v1/traces in a third process, which decodes every batch and counts
the spans by name. The conversations are bench/gateway.py part 2's (about 250 prompt tokens a
turn, tools, 8 turns), `--sessions` concurrent, closed-loop, `--groups` groups a round; the
arms alternate for `--rounds` rounds.

The gateway's CPU is its utime + stime (/proc) from before a round's first turn until after
its spans reached the receiver, so the export thread's work is in it (the up to 5 s it idles
meanwhile costs nothing measurable: no clock tick in 10 s idle); `latency_ms` is each
turn's as the client saw it. Each round checks the receiver got one `gateway.turn` per `on`
turn and nothing else, and nothing from `off`. The gateway's binding limit is its one core,
so its CPU per turn is the figure that matters.

    python bench/tracing.py [--sessions 8] [--turns 8] [--groups 8] [--rounds 5] [--smoke]

`--smoke` (CI's) runs 2 sessions x 2 turns, one round, the batch processor exporting every 0.5 s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import secrets
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agentcore_rollout.gateway import GatewayAdmin  # noqa: E402
from agentcore_rollout.serving.process import ServiceProcess  # noqa: E402
from bench import _smoke  # noqa: E402
from bench.gateway import (  # noqa: E402
    SAMPLING,
    TOKENIZER_DIR,
    TOOLS,
    cpu_seconds,
    drive,
    long_conversation,
    pct,
    ratio,
    start_gateway,
    start_instant,
)

ARMS = ("off", "on")
SPAN = "gateway.turn"
EXPORT_DELAY_S = 5.0  # the batch processor's default schedule delay
EXPORT_WAIT_S = 30.0  # the batch processor exports every 5 s: a receiver this late is broken


# -- the receiver ---------------------------------------------------------------------------------


def serve_collector() -> None:
    """An OTLP/HTTP trace receiver: POST /v1/traces decoded and its spans counted by name,
    GET /counts answers them (in its own process, so its CPU is not the gateway's)."""
    import gzip

    from aiohttp import web
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
        ExportTraceServiceResponse,
    )

    from agentcore_rollout.serving.process import exit_with_parent

    counts: dict[str, int] = {}
    answer = ExportTraceServiceResponse().SerializeToString()

    async def export(request: web.Request) -> web.Response:
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        for resource in ExportTraceServiceRequest.FromString(body).resource_spans:
            for scope in resource.scope_spans:
                for span in scope.spans:
                    counts[span.name] = counts.get(span.name, 0) + 1
        return web.Response(body=answer, content_type="application/x-protobuf")

    async def counted(request: web.Request) -> web.Response:
        return web.json_response(counts)

    async def main() -> None:
        app = web.Application()
        app.add_routes([web.post("/v1/traces", export), web.get("/counts", counted)])
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        print(f"http://127.0.0.1:{runner.addresses[0][1]}", flush=True)
        await asyncio.Event().wait()

    exit_with_parent()
    asyncio.run(main())


async def spans_received(http: aiohttp.ClientSession, url: str, expected: int) -> dict[str, int]:
    """The receiver's counts once it holds `expected` gateway.turn spans (or the wait ran out)."""
    deadline = time.monotonic() + EXPORT_WAIT_S
    while True:
        async with http.get(f"{url}/counts") as response:
            counts: dict[str, int] = await response.json()
        if counts.get(SPAN, 0) >= expected or time.monotonic() > deadline:
            return counts
        await asyncio.sleep(0.05)


# -- the runs -------------------------------------------------------------------------------------


async def arm_round(
    http: aiohttp.ClientSession,
    gateway: ServiceProcess,
    admin: GatewayAdmin,
    shape: tuple[int, int, int],
    settled: Callable[[], Awaitable[dict[str, int]]],
) -> tuple[float, list[float], dict[str, int]]:
    """`groups` groups of `sessions` concurrent `turns`-turn conversations, one group after
    another: the gateway's CPU seconds from the first turn until `settled` (its spans in) and
    the turns' latencies. The sessions are made before the clock and finished after it."""
    sessions, turns, groups = shape
    assert gateway.pid is not None
    created = [
        await admin.create_session(f"trace-{i}", sampling=SAMPLING)
        for i in range(sessions * groups)
    ]
    keys: list[str | None] = [s.api_key for s in created]
    url = f"{gateway.url}/v1/chat/completions"
    latencies: list[float] = []
    before = cpu_seconds(gateway.pid)
    for g in range(groups):
        group = keys[g * sessions : (g + 1) * sessions]
        latencies += await drive(http, url, group, turns, long_conversation, {"tools": TOOLS})
    counts = await settled()
    used = cpu_seconds(gateway.pid) - before
    for s in created:
        trace = await admin.finish_session(s.session_id)
        assert trace["num_turns"] == turns, trace["num_turns"]
    return used, latencies, counts


async def measure(
    sessions: int, turns: int, groups: int, rounds: int, delay_s: float = EXPORT_DELAY_S
) -> dict[str, Any]:
    """Start the receiver, the instant backend and the two gateways, `on` exporting every
    `delay_s`; run the rounds."""
    for name in [n for n in os.environ if n.startswith("OTEL_")]:
        os.environ.pop(name)  # `off` means not configured, whatever this shell says
    token = secrets.token_urlsafe(32)
    collector = ServiceProcess(
        "collector", "bench.tracing", "--serve-collector", env={"PYTHONPATH": str(ROOT)}
    )
    backend = start_instant()
    gateways: dict[str, ServiceProcess] = {}
    try:
        collector.start()
        gateways["off"] = start_gateway(backend.url, str(TOKENIZER_DIR), token)
        otel = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url,
            "OTEL_BSP_SCHEDULE_DELAY": str(round(delay_s * 1000)),
        }
        os.environ.update(otel)  # inherited by this child only
        try:
            gateways["on"] = start_gateway(backend.url, str(TOKENIZER_DIR), token)
        finally:
            for name in otel:
                os.environ.pop(name)
        shape = (sessions, turns, groups)
        return await run_rounds(gateways, collector.url, token, shape, rounds, delay_s)
    finally:
        for process in [*gateways.values(), backend, collector]:
            process.stop()


async def run_rounds(
    gateways: dict[str, ServiceProcess],
    collector_url: str,
    token: str,
    shape: tuple[int, int, int],
    rounds: int,
    delay_s: float,
) -> dict[str, Any]:
    """Warm both gateways up, then alternate the arms; per round and arm the gateway's CPU ms
    per turn and the turns' latencies. After each, the receiver must hold one gateway.turn
    span per `on` turn so far and nothing else."""
    per_round = shape[0] * shape[1] * shape[2]
    cpu: dict[str, list[float]] = {arm: [] for arm in ARMS}
    latency: dict[str, list[list[float]]] = {arm: [] for arm in ARMS}
    expected = 0
    async with contextlib.AsyncExitStack() as stack:
        http = await stack.enter_async_context(
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        )
        admins = {
            arm: await stack.enter_async_context(GatewayAdmin(g.urls[1], token))
            for arm, g in gateways.items()
        }
        for round_ in range(rounds + 1):  # round 0 warms up
            for arm in ARMS:
                expected += per_round if arm == "on" else 0
                settled = functools.partial(spans_received, http, collector_url, expected)
                used, took, counts = await arm_round(
                    http, gateways[arm], admins[arm], shape, settled
                )
                assert counts == ({SPAN: expected} if expected else {}), (arm, counts, expected)
                if round_:
                    cpu[arm].append(used * 1000 / per_round)
                    latency[arm].append(took)
        await asyncio.sleep(delay_s + 0.5)  # a late batch from either would be in by now
        counts = await spans_received(http, collector_url, expected)
        assert counts == {SPAN: expected}, (counts, expected)
    return summary(cpu, latency, counts, shape, rounds)


def spread(values: list[float]) -> dict[str, float]:
    """The median of the rounds' values and their range."""
    return {
        "median": round(float(np.median(values)), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def summary(
    cpu: dict[str, list[float]],
    latency: dict[str, list[list[float]]],
    counts: dict[str, int],
    shape: tuple[int, int, int],
    rounds: int,
) -> dict[str, Any]:
    sessions, turns, groups = shape
    p50 = {arm: [pct(r)["p50"] for r in latency[arm]] for arm in ARMS}
    cpu_ms = {arm: spread(cpu[arm]) for arm in ARMS}
    added = cpu_ms["on"]["median"] - cpu_ms["off"]["median"]
    return {
        "setup": f"{sessions} concurrent sessions x {turns} turns, {groups} groups a round "
        f"({sessions * turns * groups} turns), {rounds} rounds alternating off/on after a "
        "warm-up; HF renderer (tests/fixtures/tokenizer) with tools, about 250 prompt tokens a "
        "turn, instant backend; on: OTEL_EXPORTER_OTLP_ENDPOINT set, the SDK's "
        "BatchSpanProcessor (defaults) exporting OTLP/HTTP to an aiohttp receiver in its own "
        "process; gateway utime+stime from the first turn until its spans were received",
        "turns_per_arm": sessions * turns * groups * rounds,
        "cpu_ms_per_turn": cpu_ms,
        "cpu_ms_per_turn_by_round": {arm: [round(v, 3) for v in cpu[arm]] for arm in ARMS},
        "cpu_added_ms_per_turn": round(added, 3),
        "cpu_ratio": ratio(cpu_ms["on"]["median"], cpu_ms["off"]["median"]),
        "latency_p50_ms": {arm: spread(p50[arm]) for arm in ARMS},
        "latency_ms": {arm: pct([x for r in latency[arm] for x in r]) for arm in ARMS},
        "spans_received": counts,
        "spans_per_on_turn": counts.get(SPAN, 0) / (sessions * turns * groups * (rounds + 1)),
    }


# -- the figure -----------------------------------------------------------------------------------


def plot(figures: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
    panels = [
        ("cpu_ms_per_turn", "gateway CPU ms per turn", "%.3f"),
        ("latency_p50_ms", "turn latency p50, ms", "%.2f"),
    ]
    for ax, (key, label, fmt) in zip(axes, panels, strict=True):
        data = figures[key]
        mid = [data[arm]["median"] for arm in ARMS]
        err = [
            [m - data[arm]["min"] for m, arm in zip(mid, ARMS, strict=True)],
            [data[arm]["max"] - m for m, arm in zip(mid, ARMS, strict=True)],
        ]
        names = ["tracing off", "tracing on (OTLP)"]
        bars = ax.bar(names, mid, 0.5, yerr=err, capsize=6, color=["tab:grey", "tab:purple"])
        ax.bar_label(bars, fmt=fmt, label_type="center", color="white", fontsize=9)
        ax.set(ylabel=label, title=f"{label.split(',')[0]} (median, min-max of rounds)")
        ax.title.set_fontsize(9)
    times = f"{figures['cpu_ratio']:.2f}x" if figures["cpu_ratio"] else "-"
    fig.suptitle(
        f"OpenTelemetry on the gateway: +{figures['cpu_added_ms_per_turn']:.3f} ms CPU a turn "
        f"({times}), one span per turn received",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--groups", type=int, default=8, help="groups of sessions a round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=_smoke.RESULTS)
    parser.add_argument("--serve-collector", action="store_true", help=argparse.SUPPRESS)
    args = _smoke.parse(parser, sessions=2, turns=2, groups=1, rounds=1)
    if args.serve_collector:  # the receiver's own process
        serve_collector()
        return
    if min(args.sessions, args.turns, args.groups, args.rounds) < 1:
        parser.error("--sessions, --turns, --groups and --rounds must be at least 1")
    delay_s = 0.5 if args.smoke else EXPORT_DELAY_S
    figures = asyncio.run(measure(args.sessions, args.turns, args.groups, args.rounds, delay_s))
    args.out.mkdir(parents=True, exist_ok=True)
    plot(figures, args.out / "tracing.png")
    (args.out / "tracing.json").write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
