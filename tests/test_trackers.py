"""`--logger`: what `run` and `train` log to TensorBoard, wandb (offline) and MLflow, each read
back with the tracker's own reader (TensorBoard's EventAccumulator, wandb's record protobufs
from its offline datastore, MLflow's client over its SQLite store)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentcore_rollout.cli import main
from agentcore_rollout.cli.trackers import MLFLOW_DB, PROJECT, Trackers, numbers
from agentcore_rollout.cli.train import tracked

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _offline(monkeypatch) -> None:
    """wandb's default, as a user without WANDB_* set has it (set, then unset: what `Trackers`
    sets in the environment goes with the test)."""
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_PROJECT", "WANDB_ERROR_REPORTING"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


def scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """TensorBoard's own reader: every scalar series, (step, value) each."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    reader = EventAccumulator(str(logdir))
    reader.Reload()
    return {t: [(e.step, e.value) for e in reader.Scalars(t)] for t in reader.Tags()["scalars"]}


def wandb_history(out: Path) -> list[dict[str, float]]:
    """The history rows of the one offline wandb run in OUT/wandb, from its datastore (a
    LevelDB-style log of wandb's Record protobufs: 32 KiB blocks, a 7-byte header a chunk)."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = out.glob("wandb/offline-run-*/run-*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    rows, block, pos, chunk = [], 32768, 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header: padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        chunk, pos = chunk + data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # a whole record, or its last chunk
            record = pb.Record()
            record.ParseFromString(chunk)
            chunk = b""
            if record.WhichOneof("record_type") == "history":
                items = record.history.item
                rows.append(
                    {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items}
                )
    return rows


def mlflow_metrics(out: Path, name: str) -> dict[str, list[tuple[int, float]]]:
    """MLflow's client over OUT/mlflow.db: the run named `name`'s series."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{out / MLFLOW_DB}")
    experiment = client.get_experiment_by_name(PROJECT)
    (run,) = client.search_runs([experiment.experiment_id], f"attributes.run_name = '{name}'")
    assert run.info.status == "FINISHED"
    return {
        key: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]
        for key in run.data.metrics
    }


@pytest.fixture
def no_network(monkeypatch) -> Iterator[list[str]]:
    """A loopback listener every way off this machine points at (wandb's server, the HTTP(S)
    proxies, loopback left direct for the local stack): the connections it records are the
    ones a logger tried to make."""
    listener = socket.create_server(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    for name in ("WANDB_BASE_URL", "HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"):
        monkeypatch.setenv(name, url)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    seen: list[str] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            seen.append(conn.recv(200).decode(errors="replace"))
            conn.close()

    threading.Thread(target=accept, daemon=True).start()
    yield seen
    listener.close()


@pytest.mark.unit
def test_numbers_flattens_nested_figures_and_keeps_numbers_only():
    got = numbers({"a": 1, "b": {"c": 2.5, "d": {"e": True}}, "s": "x", "n": None, "f": 1e400})
    assert got == {"a": 1.0, "b/c": 2.5, "b/d/e": 1.0}


@pytest.mark.unit
def test_a_train_row_uses_the_rollout_keys_where_it_has_the_figure():
    row = {"step": 3, "reward_mean": 0.5, "ok": 4, "cost": {"usd": 0.1}, "stale": 1}
    assert numbers(tracked(row)) == {
        "rollout/reward_mean": 0.5,
        "rollout/outcome/ok": 4.0,
        "rollout/cost/usd": 0.1,
        "train/stale": 1.0,
    }


@pytest.mark.component
def test_each_tracker_reads_back_what_was_logged_and_wandb_stays_offline(tmp_path, no_network):
    trackers = Trackers(["tensorboard", "wandb", "mlflow"], tmp_path, "exp-1", fresh=True)
    for step in range(3):
        trackers.log({"rollout/reward_mean": step / 4, "nested": {"n": step}}, step)
    trackers.close()
    assert scalars(tmp_path / "tensorboard" / "exp-1") == {
        "rollout/reward_mean": [(0, 0.0), (1, 0.25), (2, 0.5)],
        "nested/n": [(0, 0.0), (1, 1.0), (2, 2.0)],
    }
    history = wandb_history(tmp_path)
    assert [(r["step"], r["rollout/reward_mean"], r["nested/n"]) for r in history] == [
        (0, 0.0, 0.0),
        (1, 0.25, 1.0),
        (2, 0.5, 2.0),
    ]
    assert mlflow_metrics(tmp_path, "exp-1")["rollout/reward_mean"] == [
        (0, 0.0),
        (1, 0.25),
        (2, 0.5),
    ]
    assert no_network == []  # wandb, offline by default, tried to reach nothing
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlflow.db", "tensorboard", "wandb"]


@pytest.mark.component
def test_a_tracker_that_fails_is_one_line_and_the_others_go_on(tmp_path, capsys):
    (tmp_path / MLFLOW_DB).mkdir()  # where MLflow's database would go: it cannot open it
    trackers = Trackers(["mlflow", "tensorboard"], tmp_path, "exp-1", fresh=True)
    trackers.log({"x": 1}, 0)
    trackers.log({"x": 2}, 1)
    trackers.close()
    err = capsys.readouterr().err
    assert err.count("logger mlflow failed, no more logging to it") == 1, err
    assert len(err.strip().splitlines()) == 1, err
    assert scalars(tmp_path / "tensorboard" / "exp-1") == {"x": [(0, 1.0), (1, 2.0)]}


@pytest.mark.unit
@pytest.mark.parametrize("command", ["run", "train"])
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--logger", "tensorboard,comet"],
            "loggers.1: Input should be 'tensorboard', 'wandb' or 'mlflow'",
        ),
        (
            ["--logger", "wandb", "--logger", "mlflow"],
            "--logger mlflow: cannot import sqlalchemy (import of sqlalchemy halted; None in "
            "sys.modules): pip install 'agentcore-rollout[mlflow]'",
        ),
    ],
)
def test_an_unknown_or_missing_logger_is_one_line_and_starts_nothing(
    command, args, message, tmp_path, dataset, capsys, monkeypatch
):
    started: list[object] = []
    monkeypatch.setattr("agentcore_rollout.local.stack.LocalStack", started.append)
    monkeypatch.setattr("agentcore_rollout.local.trainer.LocalStack", started.append)
    monkeypatch.setitem(sys.modules, "sqlalchemy", None)  # as if [mlflow] were not installed
    out = tmp_path / "out"
    code = main([command, "--data", str(dataset), "--out", str(out), *args])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("error: ") and message in err, err
    assert started == [] and not out.exists()


