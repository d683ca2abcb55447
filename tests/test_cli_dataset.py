"""`run`'s dataset: every row checked as it is read (one line per bad row, before anything
starts), and streamed: its requests are journaled in one pass, then submitted from the journal
a window at a time, so a run holds neither the file nor its requests (bench/run_memory.py
measures the memory). An interrupted run leaves what it never submitted to `--resume`."""

from __future__ import annotations

import json
import signal
import time

import pytest

from agentcore_rollout import (
    EngineStats,
    Outcome,
    RolloutBatch,
    RolloutEngine,
    RolloutOutcome,
    RolloutRequest,
)
from agentcore_rollout.cli import main
from agentcore_rollout.cli.dataset import MAX_SHOWN
from agentcore_rollout.cli.feed import Feed
from agentcore_rollout.cli.journal import Journaled
from agentcore_rollout.cli.summary import GroupFigures, RunSummary, Tally

from .conftest import engine_config
from .test_cli import _cli

pytestmark = pytest.mark.component

FAST_STACK = (  # the local stack, quick to start: one in-process agent app, no policy calls
    "local.app=tests.agents.basic:app",
    "local.mode=in_process",
    "local.policy_workers=1",
    "local.gateway=false",
)


@pytest.fixture
def stack_starts(monkeypatch) -> list[object]:
    """Records every LocalStack the CLI constructs (and refuses to start one)."""
    made: list[object] = []

    def refuse(config: object, **_: object) -> None:
        made.append(config)
        raise RuntimeError("the test refuses to start the local stack")

    monkeypatch.setattr("agentcore_rollout.local.stack.LocalStack", refuse)
    return made


# Hostile rows: (the line's bytes, what its error says); None: a good row.
ROWS: list[tuple[bytes, str | None]] = [
    (b'{"id": "p1", "a": 1}', None),
    (b'{"a": 2, "_rollout": {"request_id": "x"}}', "must not hold the '_rollout' key"),
    (b"[1, 2]", "expected a JSON object"),
    (json.dumps({"id": "x" * 129}).encode(), "id is 129 characters, more than 128"),
    (b'{"id": ["a"]}', "id must be a string or a number"),
    (b'{"id": "nan", "a": NaN}', "payload is not JSON"),
    (b'{"id": "p1", "a": 3}', "duplicate id 'p1' (first on line 1)"),
    (b'{"id": "cut", "a": ', "not valid JSON (Expecting value)"),
    (b"[" * 100_000, "not valid JSON (nested too deeply)"),
    (b'{"id": "caf\xe9"}', "not UTF-8 text (byte 11)"),
    (b"", None),
    (b'{"id": 12, "a": 4}', None),
]


def test_every_bad_row_is_named_in_one_line_before_anything_starts(tmp_path, capsys, stack_starts):
    data, out = tmp_path / "hostile.jsonl", tmp_path / "out"
    data.write_bytes(b"\n".join(line for line, _ in ROWS) + b"\n")
    assert main(["run", "--data", str(data), "--out", str(out)]) == 2
    err = capsys.readouterr().err.splitlines()
    expected = [(n, why) for n, (_, why) in enumerate(ROWS, start=1) if why]
    assert len(err) == len(expected), err
    for line, (number, why) in zip(err, expected, strict=True):
        assert line.startswith(f"error: data: {data}:{number}: ") and why in line, line
    assert stack_starts == []
    assert sorted(p.name for p in out.iterdir()) == ["lock"]  # nothing to resume


