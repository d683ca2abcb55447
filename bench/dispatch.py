"""Dispatch benchmark on the embedded stack: 256 rollouts of a trivial agent per start rate.

For each configured start rate (default 6.67/s, AgentCore's published 400 new sessions a
minute, and 25/s) it prints, under `by_rate`: the achieved start rate as a fraction of the
configured one (the emulator, a process of its own with in-process agents, does not throttle);
the time from a result's S3 write to the buffer having it (`write_to_handoff_s`) and to the
caller having the outcome (`write_to_caller_s`), p50/p99; and the S3 + SQS calls per rollout
(GetObject, ReceiveMessage, DeleteMessageBatch, ...) with `calls_by_action`. Results arrive at
about the start rate, so this is the "moderate traffic" case for the buffer's receive and
delete batching.

Under `by_endpoints`, for 1, 2 and 4 endpoints of one runtime (`local.endpoints`), each with
the emulator's per-endpoint quota (AgentCore's 400 new sessions a minute) and the engine's
per-endpoint start rate matching it (6.67/s), `--per-endpoint` rollouts each: the achieved
start rate (the spread of the accepted invocations' send times) as a fraction of the sum
configured, and the starts by endpoint. On 2 busy cores the event loop, not the dispatcher, is
what falls behind: compare runs made under the same load. Writes bench/results/dispatch.json
and dispatch.png.

    python bench/dispatch.py [--n 256] [--rates 6.67 25] [--endpoints 1 2 4] [--mode in_process]
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dataclasses import asdict  # noqa: E402

from agentcore_rollout import RolloutBatch, RolloutEngine, RolloutRequest  # noqa: E402
from agentcore_rollout._agentcore import NEW_SESSIONS_PER_MINUTE  # noqa: E402
from agentcore_rollout.config import LocalConfig  # noqa: E402
from agentcore_rollout.local.stack import LocalStack  # noqa: E402


async def _batch(stack_cfg: LocalConfig, n: int, rate: float) -> tuple[RolloutBatch, float]:
    """`n` rollouts of the toy agent on a local stack, the engine starting `rate` a second (per
    endpoint); the batch and its wall time."""
    async with LocalStack(stack_cfg) as stack:
        cfg = stack.engine_config(
            exp_id="bench",
            dispatch={"start_rate": rate, "session_start_time": 1.0, "max_live_sessions": n},
            limits={"rollout_timeout": 120},
            results={"wait_time": 20},
        )
        requests = [RolloutRequest({"a": i, "b": 1}, input_id=f"q{i}") for i in range(n)]
        async with RolloutEngine(cfg) as engine:
            began = time.monotonic()
            batch = await engine.rollout(requests)
            return batch, time.monotonic() - began


async def run(n: int, rate: float, mode: str) -> dict:
    stack_cfg = LocalConfig(app="tests.agents.basic:app", mode=mode, bucket="bench", queue="bench")
    batch, wall = await _batch(stack_cfg, n, rate)
    starts = sorted(o.started_at for o in batch.outcomes if o.started_at is not None)
    ok = batch.ok
    handoff = [o.delivered_at - o.result.timings.finished for o in ok]
    to_caller = [o.finished_at - o.result.timings.finished for o in ok]
    s3_sqs = {k: v for k, v in batch.api_calls.items() if k.startswith(("s3:", "sqs:"))}
    span = starts[-1] - starts[0]
    achieved = (len(starts) - 1) / span if span > 0 else float("nan")
    figures = {
        "rollouts": n,
        "outcomes": batch.counts,
        "configured_start_rate": rate,
        "achieved_start_rate": round(achieved, 3),
        "start_rate_fraction": round(achieved / rate, 4),
        "throttled": batch.stats.throttles,
        "write_to_handoff_s": {k: round(v, 4) for k, v in _quantiles(handoff).items()},
        "write_to_caller_s": {k: round(v, 4) for k, v in _quantiles(to_caller).items()},
        "s3_sqs_calls_per_rollout": round(sum(s3_sqs.values()) / n, 3),
        "calls_by_action": s3_sqs,
        "rollout_latency_s": {k: round(v, 3) for k, v in batch.latency().items()},
        "wall_time_s": round(wall, 3),
        "api_calls_per_rollout": round(sum(batch.api_calls.values()) / n, 3),
        "api_calls": batch.api_calls,
        "engine": asdict(batch.stats),
        "mode": mode,
    }
    series = {"starts": [s - starts[0] for s in starts], "to_caller": to_caller}
    return figures | {"_series": series}


async def run_endpoints(k: int, per_endpoint: int, mode: str) -> dict:
    """`k` endpoints at AgentCore's per-endpoint quota, the engine at the matching rate."""
    rate = NEW_SESSIONS_PER_MINUTE / 60
    stack_cfg = LocalConfig(
        app="tests.agents.basic:app",
        mode=mode,
        bucket="bench",
        queue="bench",
        endpoints=k,
        new_sessions_per_minute=NEW_SESSIONS_PER_MINUTE,
    )
    n = k * per_endpoint
    batch, _ = await _batch(stack_cfg, n, rate)
    starts = sorted(o.started_at for o in batch.outcomes if o.started_at is not None)
    span = starts[-1] - starts[0]
    achieved = (len(starts) - 1) / span if span > 0 else float("nan")
    return {
        "endpoints": k,
        "rollouts": n,
        "outcomes": batch.counts,
        "configured_start_rate": round(k * rate, 3),
        "achieved_start_rate": round(achieved, 3),
        "start_rate_fraction": round(achieved / (k * rate), 4),
        "throttled": batch.stats.throttles,
        "starts_by_endpoint": {
            name.rsplit("#", 1)[-1]: count for name, count in batch.stats.starts_by_endpoint.items()
        },
        "mode": mode,
        "_series": {"starts": [s - starts[0] for s in starts]},
    }


