"""The `train` command: GRPO on the local toy policy through the whole pipeline, a progress bar
per step; writes metrics.jsonl and reward_curve.png, prints a summary. Imported only when
`train` runs: the trainer loads numpy and the local stack."""

from __future__ import annotations

import json
import math
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.table import Table

from .. import Outcome
from ..local.trainer import FAILED, METRICS, StackFailed, check_config, train
from ..training import Group, GroupPolicy, GroupStatus
from .config import Config
from .dataset import read_rows
from .errors import EXIT_INTERRUPTED, EXIT_STACK_FAILED, UsageError
from .journal import JOURNAL
from .outdir import locked
from .terminal import console, run_async, status_bar
from .trackers import Trackers

CURVE = "reward_curve.png"


def train_command(config: Config, *, resume: bool = False, overwrite: bool = False) -> int:
    """`train`: 0, 130 when stopped before its last step, 5 when the stack failed."""
    if config.stack != "local":
        raise UsageError("train: trains the local toy policy, so it needs stack: local")
    try:
        GroupPolicy(config.train.n, config.train.extra, config.train.min_ok)
    except ValueError as e:
        raise UsageError(f"train: {e}") from None
    check_config(config)
    prompts = list(read_rows(Path(config.train.data)))  # each step samples from all
    out = Path(config.train.out)
    trackers = Trackers(config.train.loggers, out, config.engine.exp_id, fresh=not resume)
    with locked(out, "train.out"):
        before = _trained_before(out, config.train.steps, resume=resume, overwrite=overwrite)
        try:
            return _train(config, prompts, out, before, trackers)
        finally:
            trackers.close()


def _trained_before(out: Path, steps: int, *, resume: bool, overwrite: bool) -> list[Any]:
    """The steps an earlier run in `out` trained, which `--resume` continues; a folder holding
    a run's output, or an earlier training run without `--resume` or `--overwrite`, is
    refused (one line), so nothing is replaced by accident."""
    if (out / JOURNAL).is_file() and (out / JOURNAL).stat().st_size:
        raise UsageError(f"train.out: {out} holds the output of `run`: choose another --out")
    try:
        rows = _rows_written(out) if (out / METRICS).is_file() else []
    except (OSError, ValueError) as e:
        raise UsageError(f"train.out: cannot read {out / METRICS}: {e}") from None
    if resume:
        if not rows:
            raise UsageError(f"train --resume: {out} holds no trained step to continue from")
        if len(rows) >= steps:
            raise UsageError(
                f"train --resume: {out} trained {len(rows)} steps already: raise --steps"
            )
        return rows
    if rows and not overwrite:
        raise UsageError(
            f"train.out: {out} holds a training run ({len(rows)} steps): --resume to continue "
            "it, or --overwrite to replace it"
        )
    try:
        (out / METRICS).open("w").close()
        shutil.rmtree(out / "weights", ignore_errors=True)
    except OSError as e:
        raise UsageError(f"train.out: cannot write {out}: {e.strerror or e}") from None
    return []


def _train(
    config: Config,
    prompts: list[tuple[str, dict[str, Any]]],
    out: Path,
    before: list[Any],
    trackers: Trackers,
) -> int:
    progress = StepProgress(config.train.steps, trackers)
    failed: StackFailed | None = None
    with progress.bar:
        try:
            rows = before + run_async(
                lambda stop: train(
                    config, prompts, out, view=progress, interrupted=stop, start=len(before)
                ),
                stopping="stopping after the step under way (again to force)",
            )
        except StackFailed as e:  # what was trained so far stays: its metrics, weights, curve
            failed, rows = e, _rows_written(out)
    for table in summary_tables(rows):
        console.print(table)
    tc = config.train
    policy = "TinyPolicy" if config.local.policy == "toy" else Path(config.local.policy).name
    title = (
        f"GRPO, {policy}: {tc.groups_per_step or len(prompts)} groups x {tc.n} a step, "
        f"lr {tc.lr}, max_staleness {config.engine.limits.max_staleness}"
    )
    drew = draw_curve(rows, out / CURVE, title)
    plot = f" and {out / CURVE}" if drew else " (no plot: matplotlib is not installed)"
    console.print(f"wrote {out / METRICS}{plot}")
    if failed is not None:
        print(f"error: {failed}; {len(rows)} steps trained, kept in {out}", file=sys.stderr)
        return EXIT_STACK_FAILED
    return EXIT_INTERRUPTED if len(rows) < config.train.steps else 0


def _rows_written(out: Path) -> list[dict[str, Any]]:
    """The steps in metrics.jsonl (each written whole as its step ended)."""
    return [json.loads(line) for line in (out / METRICS).read_text().splitlines() if line]


