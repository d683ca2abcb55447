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

from agentcore_rollout import EngineStats
from agentcore_rollout.cli import main
from agentcore_rollout.cli import run as cli_run
from agentcore_rollout.cli.config import load_config
from agentcore_rollout.cli.dataset import read_rows
from agentcore_rollout.cli.errors import UsageError
from agentcore_rollout.cli.summary import RunSummary
from examples.math_agent.app import grade, leads_with_number, reward_for

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
RUNTIME_ARN = "arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/test_agent-abc123"


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


@pytest.mark.e2e
def test_run_on_the_local_stack_writes_consistent_outputs(tmp_path):
    data = tmp_path / "data.jsonl"
    rows = [
        {"id": "g1", "question": "What is 2 + 3?", "answer": 5},
        {"question": "What is 9 - 4?", "answer": 5, "format_weight": 0.5},
    ]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "out"
    proc = _cli(
        "run",
        "--data",
        str(data),
        "--n",
        "3",
        "--out",
        str(out),
        "engine.dispatch.max_live_sessions=3",
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
        formatted = sum(map(leads_with_number, answers)) / len(answers)
        weight = 0.5 if line["input_id"] == "line-2" else 0.0  # its row's format_weight
        reward = reward_for(correct, len(answers), 0.25) + weight * formatted
        assert line["reward"] == pytest.approx(reward, abs=1e-12)
        components = result["rewards"]["components"]
        assert components["turns"] == len(answers) and components["format"] == formatted
        trace = line["trace"]  # through the gateway, sglang-router and two policy workers
        assert trace["token_capture"] is True and trace["num_turns"] == len(answers)
        assert all(turn["ignored"] == [] for turn in trace["turns"])  # the OpenAI SDK's fields
        assert sum(s["num_sampled"] for s in trace["samples"]) >= len(answers)
        assert "sig" not in result and "sig_key" not in json.dumps(line)
    assert summary["groups"]["g1"]["n"] == 3 and "p99" in summary["latency_s"]
    assert summary["api_calls"]["bedrock-agentcore:InvokeAgentRuntime"] == 6
    assert "reward mean per group" in stderr
    # what the run cost: each row's tokens are its trace's; summary.json holds their sums
    for line in lines:
        usage, cost = line["trace"]["usage"], line["cost"]
        assert (cost["prompt_tokens"], cost["completion_tokens"]) == (
            usage["prompt_tokens"],
            usage["completion_tokens"],
        )
        assert 0 < cost["sandbox_seconds"] < line["latency"] and cost["usd"] > 0
    cost = summary["cost"]
    assert cost["rollouts"] == 6 and cost["untraced"] == 0
    assert cost["prompt_tokens"] == sum(r["cost"]["prompt_tokens"] for r in lines) > 0
    assert cost["sandbox_seconds"] == pytest.approx(
        sum(r["cost"]["sandbox_seconds"] for r in lines)
    )
    assert cost["usd_per_ok"] == pytest.approx(cost["usd"] / 6)
    assert "sandbox seconds" in stderr and "est. cost USD" in stderr
    names = sorted(p.name for p in out.iterdir())
    assert names == ["journal.jsonl", "lock", "rollouts.jsonl", "run_secret", "summary.json"]
    assert (out / "run_secret").stat().st_mode & 0o077 == 0  # readable by its owner only


@pytest.mark.e2e
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_cancels_cleanly_and_leaves_nothing_behind(tmp_path, sig):
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
        "engine.dispatch.max_live_sessions=6",
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
    proc.send_signal(sig)
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
        (
            ["engine.dispatch.start_rate=0"],
            "config: engine.dispatch.start_rate: Input should be greater than 0",
        ),
        (["engine.bogus=1"], "config: engine.bogus: Extra inputs are not permitted"),
        (["stack=aws"], "config: engine.bucket is not set"),
        (
            [
                "stack=aws",
                "engine.bucket=b-1",
                "engine.queue_url=http://127.0.0.1:9/q",
                f"engine.runtime_arn={RUNTIME_ARN}",
                "engine.service_urls.s3=http://127.0.0.1:9",
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


@pytest.fixture
def stack_starts(monkeypatch) -> list[object]:
    """Records every LocalStack the CLI constructs (and refuses to start one)."""
    made: list[object] = []

    class RecordingStack:
        def __init__(self, config: object, **_: object) -> None:
            made.append(config)
            raise RuntimeError("the test refuses to start the local stack")

    monkeypatch.setattr("agentcore_rollout.local.stack.LocalStack", RecordingStack)
    return made


@pytest.fixture
def dataset(tmp_path) -> Path:
    path = tmp_path / "data.jsonl"
    path.write_text('{"id": "p1", "a": 1, "b": 2}\n{"a": 3, "b": 4}\n')
    return path


# Careless input to `run`: (arguments, the error it must give); `{...}` names files the test
# makes: {latin1} is not UTF-8, {a_file} is a file, {dupes} repeats an id, {tmp} a directory.
CARELESS = {
    "latin1 config": (["--config", "{latin1}"], "config: {latin1} is not UTF-8 text (byte 11)"),
    "latin1 data": (["--data", "{latin1}"], "data: {latin1}:1: not UTF-8 text (byte 11)"),
    "latin1 env file": (["--env-file", "{latin1}"], "config: {latin1} is not UTF-8 text"),
    "missing env file": (["--env-file", "{tmp}/nope"], "--env-file {tmp}/nope: not a file"),
    "config is a directory": (["--config", "{tmp}"], "config: cannot read {tmp}: Is a directory"),
    "out is a file": (["--out", "{a_file}"], "run.out: {a_file} exists and is not a directory"),
    "out under a file": (["--out", "{a_file}/x"], "cannot write {a_file}/x: Not a directory"),
    "inf": (
        ["engine.dispatch.start_rate=inf"],
        "engine.dispatch.start_rate: Input should be a finite number",
    ),
    "nan": (
        ["engine.limits.rollout_timeout=nan"],
        "engine.limits.rollout_timeout: Input should be a finite",
    ),
    "bucket": (["local.bucket=hx"], "config: local.bucket: not a valid S3 bucket name"),
    "queue": (["local.queue=a.b"], "config: local.queue: not a valid SQS queue name"),
    "runtime arn": (["engine.runtime_arn=arn:aws:x"], "engine.runtime_arn: not an AgentCore"),
    "duplicate ids": (["--data", "{dupes}"], "{dupes}:2: duplicate id '7' (first on line 1)"),
    "min ok fraction": (["run.min_ok_fraction=2"], "run.min_ok_fraction: Input should be less"),
    "unknown option": (["--bogus"], "unrecognized arguments: --bogus"),
    "bad --n": (["--n", "x"], "argument --n: invalid int value: 'x'"),
}


@pytest.mark.parametrize("name", list(CARELESS))
def test_careless_input_is_one_line_and_starts_nothing(
    name, tmp_path, dataset, capsys, stack_starts
):
    files = {
        "latin1": tmp_path / "latin1.txt",
        "a_file": tmp_path / "a-file",
        "dupes": tmp_path / "dupes.jsonl",
        "tmp": tmp_path,
    }
    files["latin1"].write_bytes(b'{"id": "caf\xe9"}\n')
    files["a_file"].write_text("")
    files["dupes"].write_text('{"id": 7, "a": 1}\n{"id": "7", "a": 2}\n')
    args, message = CARELESS[name]
    args = [arg.format(**files) for arg in args]
    code = main(["run", "--data", str(dataset), "--out", str(tmp_path / "out"), *args])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: ") and message.format(**files) in err, err
    assert len(err.splitlines()) == 1, err
    assert stack_starts == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["stack=aws"], "train: trains the local toy policy, so it needs stack: local"),
        (["train.min_ok=9"], "train: GroupPolicy: min_ok must be in [1, n=8], got 9"),
        (["--steps", "0"], "config: train.steps: Input should be greater than or equal to 1"),
        (["--max-staleness", "-1"], "config: engine.limits.max_staleness: Input should be greater"),
        (
            ["--async", "--max-staleness", "0"],
            "config: train.asynchronous needs engine.limits.max_staleness >= 1",
        ),
        (
            ["engine.limits.stale_policy=drop"],
            "config: engine.limits.stale_policy: Input should be 'end' or 'keep'",
        ),
        (["--data", "{tmp}/none.jsonl"], "data: cannot read {tmp}/none.jsonl"),
        (["--out", "{a_file}"], "train.out: {a_file} exists and is not a directory"),
    ],
)
def test_train_checks_its_input_before_anything_starts(
    args, message, tmp_path, capsys, stack_starts, monkeypatch
):
    monkeypatch.setattr("agentcore_rollout.local.trainer.LocalStack", stack_starts.append)
    (tmp_path / "a-file").write_text("")
    files = {"tmp": tmp_path, "a_file": tmp_path / "a-file"}
    argv = ["train", "--out", str(tmp_path / "out"), *(a.format(**files) for a in args)]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("error: ") and message.format(**files) in err, err
    assert stack_starts == []


