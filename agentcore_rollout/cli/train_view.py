"""What `agentcore-rollout train` shows: a progress bar per step, a summary table, the curve."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .. import Outcome
from ..training import Group, GroupStatus

CURVE = "reward_curve.png"


class StepProgress:
    """One rich progress bar per step: groups resolved, and how their members ended."""

    def __init__(self, console: Console, steps: int) -> None:
        self._steps = steps
        self._bar = Progress(
            TextColumn("[bold]step {task.fields[step]}/{task.fields[steps]}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} groups"),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            console=console,
        )
        self._task: Any = None
        self._ok = self._failed = self._rewards = 0
        self._reward_sum = 0.0

    def __enter__(self) -> StepProgress:
        self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.stop()

    def step_started(self, step: int, groups: int) -> None:
        self._ok = self._failed = self._rewards = 0
        self._reward_sum = 0.0
        self._task = self._bar.add_task(
            "step", total=groups, step=step, steps=self._steps, status="rolling out"
        )

    def group_resolved(self, group: Group) -> None:
        if group.status is GroupStatus.STALE:
            return  # not one of this step's groups
        self._ok += sum(m.outcome is Outcome.OK for m in group.members)
        self._failed += sum(m.outcome not in (Outcome.OK, Outcome.CANCELLED) for m in group.members)
        self._rewards += len(group.rewards)
        self._reward_sum += sum(group.rewards)
        mean = self._reward_sum / self._rewards if self._rewards else math.nan
        self._bar.update(
            self._task,
            advance=1,
            status=f"ok {self._ok}  failed {self._failed}  reward {mean:.3f}",
        )

    def step_ended(self, row: dict[str, Any]) -> None:
        self._bar.update(
            self._task,
            status=(
                f"reward {_fmt(row['reward_mean'])}  trained {row['groups_trained']}  "
                f"skipped {row['groups_skipped']}  stale {row['stale']}  "
                f"{row['wall_time_s']:.1f} s"
            ),
        )


def first_and_last(rows: Sequence[dict[str, Any]], k: int = 3) -> tuple[int, float, float]:
    """Mean reward of the first `k` and of the last `k` steps (fewer for a short run), with
    the `k` used: what "it learned" means."""
    rewards = [r["reward_mean"] for r in rows if r["reward_mean"] is not None]
    if not rewards:
        return 0, math.nan, math.nan
    k = max(1, min(k, len(rewards) // 2))
    return k, sum(rewards[:k]) / k, sum(rewards[-k:]) / k


def summary_table(rows: Sequence[dict[str, Any]]) -> list[Table]:
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
        steps.add_row(*(_fmt(row[key]) for _, key in columns))
    figures = Table(show_header=False, title="figures", title_justify="left")
    k, first, last = first_and_last(rows)
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
    points = [(r["step"], r["reward_mean"]) for r in rows if r["reward_mean"] is not None]
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    ax.plot([p[0] for p in points], [p[1] for p in points], marker="o")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel("reward mean (ok rollouts)")
    ax.set_ylim(0, 1.05)
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return (
            "nan" if math.isnan(value) else f"{value:.3g}" if abs(value) < 1e-3 else f"{value:.3f}"
        )
    return str(value)
