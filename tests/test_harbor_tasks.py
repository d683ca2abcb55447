"""Harbor task folders as a dataset: read by Harbor's names and defaults, one row per task
carrying its tests and solution as files, tasks with one environment sharing its id, and every
bad task named in one line before anything starts."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from agentcore_rollout.cli import main
from agentcore_rollout.harbor.tasks import (
    DEFAULT_TIMEOUT,
    TaskError,
    is_task_source,
    read_tasks,
    task_payload,
    write_files,
)

from .test_cli_dataset import stack_starts  # noqa: F401 (a fixture)

pytestmark = pytest.mark.unit

DOCKERFILE = "FROM python:3.11-slim\nWORKDIR /app\n"


def _task(
    root: Path, name: str, toml: str = "", files: dict[str, str | None] | None = None
) -> Path:
    """A task folder: instruction, task.toml, a Dockerfile, a test and a solution; `files`
    (relative path -> text) added, or left out where the text is None."""
    folder = root / name
    contents = {
        "instruction.md": f"Do {name}.\n",
        "task.toml": toml,
        "environment/Dockerfile": DOCKERFILE,
        "tests/test.sh": "echo 1 > /logs/verifier/reward.txt\n",
        "solution/solve.sh": "true\n",
        **(files or {}),
    }
    for path, text in contents.items():
        if text is None:
            continue
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(text)
    return folder


def test_a_folder_of_tasks_reads_by_harbors_names_and_defaults(tmp_path):
    toml = (
        'version = "1.0"\n[metadata]\ndifficulty = "easy"\n[agent]\ntimeout_sec = 30\n'
        '[verifier]\ntimeout_sec = 12.5\nenv = { LEVEL = "3" }\n[environment]\ncpus = 2\n'
        'memory = "4G"\nbuild_timeout_sec = 90\nallow_internet = false\n'
    )
    _task(tmp_path, "b-task", toml)
    _task(tmp_path, "a-task", "[environment]\nmemory_mb = 512\n")
    _task(tmp_path, "c-task", files={"environment/Dockerfile": DOCKERFILE + "RUN true\n"})
    _task(tmp_path, "d-task", '[environment]\ndocker_image = "ghcr.io/x/y:1"\n')
    _task(tmp_path, "e-task", '[environment]\nmemory = "512M"\n[task]\nname = "x/e"\n')
    (tmp_path / ".hidden").mkdir()
    a, b, c, d, e = read_tasks(tmp_path)
    assert [t.name for t in (a, b, c, d, e)] == ["a-task", "b-task", "c-task", "d-task", "e-task"]
    assert (b.agent_timeout, b.verifier_timeout, b.build_timeout) == (30.0, 12.5, 90.0)
    assert (b.cpus, b.memory_mb, b.verifier_env) == (2.0, 4096, {"LEVEL": "3"})
    assert b.network_mode == "no-network" and a.network_mode == "public"
    assert (a.agent_timeout, a.memory_mb, a.cpus) == (DEFAULT_TIMEOUT, 512, None)
    # one environment byte for byte, with the same limits: one id, one image, one runtime;
    # any other byte, or other limits: another
    assert a.environment == e.environment != c.environment
    assert b.environment != a.environment
    assert d.docker_image == "ghcr.io/x/y:1" and d.environment not in (a.environment, c.environment)
    assert read_tasks(tmp_path / "c-task") == [c]  # one task folder is a dataset of one


def test_a_task_is_one_row_its_tests_travel_as_files(tmp_path):
    folder = _task(tmp_path, "t", files={"tests/data/in.csv": "x,1\n"})
    (folder / "tests" / "test.sh").chmod(0o755)
    (task,) = read_tasks(tmp_path)
    row = task_payload(task)
    assert row["id"] == "t" and row["instruction"] == "Do t.\n"
    assert row["environment"] == task.environment
    assert [f["path"] for f in row["tests"]] == ["data/in.csv", "test.sh"]
    assert [f["path"] for f in row["solution"]] == ["solve.sh"]
    json.dumps(row)  # a payload: JSON as it is
    into = tmp_path / "written"
    write_files(row["tests"], into)
    assert (into / "data" / "in.csv").read_text() == "x,1\n"
    assert (into / "test.sh").stat().st_mode & 0o777 == 0o755
    escape = [{"path": "../out.sh", "mode": 0o644, "data": base64.b64encode(b"x").decode()}]
    with pytest.raises(ValueError, match="leaves"):
        write_files(escape, into)


def test_a_jsonl_names_task_folders_relative_to_itself(tmp_path):
    _task(tmp_path / "tasks", "one")
    _task(tmp_path / "tasks", "two")
    listing = tmp_path / "train.jsonl"
    listing.write_text('{"harbor_task": "tasks/two"}\n\n{"harbor_task": "tasks/one"}\n')
    assert is_task_source(listing) and is_task_source(tmp_path / "tasks")
    assert [t.name for t in read_tasks(listing)] == ["two", "one"]
    payloads = tmp_path / "payloads.jsonl"
    payloads.write_text('{"id": 1, "a": 2}\n')
    assert not is_task_source(payloads)
    listing.write_text('{"harbor_task": "tasks/one"}\n{"task": "tasks/two"}\n')
    with pytest.raises(TaskError, match=r"train.jsonl:2: expected \{\"harbor_task\": \"DIR\"\}"):
        read_tasks(listing)


BAD = {  # folder -> (how it is broken, what its one line says)
    "no-instruction": ({"instruction.md": None}, "no instruction.md"),
    "empty-instruction": ({"instruction.md": "  \n"}, "instruction.md is empty"),
    "no-tests": ({"tests/test.sh": None}, "no tests/test.sh (the verifier)"),
    "bad-toml": ({"task.toml": "[agent\n"}, "task.toml is not valid TOML"),
    "bad-timeout": (
        {"task.toml": "[agent]\ntimeout_sec = -1\n"},
        "task.toml: [agent] timeout_sec must be a positive number of seconds, not -1",
    ),
    "bad-memory": (
        {"task.toml": '[environment]\nmemory = "lots"\n'},
        "task.toml: [environment] memory 'lots' is not like '4G' or '512M'",
    ),
    "no-environment": (
        {"environment/Dockerfile": None},
        "no environment/Dockerfile and no [environment] docker_image",
    ),
}


def test_every_bad_task_is_one_line_before_anything_starts(tmp_path, capsys, stack_starts):  # noqa: F811
    data = tmp_path / "tasks"
    _task(data, "fine")
    for name, (files, _) in BAD.items():
        _task(data, name, files=files)
    out = tmp_path / "out"
    assert main(["run", "--data", str(data), "--out", str(out)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == len(BAD), err
    for line, (name, (_, why)) in zip(err, sorted(BAD.items()), strict=True):
        assert line.startswith(f"error: data: {data / name}: ") and why in line, (line, why)
    assert stack_starts == []
    assert sorted(p.name for p in out.iterdir()) == ["lock"]  # nothing to resume