def test_past_the_first_bad_rows_the_rest_are_counted(tmp_path, capsys, stack_starts):
    data = tmp_path / "many.jsonl"
    data.write_text("[]\n" * (MAX_SHOWN + 5))
    assert main(["run", "--data", str(data), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == MAX_SHOWN + 1 and err[MAX_SHOWN - 1].startswith(f"error: data: {data}:20:")
    assert err[-1] == f"error: data: {data}: {MAX_SHOWN + 5} bad rows, 5 more not shown"
    assert stack_starts == []


@pytest.mark.e2e
def test_a_rollout_key_is_one_line_and_exit_2_from_the_real_cli(tmp_path):
    data, out = tmp_path / "data.jsonl", tmp_path / "out"
    data.write_text('{"question": "What is 1 + 1?", "_rollout": {"sig_key": "mine"}}\n')
    proc = _cli("run", "--data", str(data), "--out", str(out), *FAST_STACK)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 2, stderr
    assert stderr == (
        f"error: data: {data}:1: payload must not hold the '_rollout' key: the engine writes it\n"
    )
    assert stdout == "" and sorted(p.name for p in out.iterdir()) == ["lock"]


async def test_a_feed_keeps_at_most_its_window_in_the_engine(moto, channel, emulator):
    """Jobs are pulled from their iterator only as room opens, and the engine never holds
    more than the window: memory is bounded by the window, not by the dataset."""
    emu = await emulator()
    pulled, peak = [], 0

    def jobs():
        for i in range(40):
            pulled.append(i)
            yield Journaled(RolloutRequest({"a": i, "b": 1, "sleep": 0.05}, f"g{i}"), 0)

    async with RolloutEngine(engine_config(moto, channel, emu, max_live_sessions=2)) as engine:

        def submit(job: Journaled):
            nonlocal peak
            handle = engine.submit(job.request)
            peak = max(peak, len(engine._requests))  # the engine's running requests
            return handle

        ended: list[RolloutOutcome] = []
        async for outcome in Feed(jobs(), submit, window=4):
            ended.append(outcome)
            if len(ended) == 1:
                assert len(pulled) == 4  # the window's, not the dataset
    assert peak == 4
    ended_by = {o.request.input_id: o for o in ended}
    assert len(ended) == 40 and {o.outcome for o in ended} == {Outcome.OK}
    assert sorted(o.request.input_id for o in ended) == sorted(f"g{i}" for i in range(40))
    # The run's summary, from a tally of the outcomes (not the outcomes), has a batch's figures.
    tally, batch = Tally(), RolloutBatch(0, ended, EngineStats(), 2.0)
    for outcome in ended:
        tally.add(outcome)
    summary = RunSummary.of(tally, EngineStats(), 2.0, interrupted=False)
    assert 0.0 in {o.reward for o in ended}  # a zero reward is a reward
    assert summary.reward_mean == pytest.approx(batch.reward_mean)
    assert summary.outcomes == batch.counts and summary.latency_s == batch.latency()
    assert summary.throughput_per_s == batch.throughput and summary.requests == 40
    assert summary.groups["g3"] == GroupFigures(n=1, ok=1, reward_mean=ended_by["g3"].reward)


@pytest.mark.e2e
def test_an_interrupt_leaves_what_was_never_submitted_to_resume(tmp_path):
    """12 rows through a window of 2 (one live session): Ctrl-C while rows 2 and 3 are in the
    engine cancels those two; rows 4-11 were never submitted. `--resume` runs them all: the
    ones the interrupt cancelled too (their `cancelled` lines go)."""
    data, out = tmp_path / "data.jsonl", tmp_path / "out"
    rows = [
        {"id": f"r{i}", "a": i, "b": 1, "sleep": 6.0 if i in (2, 3) else 0.0} for i in range(12)
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ("--n", "1", *FAST_STACK, "engine.dispatch.max_live_sessions=1")
    proc = _cli("run", "--data", str(data), "--out", str(out), *argv)
    sink, give_up = out / "rollouts.jsonl", time.monotonic() + 120
    while not (sink.exists() and len(sink.read_text().splitlines()) >= 2):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < give_up, "the fast rows did not end in time"
        time.sleep(0.2)
    time.sleep(1.0)  # row 2 running, row 3 waiting for the live session
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr[-3000:]
    journal = [json.loads(line) for line in (out / "journal.jsonl").read_text().splitlines()]
    assert [e["input_id"] for e in journal if e["kind"] == "request"] == [r["id"] for r in rows]
    first = {line["input_id"]: line["outcome"] for line in map(json.loads, sink.open())}
    assert first == {"r0": "ok", "r1": "ok", "r2": "cancelled", "r3": "cancelled"}
    assert [json.loads(line).get("interrupted") for line in sink.open()] == [None, None, True, True]

    resumed = _cli("run", "--resume", str(out), *argv)
    _, stderr = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, stderr[-3000:]
    lines = [json.loads(line) for line in sink.read_text().splitlines()]
    assert sorted(line["input_id"] for line in lines) == sorted(r["id"] for r in rows)  # once each
    assert {line["input_id"]: line["outcome"] for line in lines} == {r["id"]: "ok" for r in rows}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["requests"] == 12 and summary["outcomes"]["ok"] == 12
    assert summary["run_again"] == 2 and summary["resumed_after"] == 2


@pytest.mark.e2e
def test_an_interrupt_while_the_dataset_is_read_is_one_line_and_leaves_no_run(tmp_path):
    """Ctrl-C during the check-and-journal pass (300,000 rows, about 6 s): exit 130, one line,
    and no journal, so neither a partial run to resume nor a folder to --overwrite."""
    data, out = tmp_path / "data.jsonl", tmp_path / "out"
    data.write_text("".join(f'{{"a": {i}, "b": 1}}\n' for i in range(300_000)))
    proc = _cli("run", "--data", str(data), "--out", str(out), *FAST_STACK)
    staged, give_up = out / "journal.jsonl.new", time.monotonic() + 60
    while not (staged.exists() and staged.stat().st_size > 0):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < give_up, "the journal was never started"
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1] == f"interrupted while reading {data}: nothing started"
    assert sorted(p.name for p in out.iterdir()) == ["lock"]
    resumed = _cli("run", "--resume", str(out))
    _, stderr = resumed.communicate(timeout=60)
    assert resumed.returncode == 2 and "no journal.jsonl there (not a run's output)" in stderr
