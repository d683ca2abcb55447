"""Synchronous against asynchronous `train` on the local stack, with heavy-tailed rollouts.

Prints JSON and writes bench/results/async_train.json and async_train.png. Both arms train the
toy policy with GRPO on the math task (`configs/train.yaml`: 4 groups of 8 a step here) through
the whole embedded pipeline, the agent waiting a lognormal time before it starts
(`bench/_heavy_tail_agent.py`: median 1 s, log-sd 1, so one rollout in 20 takes over 5 s) and
the toy paced at `token_delay` a token, so generations are in flight when weights change:

    sync    max_staleness 0: a step rolls out its groups, waits for the slowest, then updates
    async   `train --async`, max_staleness 1, stale_policy keep: each resolved group is
            replaced at once, weight pushes abort the turns in flight (the gateway resumes
            them), and a step trains on the first groups to resolve, oldest first

`s_per_step` is the mean wall time per step after the first (the first includes the stack's
warm-up in both), `speedup` sync's over async's. Each arm's reward curve is in the JSON and the
plot: the point is that async is faster per step and its reward still rises.

    python bench/async_train.py [--steps 16] [--median 1.0] [--sigma 1.0] [--smoke]

`--smoke` (CI's): 2 steps of 1 group, think time median 0.05 s, into out/bench-smoke/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agentcore_rollout.cli.config import load_config  # noqa: E402
from agentcore_rollout.cli.dataset import read_rows  # noqa: E402
from agentcore_rollout.local.trainer import train  # noqa: E402
from bench import _smoke  # noqa: E402

ARMS: dict[str, list[str]] = {
    "sync": ["engine.limits.max_staleness=0"],
    "async": [
        "train.asynchronous=true",
        "engine.limits.max_staleness=1",
        "engine.limits.stale_policy=keep",
    ],
}


async def arm(name: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    config = load_config(
        ROOT / "configs" / "train.yaml",
        env_file=None,
        overrides=[
            *ARMS[name],
            f"engine.exp_id=bench-{name}",
            "local.app=bench._heavy_tail_agent:app",
            f"local.token_delay={args.token_delay}",
            "engine.limits.rollout_timeout=300",
            f"train.steps={args.steps}",
            f"train.groups_per_step={args.groups}",
        ],
    )
    think = {"think_median": args.median, "think_sigma": args.sigma}
    prompts = [(i, {**p, **think}) for i, p in read_rows(ROOT / config.train.data)]
    rows = await train(config, prompts, out / name)
    later = [r["wall_time_s"] for r in rows[1:]]
    third = max(1, len(rows) // 3)
    return {
        "s_per_step": round(sum(later) / len(later), 3),
        "wall_time_s": rows[-1]["elapsed_s"],
        "reward_first_third": round(_mean([r["reward_mean"] for r in rows[:third]]), 4),
        "reward_last_third": round(_mean([r["reward_mean"] for r in rows[-third:]]), 4),
        "ok": sum(r["ok"] for r in rows),
        "requests": sum(r["requests"] for r in rows),
        "stale": sum(r["stale_requests"] for r in rows),
        "resumed_turns": sum(r["resumed_turns"] for r in rows),
        "step_lag_mean": round(_mean([r["step_lag_mean"] or 0.0 for r in rows]), 3),
        "steps": [
            {k: r[k] for k in ("step", "reward_mean", "wall_time_s", "elapsed_s", "staleness")}
            for r in rows
        ],
    }


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (walls, rewards) = plt.subplots(1, 2, figsize=(11, 4))
    for name, res in results["arms"].items():
        steps = res["steps"]
        label = f"{name}: {res['s_per_step']:.1f} s/step"
        walls.plot([s["step"] for s in steps], [s["wall_time_s"] for s in steps], "o-", label=label)
        rewards.plot(
            [s["elapsed_s"] for s in steps], [s["reward_mean"] for s in steps], "o-", label=name
        )
    walls.set(xlabel="step", ylabel="wall time of the step (s)", title="time per step")
    rewards.set(xlabel="elapsed (s)", ylabel="mean reward", title="reward against wall time")
    for ax in (walls, rewards):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(
        f"train: sync vs --async (staleness 1, keep), lognormal think time "
        f"(median {results['median_s']} s, sigma {results['sigma']}): "
        f"{results['speedup']}x per step"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--groups", type=int, default=4, help="groups of 8 a step")
    parser.add_argument("--median", type=float, default=1.0, help="think time median, seconds")
    parser.add_argument("--sigma", type=float, default=1.0, help="think time log-sd")
    parser.add_argument("--token-delay", type=float, default=0.01, help="seconds a toy token")
    parser.add_argument("--out", type=Path, default=_smoke.RESULTS)
    args = _smoke.parse(parser, steps=2, groups=1, median=0.05, sigma=0.5)
    os.chdir(ROOT)  # the emulator imports the agent module from here
    with tempfile.TemporaryDirectory() as tmp:
        arms = {name: asyncio.run(arm(name, args, Path(tmp))) for name in ARMS}
    results = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "median_s": args.median,
        "sigma": args.sigma,
        "token_delay_s": args.token_delay,
        "groups_per_step": args.groups,
        "speedup": round(arms["sync"]["s_per_step"] / arms["async"]["s_per_step"], 2),
        "arms": arms,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "async_train.json").write_text(json.dumps(results, indent=2) + "\n")
    plot(results, args.out / "async_train.png")
    print(
        json.dumps(
            {k: v for k, v in results.items() if k != "arms"}
            | {name: {k: v for k, v in res.items() if k != "steps"} for name, res in arms.items()},
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
