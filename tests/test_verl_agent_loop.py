"""`AgentCoreAgentLoop` driven as veRL's worker drives it (one `run()` per trajectory, `uid`,
`session_id`, `global_steps` and the dataset's columns as keyword arguments), through the
real wire: the embedded stack's emulator sessions, S3 and SQS, the token-capture gateway and
the local policy workers. Every row is exactly what a worker sampled; a failed member raises
(no row is fabricated); a group below `min_group_ok` raises for every member."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from omegaconf import OmegaConf
from transformers import AutoTokenizer
from verl.experimental.agent_loop.agent_loop import DictConfigWrap

from agentcore_rollout.integrations.verl.agent_loop import (
    SERVICE_NAME,
    AgentCoreAgentLoop,
    GroupFailed,
    _local_services,
    close_services,
)
from agentcore_rollout.integrations.verl.convert import ConversionError
from agentcore_rollout.local.config import LocalConfig
from agentcore_rollout.local.moto import LOCAL_CREDENTIALS
from agentcore_rollout.local.stack import LocalStack

from .factories import flat_config, recorded_samples
from .gateway_support import TOKENIZER_DIR

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent


def _agent_loop(
    engine_yaml: Path, n: int, trainer: dict | None = None, server_manager=None, **custom
) -> AgentCoreAgentLoop:
    config = OmegaConf.create(
        {
            "trainer": trainer or {},
            "actor_rollout_ref": {
                "rollout": {
                    "n": n,
                    "prompt_length": 256,
                    "response_length": 256,
                    "custom": {"agentcore": {"config": str(engine_yaml), **custom}},
                }
            },
            "data": {},
        }
    )
    return AgentCoreAgentLoop(
        trainer_config=DictConfigWrap(config),
        server_manager=server_manager,
        tokenizer=AutoTokenizer.from_pretrained(TOKENIZER_DIR),
        processor=None,
        dataset_cls=None,
        data_config=DictConfigWrap(config.data),
    )


def _held_stack(name: str) -> LocalConfig:
    """The embedded stack running the held agent in-process, its worker recording samples."""
    return LocalConfig(
        app="tests.agents.held:app",
        mode="in_process",
        policy_workers=1,
        record_samples=True,
        bucket=name,
        queue=name,
    )


def _engine_yaml(stack: LocalStack, tmp_path: Path, exp_id: str, **settings: Any) -> Path:
    """The stack's engine config as the agent loop's `config` file reads it."""
    config = flat_config(exp_id=exp_id, start_rate=50.0, wait_time=1, **settings)
    engine = stack.engine_config(config)
    engine_yaml = tmp_path / "engine.yaml"
    engine_yaml.write_text(yaml.safe_dump({"engine": engine.model_dump(mode="json")}))
    return engine_yaml


async def _group(
    loop: AgentCoreAgentLoop, uid: str, n: int, extra_info: dict, step: int = 1
) -> list:
    """The n sessions of one prompt, as veRL's worker runs them; exceptions returned."""
    return await asyncio.gather(
        *(
            loop.run({}, uid=uid, session_id=k, global_steps=step, extra_info=extra_info)
            for k in range(n)
        ),
        return_exceptions=True,
    )


