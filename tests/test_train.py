"""The RL loop closed on a laptop, through the whole pipeline (emulated AgentCore sessions, S3 and
SQS on moto, the token-capture gateway, the local policy workers):

- streaming with `max_staleness=1`: a group of step k whose results arrive after
  `set_step(k + 1)` is trained on, weighed by importance ratios; a group of step k still
  running at `set_step(k + 2)` ends stale and yields no row;
- `agentcore-rollout train` learns (fixed seeds), and on-policy samples' recomputed log-probs
  equal the captured ones;
- `train --async`: weight pushes abort turns in flight, which resume; no rollout is lost, and
  every token's log-prob is recomputed under the version that sampled it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import numpy as np
import pytest

from agentcore_rollout import Outcome, RolloutEngine
from agentcore_rollout.cli import main
from agentcore_rollout.cli.config import Config
from agentcore_rollout.local.config import LocalConfig, TrainConfig
from agentcore_rollout.local.grpo import grpo_update
from agentcore_rollout.local.policy import TinyPolicy
from agentcore_rollout.local.policy.tokenizer import IM_END_ID
from agentcore_rollout.local.stack import LocalStack
from agentcore_rollout.local.trainer import METRICS, _push, train
from agentcore_rollout.training import (
    Group,
    GroupPolicy,
    GroupRollout,
    GroupStatus,
    group_samples,
    outcome_samples,
)

from .factories import flat_config
from .test_cli import _alive, _cli, _descendants

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent


async def test_one_step_old_groups_train_off_policy_two_steps_old_go_stale(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the emulator imports the test agent from here
    local = LocalConfig(
        app="tests.agents.held:app",
        mode="in_process",
        policy_workers=1,
        record_samples=True,
        bucket="stream",
        queue="stream",
    )
    trainer = TinyPolicy(seed=0)  # what the worker serves as weight version "0"
    question = {"question": "What is 3 + 4?"}
    async with (
        LocalStack(local) as stack,
        aiohttp.ClientSession(headers=stack.policy_headers) as http,
    ):
        cfg = stack.engine_config(
            flat_config(exp_id="stream", start_rate=50.0, rollout_timeout=120.0, max_staleness=1)
        )
        worker = stack.workers[0].url
        async with (
            RolloutEngine(cfg) as engine,
            GroupRollout(engine, GroupPolicy(n=2)) as groups,
        ):
            groups.submit("soon", {**question, "hold": 6.0})  # step 0, ends after step 1 began
            groups.submit("late", {**question, "hold": 120.0})  # step 0, still running at 2
            await _until_sampled(http, worker, 4)  # every member called the policy (weights 0)
            # The trainer updates, pushes weights "1" and moves on while both groups run.
            shift = np.random.default_rng(1).normal(0, 0.5, trainer.params["bias"].shape)
            trainer.apply_update({"bias": shift}, lr=1.0)
            path = tmp_path / "step-1.npz"
            trainer.save(path)
            await _push(http, [worker], path, "1")
            engine.set_step(1)
            moved_on = time.time()
            soon = await groups.next()
            engine.set_step(2)
            late = await groups.next()
    # One step old: delivered after set_step(1), judged trainable at step 1.
    assert soon.input_id == "soon" and soon.step == 0 and soon.status is GroupStatus.TRAIN
    assert all(m.delivered_at is not None and m.delivered_at > moved_on for m in soon.kept)
    assert all(m.weight_versions == ("0",) for m in soon.kept)
    rows = group_samples(soon)
    assert rows and not any(r.on_policy("1") for r in rows)
    stats = grpo_update(trainer, rows, lr=1.0, weight_version="1")
    assert stats.tokens > 0 and stats.on_policy_samples == 0 and stats.logprob_max_abs_diff is None
    assert stats.ratio_mean != pytest.approx(1.0)  # importance-weighted: sampled by weights "0"
    # Under the weights that sampled them, the captured log-probs come back exactly.
    replay = grpo_update(TinyPolicy(seed=0), rows, lr=1.0, weight_version="0")
    assert replay.on_policy_samples == len(rows) and replay.logprob_max_abs_diff <= 1e-9
    # Two steps old: ended stale when the engine moved to step 2, never trained.
    assert late.input_id == "late" and late.status is GroupStatus.STALE
    assert [m.outcome for m in late.members] == [Outcome.STALE, Outcome.STALE]
    assert group_samples(late) == []


async def test_async_train_resumes_turns_across_updates_and_loses_no_rollout(tmp_path, monkeypatch):
    """`train --async` on the local stack: each weight push aborts the turns in flight (long
    ones always are), the gateway resumes them under the new weights, and every request ends
    ok. Each sampled token's captured log-prob equals its recomputation under the weights of
    the version that sampled it, read back from the step's saved file."""
    monkeypatch.chdir(ROOT)
    endless = TinyPolicy(seed=0)
    endless.params["bias"][IM_END_ID] = -40.0  # every turn runs to max_tokens
    endless.save(tmp_path / "endless.npz")
    config = Config(
        engine=flat_config(
            exp_id="async",
            start_rate=50.0,
            rollout_timeout=120.0,
            max_staleness=1,
            stale_policy="keep",
        ),
        local=LocalConfig(
            app="tests.agents.turns:app",
            mode="in_process",
            policy_workers=1,
            policy_params=str(tmp_path / "endless.npz"),
            token_delay=0.02,
            bucket="async",
            queue="async",
        ),
        train=TrainConfig(steps=3, n=2, groups_per_step=2, lr=1.0, asynchronous=True),
    )
    quick = {"question": "1+1?", "max_tokens": 4, "turns": 2}
    long = {"question": "2+2?", "max_tokens": 120, "turns": 2}  # ~5 s of generation
    groups: list[Group] = []
    view = SimpleNamespace(
        step_started=lambda *_: None, group_resolved=groups.append, step_ended=lambda _: None
    )
    out = tmp_path / "out"
    rows = await train(config, [("quick", quick), ("long", long)], out, view=view)

    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all(r["ok"] == r["requests"] and r["failed"] == r["stale"] == 0 for r in rows)
    assert all(c["dropped"] == 0 for r in rows for c in r["staleness"]["by_staleness"].values())
    assert sum(r["resumed_turns"] for r in rows) >= 1, rows
    assert max(r["step_lag_mean"] for r in rows) > 0  # long rollouts trained a step late
    weights: dict[str, TinyPolicy] = {}
    spanning = checked = 0
    for member in (m for g in groups for m in g.members):
        assert member.outcome is Outcome.OK
        for sample in outcome_samples(member, 0.0):
            spanning += len({v for v in sample.token_versions if v is not None}) > 1
            for start, end in sample.sampled_runs():
                context = [*sample.prompt_ids, *sample.response_ids[:start]]
                for version in set(sample.token_versions[start:end]):
                    if version not in weights:
                        weights[version] = TinyPolicy()
                        weights[version].load(out / "weights" / f"step-{int(version):04d}.npz")
                    again, _ = weights[version].logprobs_and_grad(
                        context, sample.response_ids[start:end]
                    )
                    for t in range(start, end):
                        if sample.token_versions[t] == version:
                            assert again[t - start] == pytest.approx(sample.logprobs[t], abs=1e-9)
                            checked += 1
    assert spanning >= 1 and checked > 100 and len(weights) >= 2