@pytest.mark.parametrize(
    ("args", "staleness", "policy"),
    [
        ([], 1, "keep"),
        (["--max-staleness", "2"], 2, "keep"),
        (["--max-staleness=3", "engine.limits.stale_policy=end"], 3, "end"),
    ],
)
def test_train_async_keeps_stale_rollouts_bounded_at_one_unless_told(
    args, staleness, policy, monkeypatch
):
    seen = []
    monkeypatch.setattr(
        "agentcore_rollout.cli.train.train_command", lambda c, **_: seen.append(c) or 0
    )
    assert main(["train", "--async", *args]) == 0
    (config,) = seen
    limits = config.engine.limits
    assert config.train.asynchronous
    assert (limits.max_staleness, limits.stale_policy) == (staleness, policy)


def test_overrides_go_anywhere_and_a_stack_that_fails_leaves_no_run_behind(
    tmp_path, dataset, capsys, stack_starts
):
    out = tmp_path / "out"
    argv = ["run", "--n", "2", "local.cold_start=0.5", "--out", str(out), "--data", str(dataset)]
    for _ in range(2):  # the second run is not refused: the first left no run's output
        assert main([*argv, "local.max_sessions=7"]) == 2
        err = capsys.readouterr().err
        assert err == "error: the test refuses to start the local stack\n", err
        assert sorted(p.name for p in out.iterdir()) == ["lock"]
    local = stack_starts[0]
    assert local.cold_start == 0.5 and local.max_sessions == 7