@pytest.fixture
def dataset(tmp_path) -> Path:
    path = tmp_path / "data.jsonl"
    path.write_text('{"question": "What is 2 + 3?", "answer": 5}\n')
    return path


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-m", "agentcore_rollout.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": path},
        timeout=280,
    )


@pytest.mark.e2e
def test_run_logs_its_figures_to_every_logger_named(tmp_path, no_network):
    data = tmp_path / "data.jsonl"
    rows = [{"id": f"g{i}", "question": f"What is {i} + 3?", "answer": i + 3} for i in range(2)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    args = ["run", "--data", str(data), "--n", "3", "--out", str(out), "run.step=7"]
    proc = _cli(*args, "--logger", "tensorboard", "--logger", "wandb,mlflow", "engine.exp_id=e1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "logger" not in proc.stderr, proc.stderr[-3000:]  # none failed
    summary = json.loads((out / "summary.json").read_text())
    # TensorBoard: the run's figures at run.step, the counts so far at the outcomes ended
    tb = scalars(out / "tensorboard" / "e1")
    assert tb["rollout/outcome/ok"] == [(7, summary["outcomes"]["ok"])]
    assert tb["rollout/requests"] == [(7, 6.0)]
    assert tb["rollout/reward_mean"] == [(7, pytest.approx(summary["reward_mean"]))]
    assert tb["rollout/latency_p95"] == [(7, pytest.approx(summary["latency_s"]["p95"]))]
    assert tb["rollout/cost/usd"] == [(7, pytest.approx(summary["cost"]["usd"]))]
    assert tb["rollout/engine/invokes"] == [(7, 6.0)]
    ended = tb["progress/ended"]
    assert ended[-1] == (6, 6.0) and [s for s, _ in ended] == sorted({s for s, _ in ended})
    assert tb["progress/outcome/ok"][-1] == (6, summary["outcomes"]["ok"])
    # wandb and MLflow hold the same figures
    (final,) = [r for r in wandb_history(out) if "rollout/requests" in r]
    assert final["step"] == 7 and final["rollout/reward_mean"] == pytest.approx(
        summary["reward_mean"]
    )
    ml = mlflow_metrics(out, "e1")
    assert ml["rollout/outcome/ok"] == [(7, summary["outcomes"]["ok"])]
    assert ml["progress/ended"][-1] == (6, 6.0)
    assert no_network == []


@pytest.mark.e2e
def test_train_logs_each_step_as_its_row_in_metrics_jsonl(tmp_path):
    out = tmp_path / "train"
    args = ["train", "--steps", "3", "--out", str(out), "train.groups_per_step=2"]
    proc = _cli(*args, "local.policy_seed=0", "--logger", "tensorboard", "engine.exp_id=t1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    tb = scalars(out / "tensorboard" / "t1")
    assert tb["rollout/reward_mean"] == [
        (r["step"], pytest.approx(r["reward_mean"], rel=1e-6)) for r in rows
    ]
    assert tb["train/groups_trained"] == [(r["step"], r["groups_trained"]) for r in rows]
    assert tb["rollout/cost/prompt_tokens"] == [
        (r["step"], r["cost"]["prompt_tokens"]) for r in rows
    ]
    assert [s for s, _ in tb["train/reward_components/correct"]] == [0, 1, 2]
