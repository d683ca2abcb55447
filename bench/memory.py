"""Memory benchmark: 100,000 requests through one engine, in steps like a training run.

The engine runs unchanged against moto (S3 + SQS with real bucket notifications, in its own
process); the sandbox is an in-process fast runtime whose "agent" writes its signed result with
the agent SDK's `ResultWriter` the moment it is invoked, so the benchmark spends its time in
the engine's own bookkeeping. Prints JSON with the engine process's RSS after 10k, 50k and
100k requests; writes bench/results/memory.json and memory.png.

    python bench/memory.py [--requests 100000] [--per-step 1000] [--smoke]

`--smoke` (CI's): 200 requests in steps of 100, into out/bench-smoke/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agentcore_rollout import EngineConfig, RolloutEngine, RolloutRequest  # noqa: E402
from agentcore_rollout.agent import ResultWriter  # noqa: E402
from agentcore_rollout.contract import RolloutResult, Timings, split_payload  # noqa: E402
from agentcore_rollout.local.moto import (  # noqa: E402
    LOCAL_CREDENTIALS,
    MotoServer,
    provision_results_channel,
)
from agentcore_rollout.runtimes.base import RuntimeLimits, SandboxRuntime  # noqa: E402
from bench import _smoke  # noqa: E402

CHECKPOINTS = (10_000, 50_000, 100_000)


class FastRuntime(SandboxRuntime):
    """A `SandboxRuntime` whose agent answers at once: one signed result per invocation."""

    def __init__(self) -> None:
        self.writer = ResultWriter()

    async def limits(self) -> RuntimeLimits:
        return RuntimeLimits(2000.0, 4000.0, 256, pool="fast", source="bench/memory.py")

    async def invoke(self, session_id: str, payload: bytes) -> None:
        user, control = split_payload(json.loads(payload))
        now = time.time()
        result = RolloutResult(
            exp_id=control.exp_id,
            step=control.step,
            request_id=control.request_id,
            input_id=control.input_id,
            session_id=session_id,
            status="ok",
            rewards=float(user["a"] % 2),
            timings=Timings(received=now, started=now, finished=now),
        )
        await self.writer.write(result, control)

    async def stop(self, session_id: str) -> None:
        return None


def rss_mb() -> float:
    """Resident set size now (not the peak), from /proc."""
    with open("/proc/self/statm") as f:
        resident_pages = int(f.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE") / 2**20


async def run(total: int, per_step: int) -> dict:
    with MotoServer() as moto:
        os.environ.update(
            LOCAL_CREDENTIALS | {"AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL_S3": moto.url}
        )
        channel = provision_results_channel(
            moto.client("s3"), moto.client("sqs"), bucket="memory", prefix="rollouts", queue="mem"
        )
        cfg = EngineConfig(
            exp_id="memory",
            bucket=channel.bucket,
            prefix=channel.prefix,
            queue_url=channel.queue_url,
            service_urls={"s3": moto.url, "sqs": moto.url},
            dispatch={"start_rate": 2000.0, "max_live_sessions": 256},
            results={"wait_time": 1},
        )
        runtime = FastRuntime()
        series: list[tuple[int, float]] = [(0, rss_mb())]
        done, began, counts = 0, time.monotonic(), {"ok": 0}
        async with RolloutEngine(cfg, runtimes=[runtime]) as engine:
            for step in range(-(-total // per_step)):
                engine.set_step(step)
                n = min(per_step, total - done)
                batch = await engine.rollout(
                    RolloutRequest({"a": done + i}, input_id=f"q{(done + i) // 8}")
                    for i in range(n)
                )
                for name, count in batch.counts.items():
                    counts[name] = counts.get(name, 0) + count
                done += n
                series.append((done, rss_mb()))
                print(f"{done} requests, {series[-1][1]:.1f} MB", file=sys.stderr, flush=True)
            tracked = engine.stats().tracked_requests
        await runtime.writer.close()
    wall = time.monotonic() - began
    at = dict(series)
    rss = {str(k): round(at[k], 1) for k in CHECKPOINTS if k in at}
    return {
        "requests": done,
        "requests_per_step": per_step,
        "outcomes": {k: v for k, v in counts.items() if v},
        "rss_mb": rss,
        "growth_mb_10k_to_100k": round(at[100_000] - at[10_000], 1) if len(rss) == 3 else None,
        "tracked_requests_at_end": tracked,
        "requests_per_s": round(done / wall, 1),
        "wall_time_s": round(wall, 1),
        "_series": series,
    }


def plot(figures: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done, rss = zip(*figures["_series"], strict=True)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(done, rss)
    ax.set(
        xlabel="requests ended",
        ylabel="engine RSS (MB)",
        title=f"Engine memory, {figures['requests_per_step']} requests per step",
        ylim=(0, max(rss) * 1.2),
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--per-step", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=_smoke.RESULTS)
    args = _smoke.parse(parser, requests=200, per_step=100)
    logging.basicConfig(level=logging.WARNING)
    figures = asyncio.run(run(args.requests, args.per_step))
    args.out.mkdir(parents=True, exist_ok=True)
    plot(figures, args.out / "memory.png")
    public = {k: v for k, v in figures.items() if not k.startswith("_")}
    (args.out / "memory.json").write_text(json.dumps(public, indent=2) + "\n")
    print(json.dumps(public, indent=2))


if __name__ == "__main__":
    main()