def test_a_dataset_the_run_would_write_is_refused_and_left_as_it_was(
    tmp_path, dataset, capsys, stack_starts
):
    """Re-rolling an earlier run's rows into its own folder: its rollouts.jsonl is the input."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "journal.jsonl").write_text('{"kind": "request"}\n')
    rows = out / "rollouts.jsonl"
    rows.write_bytes(dataset.read_bytes())
    code = main(["run", "--data", str(rows), "--out", str(out), "--overwrite"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"run.data: {rows} is {out}/rollouts.jsonl, which this run writes" in err
    assert rows.read_bytes() == dataset.read_bytes() and stack_starts == []
    elsewhere = out / "data.jsonl"  # a dataset inside the folder is only read
    elsewhere.write_bytes(dataset.read_bytes())
    assert main(["run", "--data", str(elsewhere), "--out", str(out), "--overwrite"]) == 2
    assert "the test refuses to start the local stack" in capsys.readouterr().err
    assert elsewhere.read_bytes() == dataset.read_bytes()
    assert rows.read_bytes() == dataset.read_bytes()  # the stack never started: untouched


@pytest.mark.component
@pytest.mark.parametrize(
    ("app", "message"),
    [
        ("nosuchmodule:app", "cannot load agent app 'nosuchmodule:app': No module named"),
        ("examples.math_agent.app:nope", "has no attribute 'nope'"),
    ],
)
def test_an_agent_app_that_cannot_load_is_one_line_before_the_stack_starts(
    app, message, tmp_path, dataset, capsys, monkeypatch
):
    monkeypatch.chdir(ROOT)
    started = []
    monkeypatch.setattr("agentcore_rollout.local.moto.MotoServer.start", started.append)
    out = tmp_path / "out"
    code = main(["run", "--data", str(dataset), "--out", str(out), f"local.app={app}"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("error: config: local.app: ") and message in err, err
    assert started == [] and sorted(p.name for p in out.iterdir()) == ["lock"]


def test_default_config_is_configs_local_yaml_in_the_repository_only(
    tmp_path, dataset, monkeypatch
):
    """No --config, no $AGENTCORE_ROLLOUT_CONFIG: configs/local.yaml from the repository root;
    anywhere else the built-in defaults (what configs/engine.yaml lists)."""
    seen = []

    async def recording_run(config, begin, run, *, interrupted):
        seen.append((config, begin.total))
        raise RuntimeError("the test stops here")

    monkeypatch.setattr(cli_run, "roll_out", recording_run)
    env_file = tmp_path / "empty.env"
    env_file.write_text("")
    argv = ["run", "--data", str(dataset), "--env-file", str(env_file), "--out", str(tmp_path)]
    other = tmp_path / "other.yaml"
    other.write_text("engine:\n  exp_id: from-the-variable\n")
    for cwd, variable in [(ROOT, ""), (tmp_path, None), (tmp_path, str(other))]:
        monkeypatch.chdir(cwd)
        if variable is None:
            monkeypatch.delenv("AGENTCORE_ROLLOUT_CONFIG", raising=False)
        else:
            monkeypatch.setenv("AGENTCORE_ROLLOUT_CONFIG", variable)  # empty: unset
        assert main([*argv, "--n", "3"]) == 2
    repo, elsewhere, chosen = (config for config, _ in seen)
    shipped = load_config(ROOT / "configs/local.yaml", env_file=None, environ={})
    assert repo.engine == shipped.engine and repo.engine.exp_id == "local-demo"
    builtin = load_config(None, env_file=None, environ={})
    assert elsewhere.engine == builtin.engine and elsewhere.engine.exp_id == "default"
    assert chosen.engine.exp_id == "from-the-variable"
    assert [n for _, n in seen] == [6, 6, 6]  # 2 rows x --n 3


def test_dataset_ids_name_groups(tmp_path):
    data = tmp_path / "ids.jsonl"
    rows = ['{"id": "g"}', '{"id": 7}', '{"id": null}', "{}", '{"id": ""}', '{"q": "a\u2028b"}']
    data.write_text("\ufeff" + "\n".join(rows) + "\n\n")  # a BOM, a U+2028 in a string
    ids = [input_id for input_id, _ in list(read_rows(data))]
    assert ids == ["g", "7", "line-3", "line-4", "line-5", "line-6"]
    data.write_text('{"id": [1]}\n')
    with pytest.raises(UsageError, match=r"ids.jsonl:1: id must be a string or a number"):
        list(read_rows(data))


@pytest.mark.parametrize(
    ("ok", "requests", "min_ok_fraction", "interrupted", "code"),
    [
        (1, 2, 0.5, False, 0),
        (0, 2, 0.5, False, 3),
        (3, 10, 0.3, False, 0),  # the boundary holds despite float rounding
        (2, 10, 0.3, False, 3),
        (0, 2, 0.0, False, 0),
        (2, 2, 1.0, False, 0),
        (1, 2, 1.0, False, 3),
        (0, 2, 0.5, True, 130),
    ],
)
def test_exit_code(ok, requests, min_ok_fraction, interrupted, code):
    summary = RunSummary(
        requests, {"ok": ok}, None, {}, {}, 0.0, 0.0, {}, 0.0, {}, {}, EngineStats(), interrupted
    )
    assert cli_run.exit_code(summary, min_ok_fraction) == code


@pytest.mark.e2e
def test_a_run_with_too_few_ok_exits_3_and_still_writes_its_outputs(tmp_path):
    data = tmp_path / "failing.jsonl"
    data.write_text('{"a": 1, "b": 1, "mode": "raise"}\n{"a": 2, "b": 1, "mode": "raise"}\n')
    out = tmp_path / "out"
    proc = _cli(
        "run",
        *("--data", str(data), "--n", "1", "--out", str(out)),
        "local.app=tests.agents.basic:app",
        *("local.mode=in_process", "local.policy_workers=1", "local.gateway=false"),
    )
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 3, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert last == "error: 0 of 2 requests ended ok, fewer than run.min_ok_fraction=0.5"
    lines = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert [line["outcome"] for line in lines] == ["agent_error"] * 2
    summary = json.loads((out / "summary.json").read_text())
    assert summary["outcomes"]["agent_error"] == 2 and summary["interrupted"] is False
    assert "reward mean per group" in stderr  # the summary was printed


@pytest.mark.e2e
def test_one_run_per_folder_and_a_second_ctrl_c_exits_quietly(
    tmp_path, dataset, capsys, stack_starts
):
    data = tmp_path / "slow.jsonl"
    rows = [{"a": i, "b": 1, "sleep": 0.0 if i < 2 else 60.0} for i in range(6)]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "agentcore_rollout.cli", "run", "--data", str(data)),
            *("--n", "1", "--out", str(out), "local.app=tests.agents.basic:app"),
            # One stop per 5 s: the first Ctrl-C's clean stop lasts long enough to force.
            *("engine.dispatch.max_live_sessions=6", "engine.dispatch.stop_rate=0.2"),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    sink = out / "rollouts.jsonl"
    give_up = time.monotonic() + 120
    while not (sink.exists() and len(sink.read_text().splitlines()) >= 2):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < give_up, "no rollout finished in time"
        time.sleep(0.2)
    family = _descendants(proc.pid)

    # A second run, or `train`, on the folder in use: refused in one line naming the owner.
    for argv, key in [(["run", "--data", str(dataset)], "run.out"), (["train"], "train.out")]:
        assert main([*argv, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err == f"error: {key}: {out} is in use by another process (pid {proc.pid})\n"
    assert stack_starts == []

    proc.send_signal(signal.SIGINT)
    time.sleep(1.0)  # a gap between the two presses (either order of handling is fine)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = [json.loads(line) for line in sink.read_text().splitlines()]  # each whole
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["requests"] == len(lines) >= 2
    last = stderr.strip().splitlines()[-1]
    assert last == f"forced: exiting now; {len(lines)} requests ended, in summary.json"
    give_up = time.monotonic() + 30
    while [p for p in family if _alive(p)]:  # the stack's children exit with their parent
        assert time.monotonic() < give_up, [p for p in family if _alive(p)]
        time.sleep(0.2)

    # The lock went with the process; the folder now holds a run's output.
    fresh = ["run", "--data", str(dataset), "--out", str(out)]
    assert main(fresh) == 2
    assert capsys.readouterr().err == (
        f"error: run.out: {out} holds a run's output: --resume {out} to finish it, or "
        "--overwrite to replace it\n"
    )
    for argv in (["run", "--resume", str(out)], [*fresh, "--overwrite"]):
        assert main(argv) == 2  # past the lock and the folder's checks: the stack is next
        assert "the test refuses to start the local stack" in capsys.readouterr().err
    assert len(stack_starts) == 2
    # The overwrite never began (its stack did not start): the old run is there as it was.
    assert [json.loads(line) for line in sink.read_text().splitlines()] == lines
    journal = [json.loads(line) for line in (out / "journal.jsonl").read_text().splitlines()]
    assert all("sleep" in e["payload"] for e in journal if e["kind"] == "request")
    assert sorted(p.name for p in out.iterdir()) == [
        "journal.jsonl",
        "lock",
        "rollouts.jsonl",
        "run_secret",
        "summary.json",
    ]


def test_malformed_dataset_line_is_named(tmp_path, capsys):
    data = tmp_path / "bad.jsonl"
    data.write_text('{"question": "ok", "answer": 1}\n\n{"question": \n')
    assert main(["run", "--data", str(data), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"data: {data}:3: not valid JSON" in err.replace("\n", "")


@pytest.mark.e2e
def test_local_up_prints_endpoints_and_stops_cleanly():
    proc = _cli("local", "up")
    env: dict[str, str] = {}
    assert proc.stdout is not None
    while "AGENTCORE_ROLLOUT_SERVICE_URLS__AGENTCORE" not in env:
        line = proc.stdout.readline()
        assert line, proc.communicate()[1][-3000:]
        key, _, value = line.strip().partition("=")
        env[key] = value
    family = _descendants(proc.pid)
    import boto3

    s3 = boto3.client(
        "s3",
        endpoint_url=env["AGENTCORE_ROLLOUT_SERVICE_URLS__S3"],
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    assert (
        s3.head_bucket(Bucket=env["AGENTCORE_ROLLOUT_BUCKET"])["ResponseMetadata"]["HTTPStatusCode"]
        == 200
    )
    assert env["AGENTCORE_ROLLOUT_SERVICE_URLS__AGENTCORE"].startswith("http://127.0.0.1:")
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=30)
    assert proc.returncode == 0
    time.sleep(0.5)
    assert [p for p in family if _alive(p)] == []
