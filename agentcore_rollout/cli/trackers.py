"""The experiment trackers `run` and `train` log to (TensorBoard, wandb offline, MLflow's SQLite
store), each from its own extra and imported only when named.

Each runs on a thread of its own: opening one takes a second or more (wandb starts a process),
which the engine's event loop must not wait for. One that fails is one line and is dropped; the
run goes on. docs/outputs.md#experiment-trackers."""

from __future__ import annotations

import importlib
import math
import os
import re
import shutil
import sqlite3
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal, Protocol

from .errors import UsageError
from .terminal import console

LoggerName = Literal["tensorboard", "wandb", "mlflow"]
PROJECT = "agentcore-rollout"  # wandb's project and MLflow's experiment
MLFLOW_DB = "mlflow.db"
# What each tracker imports: a missing one is a usage error naming the extra that installs it.
_NEEDS: dict[str, tuple[str, ...]] = {
    "tensorboard": ("tensorboardX",),
    "wandb": ("wandb",),
    "mlflow": ("mlflow", "sqlalchemy", "alembic"),
}


class Tracker(Protocol):
    def log(self, metrics: Mapping[str, float], step: int) -> None: ...
    def close(self) -> None: ...


class Trackers:
    """The trackers named, opened on their thread at the first `log` (a run that never starts
    writes nothing), closed by `close()`. Construction imports them: a tracker not installed,
    or that cannot load, is a UsageError before anything starts."""

    def __init__(self, names: Iterable[str], out: Path, name: str, *, fresh: bool) -> None:
        self.names = list(dict.fromkeys(names))
        if "wandb" in self.names and not os.environ.get("WANDB_MODE"):
            # offline means offline: not its error reports either (read as wandb loads)
            os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
        for logger in self.names:
            _check(logger)
        self._open = {n: _OPENERS[n] for n in self.names}
        self._args = (out, name, fresh)
        self._live: dict[str, Tracker] = {}
        self._thread = ThreadPoolExecutor(1, "trackers") if self.names else None

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """Log the numbers of `metrics` at `step`, without waiting."""
        if self._thread is not None:
            self._thread.submit(self._log, numbers(metrics), step)

    def close(self) -> None:
        """Wait for what was logged, then close each tracker."""
        if self._thread is not None:
            self._thread.submit(self._close)
            self._thread.shutdown(wait=True)
            self._thread = None

    def _log(self, metrics: dict[str, float], step: int) -> None:
        for logger in list(self._open):
            try:
                if logger not in self._live:
                    self._live[logger] = self._open[logger](*self._args)
                self._live[logger].log(metrics, step)
            except Exception as e:
                self._drop(logger, e)

    def _close(self) -> None:
        for logger, tracker in list(self._live.items()):
            try:
                tracker.close()
            except Exception as e:
                self._drop(logger, e)
        self._live.clear()

    def _drop(self, logger: str, error: Exception) -> None:
        self._open.pop(logger, None)
        self._live.pop(logger, None)
        said = f"logger {logger} failed, no more logging to it: {type(error).__name__}: {error}"
        console.print(" ".join(said.split()), style="yellow", markup=False, soft_wrap=True)


def numbers(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """`metrics` flattened with `/` (`{"cost": {"usd": 1}}` -> `cost/usd`), numbers only:
    booleans are 0 or 1, strings and None are left out, as are NaN and infinities."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, Mapping):
            out |= numbers(value, f"{prefix}{key}/")
        elif isinstance(value, int | float) and math.isfinite(value):
            out[f"{prefix}{key}"] = float(value)
    return out


def _check(logger: str) -> None:
    if logger not in _NEEDS:
        known = ", ".join(_NEEDS)
        raise UsageError(f"--logger {logger}: not a logger (one of: {known})")
    for module in _NEEDS[logger]:
        try:
            importlib.import_module(module)
        except Exception as e:  # not installed, or an install that cannot load
            raise UsageError(
                f"--logger {logger}: cannot import {module} ({e}): "
                f"pip install 'agentcore-rollout[{logger}]'"
            ) from None


class _TensorBoard:
    """Event files in OUT/tensorboard/NAME (tensorboardX's writer, TensorBoard reads them);
    a fresh run replaces those of an earlier run of the same name, whose steps it repeats."""

    def __init__(self, out: Path, name: str, fresh: bool) -> None:
        from tensorboardX import SummaryWriter

        logdir = out / "tensorboard" / name
        if fresh:
            shutil.rmtree(logdir, ignore_errors=True)
        self._writer = SummaryWriter(logdir=str(logdir))

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, step)
        self._writer.flush()  # a TensorBoard watching the folder shows it now

    def close(self) -> None:
        self._writer.close()


class _Wandb:
    """An offline wandb run in OUT/wandb (`wandb sync` uploads it later): the network only if
    the user set WANDB_MODE. Its x axis is the `step` key, as steps may come out of order."""

    def __init__(self, out: Path, name: str, fresh: bool) -> None:
        import wandb

        self._run = wandb.init(
            dir=str(out),
            project=os.environ.get("WANDB_PROJECT") or PROJECT,
            name=name,
            mode=os.environ.get("WANDB_MODE") or "offline",
            settings=wandb.Settings(silent=True, console="off", x_disable_stats=True),
        )
        self._run.define_metric("step")
        self._run.define_metric("*", step_metric="step")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self._run.log({**metrics, "step": step})

    def close(self) -> None:
        self._run.finish()


_MLFLOW_BAD = re.compile(r"[^\w\-. :/]")  # what MLflow refuses in a name (a runtime ARN's #)


class _MLflow:
    """A run named NAME in the experiment `agentcore-rollout` of OUT/mlflow.db (MLflow's
    SQLite store: its file store is deprecated); `mlflow ui --backend-store-uri
    sqlite:///OUT/mlflow.db` shows it."""

    def __init__(self, out: Path, name: str, fresh: bool) -> None:
        import logging

        from mlflow.tracking import MlflowClient

        logging.getLogger("mlflow").setLevel(logging.WARNING)  # not its table-creation lines
        logging.getLogger("alembic").setLevel(logging.WARNING)
        db = (out / MLFLOW_DB).resolve()
        sqlite3.connect(db).close()  # one it cannot open fails now, not after MLflow's retries
        self._client = MlflowClient(tracking_uri=f"sqlite:///{db}")
        found = self._client.get_experiment_by_name(PROJECT)
        artifacts = (out / "mlartifacts").resolve().as_uri()  # none logged; never outside OUT
        experiment = (
            found.experiment_id
            if found
            else self._client.create_experiment(PROJECT, artifact_location=artifacts)
        )
        self._run_id = self._client.create_run(experiment, run_name=name).info.run_id

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(_MLFLOW_BAD.sub("_", k), v, now, step) for k, v in metrics.items()]
        self._client.log_batch(self._run_id, metrics=batch)

    def close(self) -> None:
        self._client.set_terminated(self._run_id)


_OPENERS: dict[str, Any] = {"tensorboard": _TensorBoard, "wandb": _Wandb, "mlflow": _MLflow}
