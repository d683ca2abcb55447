"""Warm sessions (`RolloutEngine.warm`) against cold starts, in synchronous RL steps on the
embedded stack, the emulator enforcing AgentCore's published quotas per account: 25 new
sessions/s, 1,000 data-plane calls/s (and 5,000 active sessions: the trainer's step and the
next one's warm sessions fit).

Each config is N rollouts a step (256, 512, 2,048) at a cold start (2 s, 15 s: the emulator's
`cold_start`, added to each session's first invocation), over `--steps` steps with a trainer
update of `--update` seconds (60) between them. A rollout's duration is drawn lognormal,
median 3 s, log-sd 1, capped at 30 s (seeded by N and step, so both cold-start values see the
same durations; the agent, `tests.agents.basic`, sleeps that long and answers). Step 1 is
cold: no session is warm, each rollout's session is created by its own invocation, at the
new-session quota. At each step's start the bench asks, as `train` does, for the next step's
N sessions, `engine.warm(N, step=next)`, and the engine times them (`WarmPlan`): ready as the
next step begins, by its expected start less their lead time, `N / 25 + session_start_time +
margin`. Step 2's warm-ups start when asked, behind step 1's own starts (nothing measured yet:
no update seen); from step 3 they start one measured rollout run and update after the step
before's start, less their lead, or at once where the lead exceeds that (N = 2,048: 82 s of
new sessions > 60 s). Three steps (`--steps`). Warm steps' rollouts each take a parked warm
session: one call at the data-plane rate, no new session.

Per step:
- `makespan_s`: from the step's submission to its last outcome (`engine.rollout` returning).
- `limit_s`: the makespan were every rollout started at the step's start, its invocations at
  the data-plane rate in the order submitted (request i at i / call_rate), no cold start to
  wait for (warm sessions' already paid) and results arriving at once:
  `max_i (i / call_rate + d_i)`, computed from the durations drawn. The target: warm
  makespan within 1.05x of it. `limit_any_order_s` is the same with the longest invoked
  first, `max_k (k / call_rate + d_(k))`, which no order beats (a trainer does not know the
  durations ahead; at 1,000 calls/s the two differ by at most N / 1,000 s).
- `cold_bound_s`: the same with every session created at the new-session quota in the order
  submitted and each waiting out the cold start, `max_i (i / start_rate + cold_start + d_i)`:
  what a cold step cannot beat.
- `idle_session_s`: the seconds warm sessions waited parked for their rollouts, summed
  (`EngineStats.warm_idle_seconds`: from a warm-up's answer to its rollout's invocation);
  0 for a cold step, whose sessions are created by their rollouts. The target: per rollout,
  under the update time.
- `api_calls`: the engine's AWS calls by action from the step's start to the next step's
  start (the next step's warm-ups and this one's stops included), the last step's until its
  sessions are stopped; `agentcore_calls_per_rollout`: the step's own InvokeAgentRuntime and
  StopRuntimeSession calls a rollout, its warm-ups counted with it (a cold rollout: invoke
  and stop, 2; a warm one: warm-up, invoke and stop, 3).
- `achieved_start_rate`: sessions a step's rollouts created a second, over their spread; for
  a warm step, `warm.achieved_warm_up_rate`, its warm-ups' (sampled every 0.1 s from the
  `warm()` call: a previous call's late warm-ups count too, as in `ready_by_next_step`;
  `parked_at_start` is exact): against the quota, whether the emulator and the engine kept up
  on this machine.

`--scale k` runs it time-scaled: durations, cold starts, the update, the idle timeouts and the
engine's time settings divided by k, the emulator's rates multiplied by k, so every ratio is
the same; the figures are reported in the service's seconds (measured x k) and the JSON says
`scale`. The achieved start rate says whether the machine kept up at the scaled rates.
`--smoke`: N = 16, one cold start, scale 20 (seconds), into out/bench-smoke/.

    python bench/warm.py [--n 256 512 2048] [--cold-starts 2 15] [--update 60] [--steps 3]
                         [--scale 1] [--smoke] [--out bench/results]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dataclasses import asdict  # noqa: E402

from agentcore_rollout import RolloutBatch, RolloutEngine, RolloutRequest  # noqa: E402
from agentcore_rollout._engine.warming import lead_time  # noqa: E402
from agentcore_rollout._stats import EngineStats  # noqa: E402
from agentcore_rollout.local.config import LocalConfig  # noqa: E402
from agentcore_rollout.local.stack import LocalStack  # noqa: E402
from agentcore_rollout.runtimes.agentcore.published import (  # noqa: E402
    DATA_PLANE_TPS,
    IDLE_TIMEOUT_S,
    NEW_SESSIONS_PER_SECOND,
    active_sessions,
)

APP = "tests.agents.basic:app"  # sleeps `sleep` seconds, then answers
MEDIAN_S, SIGMA, CAP_S = 3.0, 1.0, 30.0
TARGET = 1.05
POOL = "000000000000:us-east-1"  # the local stack's account


def durations(n: int, step: int, seed: int = 0) -> list[float]:
    """The step's rollout durations (service seconds): lognormal, capped."""
    draws = random.Random(f"{seed}-{n}-{step}")
    return [min(CAP_S, MEDIAN_S * draws.lognormvariate(0.0, SIGMA)) for _ in range(n)]


