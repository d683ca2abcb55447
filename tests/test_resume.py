"""Resume: an engine SIGKILLed mid-run, then `agentcore-rollout run --resume OUT`. Every
request ends in exactly one outcome, and no agent runs twice: results written while no engine
listened are collected from S3, sessions still running are waited for, and only requests that
never started are dispatched. Counted at the AgentCore Runtime emulator."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from agentcore_rollout import RolloutEngine, RolloutRequest
from agentcore_rollout.local.moto import LOCAL_CREDENTIALS

from .agents.basic import expected_reward
from .conftest import REGION, engine_config

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent


LIMIT = 16 * 1024  # bytes any one file may reach in a run that hits the limit: about 3 rows


async def _cli(*args: str, cwd: Path, limited: bool = False) -> asyncio.subprocess.Process:
    env = {**os.environ, **LOCAL_CREDENTIALS, "AWS_DEFAULT_REGION": REGION, "PYTHONPATH": str(ROOT)}
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agentcore_rollout.cli",
        *args,
        cwd=cwd,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        preexec_fn=_limit_file_size if limited else None,
    )


async def _ended(proc: asyncio.subprocess.Process) -> tuple[int | None, str]:
    _, stderr = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode, stderr.decode()


def _limit_file_size() -> None:
    """In the child: writes past LIMIT fail with EFBIG (SIGXFSZ ignored, as Python does)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))


async def test_sigkilled_run_resumes_without_running_an_agent_twice(
    moto, channel, emulator, tmp_path
):
    emu = await emulator()
    slow = 8.0  # seconds: a slow session started before the kill still runs at the takeover
    rows = [{"a": i, "b": 1, "sleep": 0.1 if i < 4 else slow} for i in range(10)]
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    engine = engine_config(
        moto, channel, emu, exp_id="resume", start_rate=2.0, rollout_timeout=30.0
    ).model_dump(mode="json")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"stack": "aws", "engine": engine}))
    out = tmp_path / "out"
    argv = ["--config", str(config), "--env-file", str(tmp_path / "none.env")]
    (tmp_path / "none.env").write_text("")
    s3 = moto.client("s3")

    first = await _cli(
        "run", *argv, "--data", str(data), "--n", "1", "--out", str(out), cwd=tmp_path
    )
    give_up = time.monotonic() + 60
    # Kill once the fast four have written their results and two slow ones are running.
    while _results(s3, channel.bucket) < 4 or len(emu.sessions.started) < 6:
        assert first.returncode is None, (await first.communicate())[1][-2000:]
        assert time.monotonic() < give_up, "no results in time"
        await asyncio.sleep(0.1)
    first.kill()  # SIGKILL: no cleanup, no stops, sessions keep running
    await first.wait()
    invoked_before = Counter(emu.sessions.started)
    written_before = _results(s3, channel.bucket)
    journal = (out / "journal.jsonl").read_text()
    assert journal.count('"kind": "request"') == 10 and '"kind": "started"' in journal

    resumed = await _cli("run", *argv, "--resume", str(out), cwd=tmp_path)
    _, stderr = await asyncio.wait_for(resumed.communicate(), 90)
    assert resumed.returncode == 0, stderr.decode()[-3000:]

    lines = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert sorted(line["request_id"] for line in lines) == sorted(
        json.loads(j)["request_id"] for j in journal.splitlines() if '"request"' in j
    )
    assert all(line["outcome"] == "ok" for line in lines), [line["error"] for line in lines]
    for line in lines:  # each line is its own request's result: "a+b" and the reward agree
        a = int(line["result"]["trajectory"]["messages"][0]["content"].split("+")[0])
        assert line["reward"] == expected_reward({"a": a, "b": 1})
    # At the kill some had written, some were running, some had not started ...
    assert written_before < len(invoked_before) < 10
    # ... and still no agent ran twice: one session per request, across both engines.
    invoked = Counter(emu.sessions.started)
    assert set(invoked.values()) == {1} and len(invoked) == 10
    summary = json.loads((out / "summary.json").read_text())
    assert summary["requests"] == 10 and summary["outcomes"]["ok"] == 10
    # A session taken over still running costs from its journaled start, not the takeover:
    # at least its agent's sleep. (One found written at the takeover cost the first run.)
    started = {json.loads(j)["request_id"] for j in journal.splitlines() if '"started"' in j}
    taken_over = [
        line["cost"]["sandbox_seconds"]
        for line in lines
        if line["request_id"] in started
        and int(line["result"]["trajectory"]["messages"][0]["content"].split("+")[0]) >= 4
        and line["cost"]["sandbox_seconds"] > 0
    ]
    assert taken_over and all(seconds >= slow for seconds in taken_over), taken_over


