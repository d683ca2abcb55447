"""A Harbor dataset as a user runs it (`agentcore-rollout run` on the local stack, Podman):
more tasks than live-session slots over several environments, separate verifiers among them,
and one environment that does not build. Its tasks alone end `submit_failed`, saying so with
the builder's words; every other task runs and scores as its tests say."""

from __future__ import annotations

import json
import sys

import pytest

from agentcore_rollout.cli.args import main
from agentcore_rollout.local.containers import ContainerRuntimeError, container_engine

from .conftest import ROOT
from .test_containers import _ours

pytestmark = [pytest.mark.containers, pytest.mark.e2e]

sys.path.insert(0, str(ROOT / "examples" / "harbor_dataset"))
from generate import generate  # noqa: E402


@pytest.fixture(scope="module")
def podman():
    try:
        return container_engine("podman")
    except ContainerRuntimeError as e:
        pytest.skip(f"no podman here: {e}")


def test_a_dataset_of_more_tasks_than_slots_with_a_broken_environment(podman, tmp_path, capsys):
    data = tmp_path / "data"
    generate(data, tasks=12, environments=3, separate=4)  # 3 separate verifiers among them
    broken = data / "task-broken"
    (broken / "environment").mkdir(parents=True)
    (broken / "tests").mkdir()
    (broken / "instruction.md").write_text("Write 1 into /app/answer.txt.\n")
    (broken / "task.toml").write_text("[agent]\ntimeout_sec = 60.0\n")
    (broken / "environment" / "Dockerfile").write_text(
        "FROM python:3.11-slim\nRUN echo 'no such package: left-pad' >&2; false\n"
    )
    (broken / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    out = tmp_path / "out"
    code = main(
        [
            *("run", "--config", str(ROOT / "configs" / "harbor-local.yaml")),
            *("--data", str(data), "--out", str(out)),
            *("local.policy=toy", "engine.dispatch.max_live_sessions=3"),
            "run.min_ok_fraction=0.5",
        ]
    )
    err = capsys.readouterr().err
    assert code == 0, err[-3000:]
    rows = {r["input_id"]: r for r in map(json.loads, (out / "rollouts.jsonl").open())}
    assert len(rows) == 13
    failed = rows.pop("task-broken")
    assert failed["outcome"] == "submit_failed"
    assert "its image did not build" in failed["error"] and "left-pad" in failed["error"]
    assert {(r["outcome"], r["reward"]) for r in rows.values()} == {("ok", 1.0)}, {
        k: (r["outcome"], r["error"]) for k, r in rows.items() if r["outcome"] != "ok"
    }
    handed = [r for r in rows.values() if "artifacts" in r["result"]["trajectory"]]
    assert len(handed) == 3  # the separate verifiers judged what the agents handed over
    assert all(r["result"]["metrics"]["artifact_files"] == 1 for r in handed)
    assert "task-broken" in err and "failed 1" in err.replace("  ", " ")
    assert _ours(podman) == []