def bound(
    ds: list[float], rate: float, delay: float = 0.0, *, longest_first: bool = False
) -> float:
    """`max_i (i / rate + delay + d_i)`: the earliest the last rollout can end with the
    invocations `1 / rate` apart in the order given (`longest_first`: the best order), each
    rollout running `delay` after its invocation before its own `d_i`."""
    order = sorted(ds, reverse=True) if longest_first else ds
    return max(i / rate + delay + d for i, d in enumerate(order))


def limits(
    makespan: float, n: int, step: int, call_rate: float, start_rate: float, cold_start: float
) -> dict[str, float]:
    """A step's limits (service seconds) and its makespan over them, from its durations."""
    ds = durations(n, step)
    limit = bound(ds, call_rate)
    any_order = bound(ds, call_rate, longest_first=True)
    return {
        "limit_s": round(limit, 2),
        "makespan_over_limit": round(makespan / limit, 4),
        "limit_any_order_s": round(any_order, 2),
        "makespan_over_limit_any_order": round(makespan / any_order, 4),
        "cold_bound_s": round(bound(ds, start_rate, cold_start), 2),
    }


def _calls(stats: EngineStats) -> dict[str, int]:
    return {k: v for k, v in sorted(stats.api_calls.items()) if v}


def _last(batch: RolloutBatch, ds: list[float], began: float, k: float) -> dict[str, float]:
    """Where the step's last outcome's time went (service seconds): its invocation's offset
    from the step's start, its drawn duration, when its agent had it and how long it ran, and
    from its agent's result to the engine's outcome (the S3 write, the notification, the
    receive, the read)."""
    i, last = max(enumerate(batch.outcomes), key=lambda io: io[1].finished_at)
    timings = last.result.timings if last.result is not None else None
    return {
        "started_after_s": round(((last.started_at or began) - began) * k, 2),
        "duration_s": round(ds[i], 2),
        "agent_received_after_s": round((timings.received - began) * k, 2)
        if timings is not None
        else math.nan,
        "agent_ran_s": round((timings.finished - timings.received) * k, 2)
        if timings is not None
        else math.nan,
        "result_to_outcome_s": round((last.finished_at - timings.finished) * k, 2)
        if timings is not None
        else math.nan,
    }


def _rate(times: list[float]) -> float | None:
    """Events a second over their spread (None: fewer than two)."""
    times = sorted(times)
    span = times[-1] - times[0] if len(times) > 1 else 0.0
    return (len(times) - 1) / span if span > 0 else None


def _new_seen(engine: RolloutEngine) -> dict[str, Any]:
    return {"base": engine.stats().warm_started, "started": 0, "first": None, "last": None}


def _poll_warm_ups(engine: RolloutEngine, seen: dict[str, Any]) -> None:
    started = engine.stats().warm_started - seen["base"]
    if started > seen["started"]:
        seen["first"] = seen["first"] or time.time()
        seen["started"], seen["last"] = started, time.time()