async def test_resume_collects_a_result_already_in_s3_without_invoking(moto, channel, emulator):
    """Library API: a request whose agent finished while no engine listened."""
    emu = await emulator()
    cfg = engine_config(moto, channel, emu, run_secret="s" * 32)
    request = RolloutRequest({"a": 3, "b": 1}, input_id="g")
    async with RolloutEngine(cfg) as first:
        journaled = []
        done = await first.submit(request, on_start=journaled.append)
    assert done.outcome == "ok" and [s.request for s in journaled] == [request]
    assert journaled[0].deadline == done.deadline and journaled[0].started_at == done.started_at
    async with RolloutEngine(cfg) as second:  # same exp_id and run_secret
        again = await second.resume(journaled[0])
    assert again.outcome == "ok" and again.reward == expected_reward(request.payload)
    assert again.started_at is None  # collected, not run
    assert emu.counts["invoke"] == 1


async def test_a_failed_write_loses_nothing_and_resume_recovers_each_result_once(
    moto, channel, emulator, tmp_path
):
    # Each start takes 0.3 s, so when a row fails a start is likely under way: it must not be
    # cancelled mid-invocation (its session stopped unjournaled, its agent run again).
    emu = await emulator(cold_start=0.3)
    # Rows of ~4.6 KB (the agent returns a 4,000-byte trajectory): the fourth passes LIMIT.
    rows = [{"a": i, "b": 1, "sleep": 0.5, "mode": "big", "size": 4000} for i in range(12)]
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    engine = engine_config(
        moto, channel, emu, exp_id="full", start_rate=20.0, max_live_sessions=4
    ).model_dump(mode="json")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"stack": "aws", "engine": engine}))
    (tmp_path / "none.env").write_text("")
    out = tmp_path / "out"
    argv = ["--config", str(config), "--env-file", str(tmp_path / "none.env")]

    # Requests too many to journal (their lines pass LIMIT): refused, nothing started.
    padded = tmp_path / "padded.jsonl"
    padded.write_text("".join(json.dumps({**r, "pad": "x" * 2000}) + "\n" for r in rows))
    run = ["run", *argv, "--n", "1", "--out", str(out)]
    code, stderr = await _ended(await _cli(*run, "--data", str(padded), cwd=tmp_path, limited=True))
    assert (
        code == 2
        and "Traceback" not in stderr
        and stderr.strip().splitlines()[-1]
        == (f"error: run.out: cannot write {out}/journal.jsonl: File too large")
    ), stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["lock"] and emu.sessions.started == []

    # A fresh run may take the folder (nothing ran there); this one's rows pass LIMIT mid-run.
    code, stderr = await _ended(await _cli(*run, "--data", str(data), cwd=tmp_path, limited=True))
    assert code == 4, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert stderr.strip().splitlines()[-1] == (
        f"error: cannot write {out}/rollouts.jsonl: File too large; no result is lost (they "
        f"are in S3): once {out} is writable, agentcore-rollout run --resume {out}"
    )
    written = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert 0 < len(written) < 12  # every line whole: each parses
    summary = json.loads((out / "summary.json").read_text())
    assert summary["write_error"] == f"cannot write {out}/rollouts.jsonl: File too large"
    # It stopped starting sessions, and every one it started finished into S3.
    started = Counter(emu.sessions.started)
    assert len(written) < len(started) < 12 and set(started.values()) == {1}
    s3 = moto.client("s3")
    in_s3 = s3.list_objects_v2(Bucket=channel.bucket, Prefix="rollouts/full/")["KeyCount"]
    assert in_s3 == len(started)

    code, stderr = await _ended(await _cli("run", *argv, "--resume", str(out), cwd=tmp_path))
    assert code == 0, stderr[-3000:]
    lines = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    per_request = Counter(line["request_id"] for line in lines)
    assert len(per_request) == 12 and set(per_request.values()) == {1}  # no row twice
    assert [line["outcome"] for line in lines] == ["ok"] * 12
    # Collected from S3, not run again: one invocation per request across both runs.
    invoked = Counter(emu.sessions.started)
    assert len(invoked) == 12 and set(invoked.values()) == {1}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["outcomes"]["ok"] == 12 and summary["resumed_after"] == len(written)
    assert "write_error" not in summary


def _results(s3, bucket: str) -> int:
    return s3.list_objects_v2(Bucket=bucket, Prefix="rollouts/resume/").get("KeyCount", 0)


async def test_a_failed_write_on_the_embedded_stack_says_which_results_end_with_it(tmp_path):
    """The embedded stack's S3 is moto inside the run: the message must not promise the
    results that ended after the failed write; it names how many there were."""
    rows = [{"a": i, "b": 1, "sleep": 0.3, "mode": "big", "size": 4000} for i in range(12)]
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    stack = ["local.app=tests.agents.basic:app", "local.mode=in_process", "local.gateway=false"]
    stack += ["local.policy_workers=1", "engine.dispatch.max_live_sessions=4"]
    run = ["run", "--data", str(data), "--n", "1", "--out", str(out), *stack]
    code, stderr = await _ended(await _cli(*run, cwd=ROOT, limited=True))
    assert code == 4 and "Traceback" not in stderr, stderr[-3000:]
    written = len((out / "rollouts.jsonl").read_text().splitlines())
    last = stderr.strip().splitlines()[-1]
    assert "no result is lost" not in last
    assert "the embedded stack's S3 ended with this run, and with it the results of the " in last
    lost = int(last.split("the results of the ")[1].split()[0])
    assert lost >= 1 and written + lost <= 12