async def test_agent_loop_rows_failures_and_min_group_ok_through_the_wire(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    local = _held_stack("verl-loop")
    question = {"question": "What is 2 + 5?"}
    async with LocalStack(local) as stack:
        loop = _agent_loop(_engine_yaml(stack, tmp_path, "verl"), n=3, min_group_ok=2)
        try:
            ok, one_failed, two_failed = await asyncio.gather(
                _group(loop, "all-ok", 3, question),
                _group(loop, "one-failed", 3, {**question, "fail": [0]}),
                _group(loop, "two-failed", 3, {**question, "fail": [0, 1]}),
            )
        finally:
            await close_services()
        sampled = await recorded_samples(stack)
    # Every member of a full group returns its rows, exactly what the worker sampled.
    assert all(isinstance(rows, list) and len(rows) == 1 for rows in ok), ok
    by_output = {tuple(s["output_ids"]): s for s in sampled}
    for [row] in ok:
        tokens = [t for t, m in zip(row.response_ids, row.response_mask, strict=True) if m]
        worker = by_output[tuple(tokens)]
        assert row.prompt_ids == worker["input_ids"]
        assert row.response_logprobs == worker["output_logprobs"]
        assert row.extra_fields["min_global_steps"] == row.extra_fields["max_global_steps"]
    assert sorted(rows[0].reward_score for rows in ok) == [0.0, 0.0, 1.0]
    # One failed member: it raises (veRL tags the group failure), the two others still train.
    assert isinstance(one_failed[0], ConversionError) and "agent_error" in str(one_failed[0])
    assert all(isinstance(rows, list) and len(rows) == 1 for rows in one_failed[1:])
    # Below min_group_ok: every member raises, the one that ended ok too.
    assert all(isinstance(e, GroupFailed) for e in two_failed), two_failed
    assert "fewer than min_group_ok=2 of its 3 members" in str(two_failed[2])


async def test_the_second_steps_rollouts_start_on_sessions_warmed_during_the_update(
    tmp_path, monkeypatch
):
    """Synchronous veRL: once a step's last member ended (its batch known whole) and as each
    step begins, the service asks for the next batch's sessions; the next step's members start
    on them."""
    monkeypatch.chdir(ROOT)
    local = _held_stack("verl-warm")
    question = {"question": "What is 2 + 5?"}
    async with LocalStack(local) as stack:
        engine_yaml = _engine_yaml(stack, tmp_path, "verl-warm")
        loop = _agent_loop(engine_yaml, n=2)
        try:
            for step in (1, 2):
                groups = [_group(loop, f"p{k}", 2, question, step=step) for k in range(2)]
                for members in await asyncio.gather(*groups):
                    assert all(isinstance(rows, list) for rows in members), members
                if step == 1:
                    service = _local_services[str(engine_yaml)]
                    async with asyncio.timeout(30):
                        while service.stats()["warm_parked"] < 4:  # noqa: ASYNC110 (a gauge)
                            await asyncio.sleep(0.05)
            stats = _local_services[str(engine_yaml)].stats()
        finally:
            await close_services()
    assert stats["warm_used"] == 4 and stats["warm_missed"] == 0  # the 4 of step 2
    # step 2 ended too: the next batch's warm-ups began (a last step's are stopped at close)
    assert stats["warm_started"] >= 4


async def test_agent_loops_of_two_workers_share_one_engine_actor_under_ray(tmp_path, monkeypatch):
    """Two loops (as in two workers) reach one named engine actor: one SQS poller, so no
    notification is received by an engine that does not expect it."""
    import ray

    monkeypatch.chdir(ROOT)
    local = LocalConfig(
        app="tests.agents.held:app",
        mode="in_process",
        policy_workers=1,
        bucket="verl-ray",
        queue="verl-ray",
    )
    async with LocalStack(local) as stack:
        # warm=None: no next-step warm-ups, so the invocations below are the 4 rollouts alone
        engine_yaml = _engine_yaml(stack, tmp_path, "ray", warm=None)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            loops = [_agent_loop(engine_yaml, n=2) for _ in range(2)]
            groups = await asyncio.gather(
                *(
                    _group(loop, f"g{i}", 2, {"question": "What is 1 + 1?"})
                    for i, loop in enumerate(loops)
                )
            )
            stats = await ray.get_actor(SERVICE_NAME).stats.remote()
        finally:
            await close_services()
            ray.shutdown()
    assert all(isinstance(rows, list) and len(rows) == 1 for group in groups for rows in group)
    assert stats["unmatched"] == 0 and stats["foreign_messages"] == 0
    assert stats["invokes"] == 4


def test_settings_are_checked(tmp_path):
    with pytest.raises(ValueError, match="unknown keys \\['bogus'\\]"):
        _agent_loop(tmp_path / "x.yaml", n=2, bogus=1)
    with pytest.raises(ValueError, match="on_failure must be raise or empty"):
        _agent_loop(tmp_path / "x.yaml", n=2, on_failure="ignore")


def _async(threshold: int | None, folder: Path, strategy: str = "drop") -> dict:
    """`trainer` of veRL's colocate_async trainer with the replay buffer's staleness bound;
    `folder` its checkpoints' (where the service keeps the run secret), never the checkout."""
    sampler = {"max_off_policy_threshold": threshold, "max_off_policy_strategy": strategy}
    v1 = {"trainer_mode": "colocate_async", "sampler": sampler}
    return {"v1": v1, "default_local_dir": str(folder / "checkpoints")}


@pytest.mark.parametrize(
    ("threshold", "behind"), [(2, 1), (None, 3)], ids=["drop-2:end", "unbounded:keep"]
)
async def test_async_steps_overlap_and_no_group_fails_within_veRLs_bound(
    tmp_path, monkeypatch, threshold, behind
):
    """A step's groups still held when later steps start, and a member of the old step arriving
    after them, all train: the engine ends nothing veRL's replay buffer would keep (with the
    engine's default max_staleness=0 every one of them would end stale)."""
    monkeypatch.chdir(ROOT)
    local = LocalConfig(
        app="tests.agents.held:app", mode="in_process", bucket="verl-async", queue="verl-async"
    )
    question = {"question": "What is 2 + 5?"}
    async with LocalStack(local) as stack:
        loop = _agent_loop(
            _engine_yaml(stack, tmp_path, "async", warm=None),  # counts its own invocations
            n=2,
            trainer=_async(threshold, tmp_path),
        )
        try:
            old = asyncio.ensure_future(_group(loop, "old", 2, {**question, "hold": 3.0}))
            await asyncio.sleep(1.0)  # old's sessions run (held) when the later step starts
            new = await _group(loop, "new", 2, question, step=1 + behind)
            late = await _group(loop, "late", 2, question, step=1)  # after the later step's
            groups = {"old": await old, "new": new, "late": late}
            stats = next(iter(_services().values())).stats()
        finally:
            await close_services()
    for uid, group in groups.items():
        assert all(isinstance(rows, list) and len(rows) == 1 for rows in group), (uid, group)
    assert stats["invokes"] == 6


async def test_a_group_behind_veRLs_drop_bound_fails_as_veRL_would_evict_it(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    local = LocalConfig(
        app="tests.agents.held:app", mode="in_process", bucket="verl-drop", queue="verl-drop"
    )
    question = {"question": "What is 2 + 5?"}
    async with LocalStack(local) as stack:
        loop = _agent_loop(
            _engine_yaml(stack, tmp_path, "drop", warm=None), n=2, trainer=_async(2, tmp_path)
        )
        try:
            old = asyncio.ensure_future(_group(loop, "old", 2, {**question, "hold": 5.0}))
            await asyncio.sleep(1.0)
            new = await _group(loop, "new", 2, question, step=3)  # 2 behind: spans 3 > 2
            old_group = await old
        finally:
            await close_services()
    assert all(isinstance(rows, list) for rows in new)
    assert all(isinstance(e, GroupFailed) for e in old_group), old_group


def _services() -> dict:
    from agentcore_rollout.integrations.verl import agent_loop

    return agent_loop._local_services


FIRST_LIFE = """
import asyncio, json, sys
from tests.test_verl_agent_loop import _agent_loop, _group

async def main(engine_yaml, trainer, groups):
    loop = _agent_loop(engine_yaml, n=2, trainer=trainer)
    await asyncio.gather(*(_group(loop, uid, 2, info, step=1) for uid, info in groups.items()))

asyncio.run(main(sys.argv[1], *map(json.loads, sys.argv[2:])))
"""


async def test_prompts_reissued_after_a_restart_take_over_their_earlier_sessions(
    tmp_path, monkeypatch
):
    """veRL's async trainer, killed while step 1's sessions had written or were running, is
    restarted: it re-issues those prompts under step 2 (`_reissue_inflight_prompts`). Each member
    takes over its earlier session (its result from S3, or the session still running, with the
    trace the stack's gateway kept), so no agent runs twice; a new prompt runs as usual."""
    monkeypatch.chdir(ROOT)
    local = _held_stack("verl-reissue")
    question = {"question": "What is 2 + 5?"}
    earlier = {"written": question, "running": {**question, "hold": 6.0}}
    trainer = _async(2, tmp_path)
    async with LocalStack(local) as stack:
        engine_yaml = _engine_yaml(stack, tmp_path, "reissue", warm=None)  # no run_secret set
        # The first life's engine listens on a queue no bucket notifies, so the kill finds its
        # results written and undelivered (see test_reclaim.py).
        config = yaml.safe_load(engine_yaml.read_text())
        config["engine"]["queue_url"] = stack.moto.client("sqs").create_queue(
            QueueName="verl-reissue-silent"
        )["QueueUrl"]
        silent_yaml = tmp_path / "silent.yaml"
        silent_yaml.write_text(yaml.safe_dump(config))
        first = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            FIRST_LIFE,
            str(silent_yaml),
            json.dumps(trainer),
            json.dumps(earlier),
            cwd=ROOT,
            env={**os.environ, **LOCAL_CREDENTIALS, "PYTHONPATH": str(ROOT)},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        s3, give_up = stack.moto.client("s3"), time.monotonic() + 90
        while s3.list_objects_v2(Bucket="verl-reissue").get("KeyCount", 0) < 2 or (
            len(await recorded_samples(stack)) < 4
        ):
            assert first.returncode is None, (await first.communicate())[1][-2000:]
            assert time.monotonic() < give_up, "the first life's sessions did not run in time"
            await asyncio.sleep(0.1)
        first.kill()
        await first.wait()
        secret = tmp_path / "checkpoints" / "agentcore_run_secret"
        assert secret.stat().st_mode & 0o777 == 0o600

        loop = _agent_loop(engine_yaml, n=2, trainer=trainer)
        try:
            groups = await asyncio.gather(
                *(_group(loop, uid, 2, info, step=2) for uid, info in earlier.items()),
                _group(loop, "fresh", 2, question, step=2),
            )
            stats = next(iter(_services().values())).stats()
        finally:
            await close_services()
        sampled = await recorded_samples(stack)
    for group in groups:
        assert all(isinstance(rows, list) and len(rows) == 1 for rows in group), groups
    assert sorted(rows[0].reward_score for group in groups for rows in group) == [0, 0, 0, 1, 1, 1]
    assert stats["invokes"] == 2  # the fresh prompt's two sessions only
    assert len(sampled) == 6  # four agents in the first life, two in the second: none twice
    by_output = {tuple(s["output_ids"]): s for s in sampled}
    for group in groups:
        for [row] in group:
            tokens = [t for t, m in zip(row.response_ids, row.response_mask, strict=True) if m]
            assert row.response_logprobs == by_output[tuple(tokens)]["output_logprobs"]
