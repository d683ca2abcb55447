"""`agentcore-rollout` end to end: the real CLI process, the embedded stack (moto, the
runtime emulator with one agent process per session, the policy server), and its outputs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentcore_rollout.cli import main
from examples.math_agent.app import grade, reward_for

ROOT = Path(__file__).resolve().parent.parent


def _cli(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "agentcore_rollout.cli", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        **kw,
    )


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_run_on_the_local_stack_writes_consistent_outputs(tmp_path):
    data = tmp_path / "data.jsonl"
    rows = [
        {"id": "g1", "question": "What is 2 + 3?", "answer": 5},
        {"question": "What is 9 - 4?", "answer": 5},
    ]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "out"
    proc = _cli(
        "run", "--data", str(data), "--n", "3", "--out", str(out), "engine.max_live_sessions=3"
    )
    _, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 0, stderr[-3000:]
    lines = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    summary = json.loads((out / "summary.json").read_text())
    assert len(lines) == 6 and summary["requests"] == 6
    assert summary["outcomes"]["ok"] == 6, summary["outcomes"]
    assert sorted({(r["input_id"], r["sample_index"]) for r in lines}) == [
        (g, k) for g in ("g1", "line-2") for k in range(3)
    ]
    for line in lines:
        result = line["result"]
        messages = result["trajectory"]["messages"]
        answers = [m["content"] for m in messages if m["role"] == "assistant"]
        correct = grade(answers[-1], 5)
        assert line["reward"] == reward_for(correct, len(answers), 0.25)
        assert result["rewards"]["components"]["turns"] == len(answers)
        trace = line["trace"]  # through the gateway, sglang-router and two policy workers
        assert trace["token_capture"] is True and trace["num_turns"] == len(answers)
        assert sum(s["num_sampled"] for s in trace["samples"]) >= len(answers)
        assert "sig" not in result and "sig_key" not in json.dumps(line)
    assert summary["groups"]["g1"]["n"] == 3 and "p99" in summary["latency_s"]
    assert summary["api_calls"]["bedrock-agentcore:InvokeAgentRuntime"] == 6
    assert "reward mean per group" in stderr


def test_sigint_cancels_cleanly_and_leaves_nothing_behind(tmp_path):
    data = tmp_path / "slow.jsonl"
    rows = [{"a": i, "b": 1, "sleep": 0.0 if i < 2 else 60.0} for i in range(6)]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "out"
    proc = _cli(
        "run",
        "--data",
        str(data),
        "--n",
        "1",
        "--out",
        str(out),
        "local.app=tests.agents.basic:app",
        "engine.max_live_sessions=6",
    )
    sink = out / "rollouts.jsonl"
    give_up = time.monotonic() + 120
    while not (sink.exists() and len(sink.read_text().splitlines()) >= 2):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < give_up, "no rollout finished in time"
        time.sleep(0.2)
    time.sleep(1.0)  # let the slow sessions be running
    family = _descendants(proc.pid)
    assert len(family) >= 2 + 4  # moto, policy server, and the slow agents' processes
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr[-3000:]
    lines = [json.loads(line) for line in sink.read_text().splitlines()]
    outcomes = sorted(line["outcome"] for line in lines)
    assert outcomes == ["cancelled"] * 4 + ["ok"] * 2
    assert json.loads((out / "summary.json").read_text())["interrupted"] is True
    time.sleep(0.5)
    assert [p for p in family if _alive(p)] == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["engine.start_rate=0"], "config: engine.start_rate: Input should be greater than 0"),
        (["engine.bogus=1"], "config: engine.bogus: Extra inputs are not permitted"),
        (["stack=aws"], "config: engine.bucket is not set"),
        (
            [
                "stack=aws",
                "engine.bucket=b-1",
                "engine.queue_url=http://127.0.0.1:9/q",
                "engine.runtime_arn=arn",
                "engine.endpoints.s3=http://127.0.0.1:9",
            ],
            "config: cannot reach http://127.0.0.1:9",
        ),
    ],
)
def test_errors_are_one_line(args, message, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    code = main(["run", "--out", str(tmp_path), *args])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert message in err and len(err.splitlines()) == 1, err


def test_malformed_dataset_line_is_named(tmp_path, capsys):
    data = tmp_path / "bad.jsonl"
    data.write_text('{"question": "ok", "answer": 1}\n\n{"question": \n')
    assert main(["run", "--data", str(data), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"data: {data}:3: not valid JSON" in err.replace("\n", "")


def test_local_up_prints_endpoints_and_stops_cleanly():
    proc = _cli("local", "up")
    env: dict[str, str] = {}
    assert proc.stdout is not None
    while "AGENTCORE_ROLLOUT_ENDPOINTS__AGENTCORE" not in env:
        line = proc.stdout.readline()
        assert line, proc.communicate()[1][-3000:]
        key, _, value = line.strip().partition("=")
        env[key] = value
    family = _descendants(proc.pid)
    import boto3

    s3 = boto3.client(
        "s3",
        endpoint_url=env["AGENTCORE_ROLLOUT_ENDPOINTS__S3"],
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    assert (
        s3.head_bucket(Bucket=env["AGENTCORE_ROLLOUT_BUCKET"])["ResponseMetadata"]["HTTPStatusCode"]
        == 200
    )
    assert env["AGENTCORE_ROLLOUT_ENDPOINTS__AGENTCORE"].startswith("http://127.0.0.1:")
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=30)
    assert proc.returncode == 0
    time.sleep(0.5)
    assert [p for p in family if _alive(p)] == []
