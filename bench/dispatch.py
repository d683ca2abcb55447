"""Dispatch benchmark on the embedded stack, the emulator enforcing AgentCore's published
quotas (per account and region: 25 new sessions/s, 1,000 data-plane calls/s) and telling them
through Service Quotas, as the engine reads them at start-up.

Under `by_rate`, 256 rollouts of a trivial agent per run: `quota` is the default run (no
`engine.dispatch.start_rate`: the engine starts sessions at the account's quota, read from the
emulator's Service Quotas), a number is that rate set in the config. For each: the achieved
start rate (the spread of the accepted invocations' send times) as a fraction of the rate in
force, the emulator's 429s (`throttled`, 0: never above the account's quota), the time from a
result's S3 write to the buffer having it (`write_to_handoff_s`) and to the caller having the
outcome (`write_to_caller_s`), p50/p99, and the S3 + SQS calls per rollout with
`calls_by_action`. Results arrive at about the start rate, so this is the "moderate traffic"
case for the buffer's receive and delete batching.

Under `by_spread`, `--per-spread` rollouts each over: one endpoint; two endpoints of one runtime
(one account: they share its 25/s); two runtimes in two accounts (each its own 25/s), on an
emulator of its own serving both. The achieved start rate against each account's quota summed,
and the starts by endpoint. On 2 busy cores the event loop, not the dispatcher, is what falls
behind: compare runs made under the same load. Writes bench/results/dispatch.json and
dispatch.png.

    python bench/dispatch.py [--n 256] [--rates quota 10] [--per-spread 200] [--mode in_process]
                             [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dataclasses import asdict  # noqa: E402

from agentcore_rollout import RolloutBatch, RolloutEngine, RolloutRequest  # noqa: E402
from agentcore_rollout.local.config import LocalConfig  # noqa: E402
from agentcore_rollout.local.stack import LOCAL_RUNTIME_ARN, LocalStack  # noqa: E402
from agentcore_rollout.runtimes.agentcore.published import (  # noqa: E402
    NEW_SESSIONS_PER_SECOND,
    active_sessions,
)
from agentcore_rollout.serving.process import ServiceProcess  # noqa: E402
from bench import _smoke  # noqa: E402

APP = "tests.agents.basic:app"
OTHER_ACCOUNT_ARN = LOCAL_RUNTIME_ARN.replace("000000000000", "111111111111")
SPREADS = {  # name: (runtime ARNs, endpoints of each)
    "1 endpoint": ((LOCAL_RUNTIME_ARN,), ("DEFAULT",)),
    "2 endpoints, 1 account": ((LOCAL_RUNTIME_ARN,), ("DEFAULT", "endpoint_2")),
    "2 accounts": ((LOCAL_RUNTIME_ARN, OTHER_ACCOUNT_ARN), ("DEFAULT",)),
}


async def _batch(
    mode: str, n: int, rate: float | None, spread: str = "1 endpoint"
) -> tuple[RolloutBatch, float]:
    """`n` rollouts of the toy agent on a local stack, the engine starting `rate` a second in
    each account (None: the account's quota, read from the emulator), over `spread`'s runtimes
    and endpoints; the batch and its wall time."""
    arns, qualifiers = SPREADS[spread]
    stack_cfg = LocalConfig(app=APP, mode=mode, bucket="bench", queue="bench")
    async with AsyncExitStack() as stack:
        local = await stack.enter_async_context(LocalStack(stack_cfg))
        config: dict[str, Any] = {
            "exp_id": "bench",
            "dispatch": {"start_rate": rate, "session_start_time": 1.0, "max_live_sessions": n},
            "limits": {"rollout_timeout": 120},
            "results": {"wait_time": 20},
        }
        if spread != "1 endpoint":
            url = await asyncio.to_thread(_emulator, local, arns, qualifiers, stack)
            runtimes = [{"arn": arn, "qualifier": q} for arn in arns for q in qualifiers]
            urls = {"s3": local.moto.url, "sqs": local.moto.url}
            config |= {"runtime_arn": None, "runtimes": runtimes}
            config["service_urls"] = urls | {"agentcore": url, "service_quotas": url}
        cfg = local.engine_config(**config)
        requests = [RolloutRequest({"a": i, "b": 1}, input_id=f"q{i}") for i in range(n)]
        async with RolloutEngine(cfg) as engine:
            began = time.monotonic()
            batch = await engine.rollout(requests)
            return batch, time.monotonic() - began


def _emulator(
    local: LocalStack, arns: tuple[str, ...], qualifiers: tuple[str, ...], stack: AsyncExitStack
) -> str:
    """An emulator of its own, with the stack's agents' environment, serving `arns`, each with
    `qualifiers`, at the published quotas."""
    emulator = ServiceProcess(
        "spread emulator",
        "agentcore_rollout.local.runtime",
        APP,
        "--mode",
        local.config.mode,
        *(arg for arn in arns for arg in ("--runtime-arn", arn)),
        *(arg for q in qualifiers for arg in ("--qualifier", q)),
        *("--max-sessions", str(active_sessions("us-east-1"))),  # its rates' defaults are too
        env=local.agent_env(),
    )
    url = emulator.start()
    stack.callback(emulator.stop)
    return url


def _achieved(batch: RolloutBatch) -> tuple[float, list[float]]:
    starts = sorted(o.started_at for o in batch.outcomes if o.started_at is not None)
    span = starts[-1] - starts[0]
    return (len(starts) - 1) / span if span > 0 else float("nan"), [s - starts[0] for s in starts]


async def run(n: int, rate: float | None, mode: str) -> dict:
    batch, wall = await _batch(mode, n, rate)
    achieved, starts = _achieved(batch)
    in_force = rate or batch.stats.pool_limits["000000000000:us-east-1/start_rate"]
    ok = batch.ok
    handoff = [o.delivered_at - o.result.timings.finished for o in ok]
    to_caller = [o.finished_at - o.result.timings.finished for o in ok]
    s3_sqs = {k: v for k, v in batch.api_calls.items() if k.startswith(("s3:", "sqs:"))}
    figures = {
        "rollouts": n,
        "outcomes": batch.counts,
        "configured_start_rate": rate,
        "start_rate_in_force": in_force,
        "achieved_start_rate": round(achieved, 3),
        "start_rate_fraction": round(achieved / in_force, 4),
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
    return figures | {"_series": {"starts": starts, "to_caller": to_caller}}


async def run_spread(spread: str, n: int, mode: str) -> dict:
    """`n` rollouts over `spread`, at the accounts' quotas (no rate configured)."""
    batch, _ = await _batch(mode, n, None, spread)
    achieved, starts = _achieved(batch)
    accounts = {arn.split(":")[4] for arn in SPREADS[spread][0]}
    quota = len(accounts) * NEW_SESSIONS_PER_SECOND
    return {
        "rollouts": n,
        "outcomes": batch.counts,
        "accounts": len(accounts),
        "endpoints": len(batch.stats.starts_by_endpoint),
        "quota_start_rate": quota,
        "start_rate_in_force": batch.stats.start_rate,
        "achieved_start_rate": round(achieved, 3),
        "start_rate_fraction": round(achieved / quota, 4),
        "throttled": batch.stats.throttles,
        "starts_by_endpoint": {
            name.split(":")[4] + "#" + name.rsplit("#", 1)[-1]: count
            for name, count in batch.stats.starts_by_endpoint.items()
        },
        "pool_limits": batch.stats.pool_limits,
        "mode": mode,
        "_series": {"starts": starts},
    }


def _quantiles(values: list[float]) -> dict[str, float]:
    """Nearest rank."""
    ordered = sorted(values)
    return {f"p{q}": ordered[max(0, math.ceil(len(ordered) * q / 100) - 1)] for q in (50, 99)}


def plot(by_rate: dict[str, dict], by_spread: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b, c) = plt.subplots(1, 3, figsize=(16, 4))
    for name, figures in by_rate.items():
        starts = figures["_series"]["starts"]
        rate = figures["start_rate_in_force"]
        (line,) = a.plot(starts, range(1, len(starts) + 1), label=f"started, {name}")
        a.plot([0, starts[-1]], [1, 1 + rate * starts[-1]], "--", color=line.get_color())
        ms = sorted(h * 1000 for h in figures["_series"]["to_caller"])
        b.plot(ms, [(i + 1) / len(ms) for i in range(len(ms))], label=name)
    a.set(xlabel="seconds", ylabel="sessions", title="Session starts (-- the rate in force)")
    a.legend()
    b.set(xlabel="ms", ylabel="fraction of results", title="S3 write -> caller (CDF)")
    b.legend()
    for name, figures in by_spread.items():
        starts = figures["_series"]["starts"]
        (line,) = c.plot(starts, range(1, len(starts) + 1), label=name)
        quota = figures["quota_start_rate"]
        c.plot([0, starts[-1]], [1, 1 + quota * starts[-1]], "--", color=line.get_color())
    c.set(xlabel="seconds", ylabel="sessions", title="Starts by spread (-- accounts x 25/s)")
    c.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument(
        "--rates", nargs="*", default=["quota", "10"], help="`quota` (none set) or sessions/s"
    )
    parser.add_argument("--spreads", nargs="*", default=list(SPREADS), choices=list(SPREADS))
    parser.add_argument("--per-spread", type=int, default=200, help="rollouts per spread")
    parser.add_argument("--mode", default="in_process", choices=["in_process", "process"])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = _smoke.parse(parser, n=8, rates=["quota"], spreads=["2 accounts"], per_spread=8)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("agentcore_rollout.engine").setLevel(logging.INFO)  # the quotas in force
    by_rate = {
        name: asyncio.run(run(args.n, None if name == "quota" else float(name), args.mode))
        for name in args.rates
    }
    by_spread = {
        name: asyncio.run(run_spread(name, args.per_spread, args.mode)) for name in args.spreads
    }
    args.out.mkdir(parents=True, exist_ok=True)
    plot(by_rate, by_spread, args.out / "dispatch.png")
    public = {
        name: {
            key: {k: v for k, v in f.items() if not k.startswith("_")} for key, f in runs.items()
        }
        for name, runs in (("by_rate", by_rate), ("by_spread", by_spread))
    }
    (args.out / "dispatch.json").write_text(json.dumps(public, indent=2) + "\n")
    print(json.dumps(public, indent=2))


if __name__ == "__main__":
    main()