class StepProgress:
    """The trainer's view: one progress bar per step, groups resolved and how their members
    ended; `bar` is live while training. Each step's row goes to the trackers as it ends."""

    def __init__(self, steps: int, trackers: Trackers | None = None) -> None:
        self._steps, self._trackers = steps, trackers
        step = "[bold]step {task.fields[step]}/{task.fields[steps]}"
        self.bar = status_bar(step, "{task.completed}/{task.total} groups")
        self._task: Any = None
        self._ok = self._failed = 0
        self._rewards: list[float] = []

    def step_started(self, step: int, groups: int) -> None:
        self._ok = self._failed = 0
        self._rewards = []
        self._task = self.bar.add_task(
            "step", total=groups, step=step, steps=self._steps, status="rolling out"
        )

    def group_resolved(self, group: Group) -> None:
        if group.status is GroupStatus.STALE:
            return  # not one of this step's groups
        self._ok += sum(m.outcome is Outcome.OK for m in group.members)
        self._failed += sum(m.outcome in FAILED for m in group.members)
        self._rewards += group.rewards
        mean = sum(self._rewards) / len(self._rewards) if self._rewards else math.nan
        status = f"ok {self._ok}  failed {self._failed}  reward {mean:.3f}"
        self.bar.update(self._task, advance=1, status=status)

    def step_ended(self, row: dict[str, Any]) -> None:
        status = (
            f"reward {_fmt(row['reward_mean'])}  trained {row['groups_trained']}  "
            f"skipped {row['groups_skipped']}  stale {row['stale']}  {row['wall_time_s']:.1f} s"
        )
        self.bar.update(self._task, status=status)
        if self._trackers is not None:
            self._trackers.log(tracked(row), row["step"])


def tracked(row: dict[str, Any]) -> dict[str, Any]:
    """A step's row for a tracker: under `RolloutBatch.metrics()`'s keys where it has the
    figure (reward mean, ok and cancelled counts, cost), the rest under `train/`."""
    out: dict[str, Any] = {}
    for key, value in row.items():
        if key != "step":
            out[_AS_ROLLOUT.get(key, f"train/{key}")] = value
    return out


_AS_ROLLOUT = {
    "reward_mean": "rollout/reward_mean",
    "ok": "rollout/outcome/ok",
    "cancelled": "rollout/outcome/cancelled",
    "cost": "rollout/cost",
}


def summary_tables(rows: Sequence[dict[str, Any]]) -> list[Table]:
    """A row per step, then the figures: the mean reward of the first and of the last `k`
    steps (3, fewer for a short run) is what "it learned" means."""
    steps = Table(
        title="training, one row per step (off-pol: samples from older weights; |dlogp|: max "
        "|recomputed - captured log-prob| of on-policy samples)",
        title_justify="left",
    )
    columns = [
        ("step", "step"),
        ("reward", "reward_mean"),
        ("ok", "ok"),
        ("failed", "failed"),
        ("trained", "groups_trained"),
        ("skipped", "groups_skipped"),
        ("stale", "stale"),
        ("off-pol", "off_policy_samples"),
        ("|dlogp|", "logprob_max_abs_diff"),
        ("s", "wall_time_s"),
    ]
    for title, _ in columns:
        steps.add_column(title, justify="right")
    for row in rows:
        cells = [_fmt(row[key]) for _, key in columns]
        cells[-1] = f"{row['wall_time_s']:.1f}"  # seconds: a tenth is enough
        steps.add_row(*cells)
    rewards = [r["reward_mean"] for r in rows if r["reward_mean"] is not None]
    k = max(1, min(3, len(rewards) // 2)) if rewards else 0
    first, last = (sum(rewards[:k]) / k, sum(rewards[-k:]) / k) if k else (math.nan, math.nan)
    figures = Table(show_header=False, title="figures", title_justify="left")
    figures.add_row(f"reward mean, first {k} steps", _fmt(first))
    figures.add_row(f"reward mean, last {k} steps", _fmt(last))
    figures.add_row("steps", str(len(rows)))
    figures.add_row("wall time (s)", _fmt(rows[-1]["elapsed_s"] if rows else None))
    return [steps, figures]


def draw_curve(rows: Sequence[dict[str, Any]], path: Path, title: str) -> bool:
    """The reward curve as a PNG; False (and nothing written) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        return False
    rewarded = [r for r in rows if r["reward_mean"] is not None]
    values = [r["reward_mean"] for r in rewarded]
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    ax.plot([r["step"] for r in rewarded], values, marker="o", label="reward")
    # The agent's named components that are rates (in [0, 1]) and move, e.g. the math agent's
    # `correct` and `format`: what the reward is made of, step by step.
    names = {n for r in rows for n in r.get("reward_components", {})} - {"reward"}
    for name in sorted(names):
        named = [r for r in rows if name in r.get("reward_components", {})]
        series = [r["reward_components"][name] for r in named]
        if all(0 <= v <= 1 for v in series) and len(set(series)) > 1:
            ax.plot([r["step"] for r in named], series, "--", alpha=0.7, label=name)
    if len(ax.get_lines()) > 1:
        ax.legend(fontsize=8)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel("mean over ok rollouts")
    ax.set_ylim(min([0.0, *values]), max([1.05, *(v * 1.05 for v in values)]))
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def _fmt(value: Any) -> str:
    if isinstance(value, float) and not math.isnan(value):
        return f"{value:.1e}" if 0 < abs(value) < 1e-3 else f"{value:.3f}"
    return "-" if value is None else str(value)