async def _watch_warm_ups(engine: RolloutEngine, seen: dict[str, Any]) -> None:
    """When the warm-ups were answered (the engine's `warm_started` counter, sampled): the
    first and the latest, and how many."""
    while True:
        _poll_warm_ups(engine, seen)
        await asyncio.sleep(0.1)


async def _until(predicate: Any, every: float = 0.05) -> None:
    while not predicate():  # noqa: ASYNC110 (the engine's gauges, not events)
        await asyncio.sleep(every)


async def run_config(
    n: int, cold_start: float, *, update: float, steps: int, scale: float
) -> dict[str, Any]:
    """One stack, one engine: synchronous steps of `n` rollouts, each asking for the next
    one's sessions at its start."""
    k = scale
    session_start_time = cold_start + 2.0
    lead = lead_time(n, NEW_SESSIONS_PER_SECOND, session_start_time)
    local = LocalConfig(
        app=APP,
        mode="in_process",
        bucket="bench-warm",
        queue="bench-warm",
        cold_start=cold_start / k,
        new_sessions_per_second=NEW_SESSIONS_PER_SECOND * k,
        data_plane_tps=DATA_PLANE_TPS * k,
        max_sessions=active_sessions("us-east-1"),
        idle_timeout=IDLE_TIMEOUT_S / k,
        gateway=False,
        policy_workers=1,
    )
    async with LocalStack(local) as stack:
        cfg = stack.engine_config(
            exp_id=f"warm-{n}-{cold_start:g}",
            dispatch={
                "warm": "auto",
                "warm_max_idle": 600.0 / k,
                # Starts in flight are bounded by rate x this (Little's law): at a 15 s cold
                # start the default 2 s would hold the engine to 50 / 15 = 3.3 starts a second.
                "session_start_time": session_start_time / k,
                "backoff_base": 0.2 / k,
                "backoff_max": 20.0 / k,
            },
            limits={"rollout_timeout": (CAP_S + 120.0) / k},
            results={"wait_time": 20},
        )
        async with RolloutEngine(cfg) as engine:
            pool = engine.stats().pool_limits
            start_rate = pool[f"{POOL}/start_rate"] / k  # service units
            call_rate = pool[f"{POOL}/call_rate"] / k
            out: list[dict[str, Any]] = []
            seen = _new_seen(engine)
            watcher: asyncio.Task[None] | None = None
            warmed_for_this = 0
            for step in range(steps):
                engine.set_step(step)
                ds = durations(n, step)
                reqs = [
                    RolloutRequest({"a": i, "b": 1, "sleep": d / k}, input_id=f"s{step}q{i}")
                    for i, d in enumerate(ds)
                ]
                before, began = engine.stats(), time.monotonic()
                began_unix = time.time()
                if watcher is not None:  # the warm-ups made for this step: when they were ready
                    watcher.cancel()
                    _poll_warm_ups(engine, seen)
                    ready = _ready(seen, began_unix, k)
                seen = _new_seen(engine)
                handles = [engine.submit(r) for r in reqs]
                if step + 1 < steps:  # as `train`: the next step's, timed by the engine
                    engine.warm(n, step=step + 1)
                    watcher = asyncio.create_task(_watch_warm_ups(engine, seen))
                outcomes = [await h for h in handles]
                makespan = time.monotonic() - began
                after = engine.stats()
                batch = RolloutBatch(step, outcomes, after.since(before), makespan)
                if step + 1 < steps:  # the trainer's update
                    await asyncio.sleep(update / k)
                else:  # the last step's stops
                    await _until(lambda: engine.stats().live_sessions == 0)
                cycle = engine.stats().since(before)
                step_stats = after.since(before)
                on_warm = [o for o in batch.outcomes if "-warm-" in o.session_id]
                starts = [o.started_at for o in batch.outcomes if o.started_at is not None]
                cold_starts = [
                    o.started_at
                    for o in batch.outcomes
                    if o.started_at is not None and "-warm-" not in o.session_id
                ]
                rate = _rate(cold_starts)
                # The step's own AgentCore calls: its rollouts' invocations and stops, and the
                # warm-ups made for it (the cycle's warm-ups are the next step's).
                agentcore = cycle.invokes + cycle.stops - cycle.warm_started + warmed_for_this
                warmed_for_this = cycle.warm_started
                figures = {
                    "step": step + 1,
                    "kind": "warm" if on_warm else "cold",
                    "rollouts": n,
                    "outcomes": batch.counts,
                    "on_warm_sessions": len(on_warm),
                    "makespan_s": round(makespan * k, 2),
                    **limits(makespan * k, n, step, call_rate, start_rate, cold_start),
                    "max_duration_s": round(max(ds), 2),
                    "last_start_after_s": round((max(starts) - began_unix) * k, 2),
                    "invocation_rate_achieved": round(_rate(starts) / k, 1)
                    if _rate(starts)
                    else None,
                    "last_outcome": _last(batch, ds, began_unix, k),
                    "achieved_start_rate": round(rate / k, 2) if rate else None,
                    "start_rate_quota": start_rate,
                    "idle_session_s": round(step_stats.warm_idle_seconds * k, 1),
                    "idle_session_s_per_rollout": round(step_stats.warm_idle_seconds * k / n, 2),
                    "warm": {
                        "used": step_stats.warm_used,
                        "missed": step_stats.warm_missed,
                        "parked_at_start": before.warm_parked,
                        "stopped_unused": cycle.warm_stopped,
                        **(ready if step else {}),
                    },
                    "throttles": cycle.throttles,
                    "invokes": cycle.invokes,
                    "stops": cycle.stops,
                    "agentcore_calls_per_rollout": round(agentcore / n, 3),
                    "api_calls": _calls(cycle),
                }
                out.append(figures)
            final = engine.stats()
    return {
        "rollouts": n,
        "cold_start_s": cold_start,
        "update_s": update,
        "lead_s": round(lead, 1),
        "call_rate": call_rate,
        "warm_asked_in": "the step before's start; started when the engine's WarmPlan says",
        "steps": out,
        "engine": {k2: v for k2, v in asdict(final).items() if k2.startswith("warm")},
    }


