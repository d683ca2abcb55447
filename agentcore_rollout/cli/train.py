"""The `train` command: GRPO on the local toy policy through the whole pipeline; writes
metrics.jsonl and reward_curve.png, prints a summary. Imported only when `train` runs: the
trainer loads numpy and the local stack."""

from __future__ import annotations

from pathlib import Path

from .. import Config
from ..local.trainer import METRICS, train
from ..training import GroupPolicy
from .dataset import read_dataset
from .errors import EXIT_INTERRUPTED, UsageError
from .signals import run_async
from .train_view import CURVE, StepProgress, draw_curve, summary_table
from .views import console


def train_command(config: Config) -> int:
    """`train`: 0, or 130 when stopped before its last step."""
    if config.stack != "local":
        raise UsageError("train: trains the local toy policy, so it needs stack: local")
    try:
        GroupPolicy(config.train.n, config.train.extra, config.train.min_ok)
    except ValueError as e:
        raise UsageError(f"train: {e}") from None
    prompts = read_dataset(Path(config.train.data))
    out = Path(config.train.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / METRICS).open("w").close()
    except OSError as e:
        raise UsageError(f"train.out: cannot write {out}: {e.strerror or e}") from None
    with StepProgress(console, config.train.steps) as progress:
        rows = run_async(
            lambda stop: train(config, prompts, out, view=progress, interrupted=stop),
            stopping="stopping after the step under way (again to force)",
        )
    for table in summary_table(rows):
        console.print(table)
    tc = config.train
    title = (
        f"GRPO, TinyPolicy: {len(prompts)} prompts x {tc.n}, lr {tc.lr}, "
        f"max_staleness {config.engine.limits.max_staleness}"
    )
    drew = draw_curve(rows, out / CURVE, title)
    console.print(
        f"wrote {out / METRICS}"
        + (f" and {out / CURVE}" if drew else " (no plot: matplotlib is not installed)")
    )
    return EXIT_INTERRUPTED if len(rows) < config.train.steps else 0
