"""`--env-file` (and `./agentcore.env`) reach botocore: the AWS credentials and endpoints that
`local up` prints, passed back in a file, are what a `run` with no credentials of its own
uses, through the real wire (a `local up` process, a `run` process with `stack: aws`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentcore_rollout.cli import main

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent
FAST_STACK = (
    "local.app=tests.agents.basic:app",
    "local.mode=in_process",
    "local.policy_workers=1",
    "local.gateway=false",
)
CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


@pytest.fixture(scope="module")
def printed() -> Iterator[list[str]]:
    """The lines `agentcore-rollout local up` prints, while it runs."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentcore_rollout.cli", "local", "up", *FAST_STACK],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.stdout is not None
    lines: list[str] = []
    while not any(line.startswith("AGENTCORE_ROLLOUT_SERVICE_URLS__AGENTCORE=") for line in lines):
        line = proc.stdout.readline()
        assert line, proc.communicate()[1][-3000:]
        lines.append(line.strip())
    yield lines
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=30)


def _run(env_file_lines: list[str], tmp_path: Path, *, flag: bool) -> subprocess.CompletedProcess:
    """`run` with `stack=aws` and no AWS configuration of its own (no variables, no ~/.aws, no
    instance metadata): the env file (`--env-file`, or ./agentcore.env) is all it has."""
    env_file = tmp_path / ("given.env" if flag else "agentcore.env")
    env_file.write_text("\n".join(env_file_lines) + "\n")
    data = tmp_path / "data.jsonl"
    data.write_text('{"a": 1, "b": 2}\n{"a": 3, "b": 4}\n')
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AGENTCORE_"))}
    env = clean | {
        "HOME": str(tmp_path),
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
        "AWS_EC2_METADATA_DISABLED": "true",
        "PYTHONPATH": str(ROOT),
    }
    argv = ["run", "--data", str(data), "--n", "1", "--out", str(tmp_path / "out"), "stack=aws"]
    return subprocess.run(
        [sys.executable, "-m", "agentcore_rollout.cli", *argv]
        + (["--env-file", str(env_file)] if flag else []),
        cwd=tmp_path,  # not the repository: no configs/local.yaml, the built-in defaults
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _outcomes(tmp_path: Path) -> list[str]:
    return [json.loads(line)["outcome"] for line in (tmp_path / "out/rollouts.jsonl").open()]


def test_without_the_credentials_the_run_cannot_reach_the_stack(printed, tmp_path):
    """The control: the child really has no credentials but the file's."""
    lines = [line for line in printed if not line.startswith(CREDENTIALS)]
    done = _run(lines, tmp_path, flag=True)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Unable to locate credentials" in done.stderr and len(done.stderr.splitlines()) == 1


def test_env_file_credentials_reach_the_engine(printed, tmp_path):
    done = _run(printed, tmp_path, flag=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _outcomes(tmp_path) == ["ok", "ok"]


def test_agentcore_env_with_aws_endpoint_variables(printed, tmp_path):
    """./agentcore.env, read without a flag, pointing botocore at the stack with its own
    AWS_ENDPOINT_URL_<SERVICE> variables instead of the engine's service URL keys."""
    service = {"S3": "S3", "SQS": "SQS", "AGENTCORE": "BEDROCK_AGENTCORE"}
    prefix = "AGENTCORE_ROLLOUT_SERVICE_URLS__"
    lines = [
        f"AWS_ENDPOINT_URL_{service[line[len(prefix) :].split('=')[0]]}={line.split('=', 1)[1]}"
        if line.startswith(prefix)
        else line
        for line in printed
    ]
    assert sum(line.startswith("AWS_ENDPOINT_URL_") for line in lines) == 3
    done = _run(lines, tmp_path, flag=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _outcomes(tmp_path) == ["ok", "ok"]


def test_the_process_environment_wins_over_the_env_file(tmp_path, monkeypatch):
    """Variable by variable, as for the config; an empty one in the file is unset."""
    env_file = tmp_path / "a.env"
    env_file.write_text("AWS_PROFILE=file\nAWS_SESSION_TOKEN=file\nAWS_ACCESS_KEY_ID=\n")
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID"):
        monkeypatch.setenv(name, "restored after the test")
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_PROFILE", "process")

    def refuse(config: object, **_: object) -> None:
        raise RuntimeError("the test stops before the local stack")

    monkeypatch.setattr("agentcore_rollout.local.stack.LocalStack", refuse)
    data = tmp_path / "data.jsonl"
    data.write_text('{"a": 1}\n')
    argv = ["run", "--env-file", str(env_file), "--data", str(data), "--out", str(tmp_path)]
    assert main(argv) == 2
    assert os.environ["AWS_PROFILE"] == "process"
    assert os.environ["AWS_SESSION_TOKEN"] == "file"
    assert "AWS_ACCESS_KEY_ID" not in os.environ