def _ready(seen: dict[str, Any], step_began: float, k: float) -> dict[str, Any]:
    """When a step's warm-ups were answered, in service seconds before it began (negative:
    after), and at what rate."""
    first, last = seen["first"], seen["last"]
    spread = last - first if first and last else 0.0  # sampled: 1 s at least
    rate = (seen["started"] - 1) / spread if spread >= 1.0 else 0
    return {
        "ready_by_step_start": seen["started"],
        "first_ready_before_start_s": round((step_began - first) * k, 1) if first else None,
        "last_ready_before_start_s": round((step_began - last) * k, 1) if last else None,
        "achieved_warm_up_rate": round(rate / k, 2) if rate else None,
    }


def plot(runs: list[dict[str, Any]], update: float, path: Path, scale: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
    colors = {}
    for cold_start in sorted({r["cold_start_s"] for r in runs}):
        mine = sorted(
            (r for r in runs if r["cold_start_s"] == cold_start), key=lambda r: r["rollouts"]
        )
        ns = [r["rollouts"] for r in mine]
        # step 1 cold, step 2 the first warm one (nothing measured yet), the last as timed
        for which, style, label in ((0, "--", "cold"), (1, ":", "first warm"), (-1, "-", "warm")):
            steps = [r["steps"][which] for r in mine]
            (line,) = a.plot(
                ns,
                [s["makespan_over_limit"] for s in steps],
                style,
                marker="o",
                color=colors.get(cold_start),
                label=f"{label}, cold start {cold_start:g} s",
            )
            colors[cold_start] = line.get_color()
            if which:
                b.plot(
                    ns,
                    [s["idle_session_s_per_rollout"] for s in steps],
                    style,
                    marker="o",
                    color=colors[cold_start],
                    label=f"{label}, cold start {cold_start:g} s",
                )
    a.axhline(TARGET, color="grey", lw=0.8, ls=":", label=f"target {TARGET}x")
    a.set(
        xscale="log",
        xlabel="rollouts a step (N)",
        ylabel="makespan / limit",
        title="Rollout phase over its limit (every rollout started at once)",
    )
    a.set_xticks([r["rollouts"] for r in runs], [str(r["rollouts"]) for r in runs])
    a.legend(fontsize=8)
    b.axhline(update, color="grey", lw=0.8, ls=":", label=f"trainer update {update:g} s")
    b.set(
        xscale="log",
        xlabel="rollouts a step (N)",
        ylabel="seconds",
        title="Warm sessions' idle session-seconds per rollout",
        ylim=(0, None),
    )
    b.set_xticks([r["rollouts"] for r in runs], [str(r["rollouts"]) for r in runs])
    b.legend(fontsize=8)
    from matplotlib.ticker import NullLocator

    for axes in (a, b):  # N's own ticks, no log-scale minor ones
        axes.xaxis.set_minor_locator(NullLocator())
    if scale != 1:
        fig.suptitle(f"time-scaled by {scale:g} (figures in the service's seconds)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def table(runs: list[dict[str, Any]]) -> str:
    """The docs' table, one row per config and step."""
    rows = [
        "| N | cold start | step | makespan | limit | makespan / limit | cold bound | idle "
        "session-s / rollout | AgentCore calls / rollout | new sessions/s achieved |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        for s in r["steps"]:
            rate = s["achieved_start_rate"] or s["warm"].get("achieved_warm_up_rate")
            rows.append(
                f"| {r['rollouts']:,} | {r['cold_start_s']:g} s | {s['step']} ({s['kind']}) | "
                f"{s['makespan_s']:.1f} s | {s['limit_s']:.1f} s | "
                f"{s['makespan_over_limit']:.3f} | {s['cold_bound_s']:.1f} s | "
                f"{s['idle_session_s_per_rollout']:.1f} | {s['agentcore_calls_per_rollout']:.2f} | "
                f"{f'{rate:.1f}/s' if rate else '-'} |"
            )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, nargs="*", default=[256, 512, 2048])
    parser.add_argument("--cold-starts", type=float, nargs="*", default=[2.0, 15.0])
    parser.add_argument("--update", type=float, default=60.0, help="trainer update, seconds")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--scale", type=float, default=1.0, help="time-scale factor k")
    parser.add_argument("--smoke", action="store_true", help="N=16, seconds, out/bench-smoke/")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--replot", type=Path, help="a warm.json: redraw its warm.png beside it")
    args = parser.parse_args()
    if args.replot:  # the limits recomputed from the durations (seeded), the plot redrawn
        saved = json.loads(args.replot.read_text())
        for r in saved["runs"]:
            for s in r["steps"]:
                rates = (r.get("call_rate", DATA_PLANE_TPS), s["start_rate_quota"])
                s.update(
                    limits(s["makespan_s"], r["rollouts"], s["step"] - 1, *rates, r["cold_start_s"])
                )
        args.replot.write_text(json.dumps(saved, indent=2) + "\n")
        plot(saved["runs"], saved["update_s"], args.replot.with_suffix(".png"), saved["scale"])
        print(table(saved["runs"]))
        return
    if args.smoke:
        args.n, args.cold_starts, args.scale = [16], [2.0], 20.0
    out = args.out or (ROOT / "out" / "bench-smoke" if args.smoke else ROOT / "bench" / "results")
    logging.basicConfig(level=logging.WARNING)
    began = time.monotonic()
    runs = []
    for cold_start in args.cold_starts:
        for n in args.n:
            run = asyncio.run(
                run_config(n, cold_start, update=args.update, steps=args.steps, scale=args.scale)
            )
            runs.append(run)
            print(json.dumps(run["steps"], indent=None), flush=True)
    result = {
        "scale": args.scale,
        "update_s": args.update,
        "durations": {"median_s": MEDIAN_S, "log_sd": SIGMA, "cap_s": CAP_S},
        "quotas": {
            "new_sessions_per_second": NEW_SESSIONS_PER_SECOND,
            "data_plane_tps": DATA_PLANE_TPS,
        },
        "target": {"makespan_over_limit": TARGET, "idle_session_s_per_rollout": args.update},
        "runs": runs,
        "wall_time_s": round(time.monotonic() - began, 1),
        "machine": f"{platform.machine()}, {__import__('os').cpu_count()} cores",
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "warm.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(runs, args.update, out / "warm.png", args.scale)
    print(table(runs))
    print(f"wrote {out / 'warm.json'} and warm.png in {result['wall_time_s']} s")


if __name__ == "__main__":
    main()