def test_train_learns_and_replays_captured_logprobs(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "train"
    code = main(["train", "--steps", "10", "--out", str(out), "local.policy_seed=0"])
    assert code == 0
    rows = [json.loads(line) for line in (out / METRICS).read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(10))
    first = sum(r["reward_mean"] for r in rows[:3]) / 3
    last = sum(r["reward_mean"] for r in rows[-3:]) / 3
    assert last > first + 0.15, [r["reward_mean"] for r in rows]
    for r in rows:  # max_staleness 0: every sample on-policy, its log-probs replayed exactly
        assert r["ok"] == r["requests"] == 64 and r["failed"] == r["stale"] == 0
        assert r["on_policy_samples"] == r["samples"] > 0
        assert r["logprob_max_abs_diff"] <= 1e-9
        assert r["groups_trained"] + r["groups_skipped"] == 8
        components = r["reward_components"]  # the math agent's breakdown of its reward
        assert set(components) == {"reward", "correct", "turns", "format"}
        assert components["reward"] == pytest.approx(r["reward_mean"], abs=1e-6)
        assert 0 <= components["correct"] <= 1 and 1 <= components["turns"] <= 3
        cost = r["cost"]  # what the step's rollouts cost, each traced through the gateway
        assert cost["rollouts"] == 64 and cost["untraced"] == 0 and cost["prompt_tokens"] > 0
        assert cost["sandbox_seconds"] > 0 and cost["usd"] > 0
    # each step after the first started on sessions warmed for it, asked at the last one's start
    assert rows[0]["warm_used"] == 0
    assert all(r["warm_used"] == 64 and r["warm_missed"] == 0 for r in rows[1:]), rows
    assert (out / "reward_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "weights" / "step-0010.npz").is_file()


def test_an_interrupted_train_ends_after_the_step_under_way_and_leaves_nothing(tmp_path):
    out = tmp_path / "train"
    proc = _train_past_its_first_step(out)
    metrics = out / METRICS
    family = _descendants(proc.pid)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-3000:]
    assert "stopping after the step under way" in stderr
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert 1 <= len(steps) < 50 and steps == list(range(len(steps)))
    assert (out / "reward_curve.png").is_file()
    time.sleep(0.5)
    assert [p for p in family if _alive(p)] == []


def _train_past_its_first_step(out: Path, *args: str) -> Any:
    """`train --steps 50` in a process of its own, once its first step's metrics are written."""
    proc = _cli("train", *args, "--steps", "50", "--out", str(out))
    metrics, give_up = out / METRICS, time.monotonic() + 120
    while not (metrics.exists() and metrics.read_text().count("\n") >= 1):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < give_up, "no step ended in time"
        time.sleep(0.2)
    return proc


async def _until_sampled(http: aiohttp.ClientSession, worker: str, n: int) -> None:
    give_up = time.monotonic() + 30
    while True:
        async with http.get(f"{worker}/debug/samples") as resp:
            if len((await resp.json())["samples"]) >= n:
                return
        assert time.monotonic() < give_up, "the agents never called the policy"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize(
    ("child", "said"),
    [
        ("agentcore_rollout.local.policy", "error: policy worker "),
        ("agentcore_rollout.gateway", "error: gateway 0 (pid "),
        ("agentcore_rollout.local.runtime", "error: runtime emulator (pid "),
    ],
    ids=["worker", "gateway", "emulator"],
)
def test_a_child_killed_during_async_train_is_one_line_and_keeps_what_was_trained(
    tmp_path, child, said
):
    out = tmp_path / "train"
    proc = _train_past_its_first_step(out, "--async")
    metrics = out / METRICS
    found = [
        pid
        for pid in _descendants(proc.pid)
        if f"\0-m\0{child}\0".encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]
    assert found, f"no {child} found"
    os.kill(found[0], signal.SIGKILL)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 5, stderr[-3000:]
    assert "Traceback" not in stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(said) and "steps trained" in last, last
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert steps == list(range(len(steps))) and len(steps) >= 1
    assert (out / "reward_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_train_resumes_from_its_last_step_and_refuses_to_replace_a_run_by_accident(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "train"
    argv = ["train", "--out", str(out), "local.policy_seed=0", "train.groups_per_step=2"]
    assert main([*argv, "--steps", "2"]) == 0
    first = (out / METRICS).read_text()
    kept = {p.name: p.read_bytes() for p in (out / "weights").iterdir()}
    assert sorted(kept) == ["step-0000.npz", "step-0001.npz", "step-0002.npz"]
    capsys.readouterr()

    assert main([*argv, "--steps", "4"]) == 2  # the same command again: refused, untouched
    err = capsys.readouterr().err
    assert err == (
        f"error: train.out: {out} holds a training run (2 steps): --resume to continue it, or "
        "--overwrite to replace it\n"
    )
    assert main([*argv, "--steps", "2", "--resume"]) == 2
    assert "trained 2 steps already: raise --steps" in capsys.readouterr().err
    assert (out / METRICS).read_text() == first

    assert main([*argv, "--steps", "4", "--resume"]) == 0
    rows = [json.loads(line) for line in (out / METRICS).read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3] and (out / METRICS).read_text().startswith(
        first
    )
    assert [r["weight_version"] for r in rows] == ["1", "2", "3", "4"]
    weights = {p.name: p.read_bytes() for p in (out / "weights").iterdir()}
    assert {n: weights[n] for n in kept} == kept  # the earlier steps' weights as they were
    assert sorted(set(weights) - set(kept)) == ["step-0003.npz", "step-0004.npz"]
    assert "reward mean, last 2 steps" in capsys.readouterr().err  # the summary: all 4 steps


def test_train_refuses_a_folder_that_holds_a_run(tmp_path, capsys):
    (tmp_path / "journal.jsonl").write_text('{"kind": "request"}\n')
    assert main(["train", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"error: train.out: {tmp_path} holds the output of `run`: choose another --out\n"
    )