def _quantiles(values: list[float]) -> dict[str, float]:
    """Nearest rank."""
    ordered = sorted(values)
    return {f"p{q}": ordered[max(0, math.ceil(len(ordered) * q / 100) - 1)] for q in (50, 99)}


def plot(by_rate: dict[str, dict], by_endpoints: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b, c) = plt.subplots(1, 3, figsize=(16, 4))
    for k, figures in by_endpoints.items():
        starts = figures["_series"]["starts"]
        (line,) = c.plot(starts, range(1, len(starts) + 1), label=f"{k} endpoint(s)")
        configured = figures["configured_start_rate"]
        c.plot([0, starts[-1]], [1, 1 + configured * starts[-1]], "--", color=line.get_color())
    c.set(xlabel="seconds", ylabel="sessions", title="Starts with K endpoints (-- configured)")
    c.legend()
    for rate, figures in by_rate.items():
        starts = figures["_series"]["starts"]
        (line,) = a.plot(starts, range(1, len(starts) + 1), label=f"started, {rate}/s")
        a.plot(
            [0, starts[-1]],
            [1, 1 + float(rate) * starts[-1]],
            "--",
            color=line.get_color(),
            label=f"configured {rate}/s",
        )
        ms = sorted(h * 1000 for h in figures["_series"]["to_caller"])
        b.plot(ms, [(i + 1) / len(ms) for i in range(len(ms))], label=f"{rate}/s")
    a.set(xlabel="seconds", ylabel="sessions", title="Session starts vs configured rate")
    a.legend()
    b.set(xlabel="ms", ylabel="fraction of results", title="S3 write -> caller (CDF)")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--rates", type=float, nargs="*", default=[6.67, 25.0])
    parser.add_argument("--endpoints", type=int, nargs="*", default=[1, 2, 4])
    parser.add_argument("--per-endpoint", type=int, default=40, help="rollouts per endpoint")
    parser.add_argument("--mode", default="in_process", choices=["in_process", "process"])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    by_rate = {f"{rate:g}": asyncio.run(run(args.n, rate, args.mode)) for rate in args.rates}
    by_endpoints = {
        str(k): asyncio.run(run_endpoints(k, args.per_endpoint, args.mode)) for k in args.endpoints
    }
    args.out.mkdir(parents=True, exist_ok=True)
    plot(by_rate, by_endpoints, args.out / "dispatch.png")
    public = {
        name: {
            key: {k: v for k, v in f.items() if not k.startswith("_")} for key, f in runs.items()
        }
        for name, runs in (("by_rate", by_rate), ("by_endpoints", by_endpoints))
    }
    (args.out / "dispatch.json").write_text(json.dumps(public, indent=2) + "\n")
    print(json.dumps(public, indent=2))


if __name__ == "__main__":
    main()
