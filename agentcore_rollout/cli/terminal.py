"""The terminal: the stderr console every command prints to, Ctrl-C for the long commands, and
what `run` shows (a progress bar while requests run, the summary tables at the end)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .. import Outcome, RolloutOutcome
from .errors import EXIT_INTERRUPTED
from .summary import RunSummary

# stderr: stdout is for what scripts read (`local up`, `deploy`). Written to a file or a CI log,
# rich assumes 80 columns, which truncates the training table's figures; 120 holds them.
console = Console(stderr=True, width=None if sys.stderr.isatty() else 120)


def run_async(
    make: Callable[[asyncio.Event], Coroutine[Any, Any, Any]],
    stopping: str = "stopping: cancelling unfinished rollouts (again to force)",
    forced: Callable[[], str] = lambda: "",
) -> Any:
    """Run `make(stop)`. The first SIGINT/SIGTERM sets `stop` (the command stops cleanly and
    still writes what it has; `stopping` says so). A second one exits at once, quietly, in one
    line and exit 130 (no traceback, no cleanup to wait for: the local stack's children exit
    with us); `forced()` writes what it can first and says what. No write is ever cut: they
    run on this loop, and this is one of its callbacks."""

    async def body() -> Any:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_signal() -> None:
            if stop.is_set():
                said = f"forced: exiting now{forced()}"
                console.print(said, style="red", markup=False, soft_wrap=True)
                console.show_cursor(True)
                os._exit(EXIT_INTERRUPTED)
            console.print(f"[yellow]{stopping}")
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal)
        return await make(stop)

    return asyncio.run(body())


def status_bar(label: str, count: str) -> Progress:
    """A progress bar on the console: `label`, the bar, `count`, the task's `status`, time."""
    status = TextColumn("{task.fields[status]}")
    bar = (TextColumn(label), BarColumn(), TextColumn(count), status, TimeElapsedColumn())
    return Progress(*bar, console=console)


@contextmanager
def progress_bar(total: int) -> Iterator[Callable[[RolloutOutcome, int], None]]:
    """`run`'s progress bar: submitted / running / done / failed; yields its update."""
    bar = status_bar("[bold]rollouts", "{task.completed}/{task.total}")
    task = bar.add_task("rollouts", total=total, status="")
    done = failed = 0

    def update(finished: RolloutOutcome, running: int) -> None:
        nonlocal done, failed
        done += 1
        failed += finished.outcome is not Outcome.OK
        status = f"submitted {total}  running {running}  done {done}  failed {failed}"
        bar.update(task, completed=done, status=status)

    with bar:
        yield update


def print_summary(summary: RunSummary) -> None:
    """Outcome counts, the run's figures, and the reward mean of the first 20 groups."""
    table = Table(title=f"rollouts: {summary.requests} requests", title_justify="left")
    table.add_column("outcome")
    table.add_column("count", justify="right")
    for name, count in summary.outcomes.items():
        table.add_row(name, str(count))
    console.print(table)
    latency = " / ".join(_fmt(summary.latency_s.get(k)) for k in ("p50", "p95", "p99"))
    figures = Table(show_header=False, title="figures", title_justify="left")
    figures.add_row("reward mean", _fmt(summary.reward_mean))
    figures.add_row("latency p50 / p95 / p99 (s)", latency)
    figures.add_row("throughput (rollouts/s)", _fmt(summary.throughput_per_s))
    figures.add_row("API calls per rollout", _fmt(summary.api_calls_per_rollout))
    figures.add_row("wall time (s)", _fmt(summary.wall_time_s))
    cost = summary.cost
    figures.add_row("sandbox seconds (total / mean)", _sandbox(cost))
    figures.add_row("tokens prompt / completion / reused", _tokens(cost))
    figures.add_row("est. cost USD (total / per rollout / per ok)", _usd(cost))
    console.print(figures)
    groups = Table(title="reward mean per group", title_justify="left")
    for col in ("group", "n", "ok", "reward mean"):
        groups.add_column(col, justify="left" if col == "group" else "right")
    items = list(summary.groups.items())
    for gid, g in items[:20]:
        groups.add_row(gid, str(g.n), str(g.ok), _fmt(g.reward_mean))
    if len(items) > 20:
        groups.add_row(f"... {len(items) - 20} more in summary.json", "", "", "")
    console.print(groups)


def _sandbox(cost: dict[str, Any]) -> str:
    mean = cost["sandbox_seconds"] / cost["rollouts"] if cost["rollouts"] else None
    return f"{_fmt(cost['sandbox_seconds'])} / {_fmt(mean)}"


def _tokens(cost: dict[str, Any]) -> str:
    """The run's tokens; how many rollouts had no trace (their tokens are not in the sums)."""
    keys = ("prompt_tokens", "completion_tokens", "reused_prompt_tokens")
    shown = " / ".join("-" if cost[k] is None else f"{cost[k]:,}" for k in keys)
    return shown + (f" ({cost['untraced']} without a trace)" if cost["untraced"] else "")


def _usd(cost: dict[str, Any]) -> str:
    keys = ("usd", "usd_per_rollout", "usd_per_ok")
    return " / ".join("-" if cost[k] is None else f"{cost[k]:.6f}" for k in keys)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
