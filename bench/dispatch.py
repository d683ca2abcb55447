"""Dispatch benchmark on the embedded stack: 256 rollouts of a trivial agent.

Prints JSON: the achieved session start rate as a fraction of the configured rate (the
emulator, a process of its own with in-process agents, does not throttle), and the time from
a result's S3 write to the engine's hand-off (p50/p99). Writes bench/results/dispatch.json
and dispatch.png.

    python bench/dispatch.py [--n 256] [--rate 25] [--mode in_process]
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

from agentcore_rollout import RolloutEngine, RolloutRequest  # noqa: E402
from agentcore_rollout.config import LocalConfig  # noqa: E402
from agentcore_rollout.local.stack import LocalStack  # noqa: E402


async def run(n: int, rate: float, mode: str) -> dict:
    stack_cfg = LocalConfig(app="tests.agents.basic:app", mode=mode, bucket="bench", queue="bench")
    async with LocalStack(stack_cfg) as stack:
        cfg = stack.engine_config(
            exp_id="bench",
            start_rate=rate,
            session_start_time=1.0,
            max_live_sessions=n,
            rollout_timeout=120,
            wait_time=20,
        )
        requests = [RolloutRequest({"a": i, "b": 1}, input_id=f"q{i}") for i in range(n)]
        async with RolloutEngine(cfg) as engine:
            began = time.monotonic()
            batch = await engine.rollout(requests)
            wall = time.monotonic() - began
    starts = sorted(o.started_at for o in batch.outcomes if o.started_at is not None)
    ok = batch.ok
    handoff = [o.delivered_at - o.result.timings.finished for o in ok]
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
        "rollout_latency_s": {k: round(v, 3) for k, v in batch.latency().items()},
        "wall_time_s": round(wall, 3),
        "api_calls_per_rollout": round(sum(batch.api_calls.values()) / n, 3),
        "api_calls": batch.api_calls,
        "engine": asdict(batch.stats),
        "mode": mode,
    }
    return figures | {"_series": {"starts": [s - starts[0] for s in starts], "handoff": handoff}}


def _quantiles(values: list[float]) -> dict[str, float]:
    """Nearest rank."""
    ordered = sorted(values)
    return {f"p{q}": ordered[max(0, math.ceil(len(ordered) * q / 100) - 1)] for q in (50, 99)}


def plot(figures: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = figures["_series"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    starts = series["starts"]
    a.plot(starts, range(1, len(starts) + 1), label="sessions started")
    a.plot(
        [0, starts[-1]],
        [1, 1 + figures["configured_start_rate"] * starts[-1]],
        "--",
        label="configured rate",
    )
    a.set(xlabel="seconds", ylabel="sessions", title="Session starts vs configured rate")
    a.legend()
    b.hist([h * 1000 for h in series["handoff"]], bins=40)
    b.set(xlabel="ms", ylabel="results", title="S3 write -> engine hand-off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--rate", type=float, default=25.0)
    parser.add_argument("--mode", default="in_process", choices=["in_process", "process"])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    figures = asyncio.run(run(args.n, args.rate, args.mode))
    args.out.mkdir(parents=True, exist_ok=True)
    plot(figures, args.out / "dispatch.png")
    public = {k: v for k, v in figures.items() if not k.startswith("_")}
    (args.out / "dispatch.json").write_text(json.dumps(public, indent=2) + "\n")
    print(json.dumps(public, indent=2))


if __name__ == "__main__":
    main()
