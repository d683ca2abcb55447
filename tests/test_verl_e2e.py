"""veRL 0.9.1's own v1 rollout path drives `AgentCoreAgentLoop` against the embedded stack:
its `AgentLoopManagerTQ` and `AgentLoopWorkerTQ` on local Ray, TransferQueue, and a trainer
config composed from veRL's `ppo_trainer.yaml` with `rollout.mode=agentcore`, translated by the
switch; the agents run as emulated AgentCore sessions and call the local policy through the
token-capture gateway.

- every row veRL stores holds exactly the ids, mask and log-probs a policy worker sampled;
- a group with a failed member comes back `failure`, with rows for its survivors only;
- a group below `min_group_ok` comes back `failure` with no row at all;
- with `custom.agentcore.gateway`, the engine service hosts the gateway and samples through the
  server manager veRL hands its agent loops (here a stand-in over the local policy worker).

On CPU (2 cores) it takes about 25 s. Ray needs `num_cpus=8` even here: TransferQueue's
controller and storage unit each reserve a CPU.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import ray
import transfer_queue as tq
import yaml
from verl.trainer.ppo.v1 import AgentLoopManagerTQ
from verl.utils import tensordict_utils as tu

from agentcore_rollout.integrations.verl.switch import trainer_config
from agentcore_rollout.local.config import LocalConfig
from agentcore_rollout.local.stack import LocalStack

from .factories import flat_config, recorded_samples
from .gateway_support import TOKENIZER_DIR
from .verl_support import PolicyServerManager

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent
FIELDS = ["prompts", "responses", "response_mask", "rollout_log_probs", "rm_scores", "extra_fields"]


def _model_dir(tmp_path: Path, model: str) -> Path:
    """The model directory veRL reads its tokenizer from. For the char toy, one veRL accepts
    without a hub: the fixture tokenizer and a tiny config (no weights: rollouts never run this
    model, the agents call the local policy). For SmolLM2, its converted directory, which the
    stack's worker serves too."""
    if model == "smollm2":
        from .smollm2 import model_dir

        return model_dir()
    model = tmp_path / "model"
    shutil.copytree(TOKENIZER_DIR, model)
    config = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": 512}
    (model / "config.json").write_text(json.dumps(config | {"n_embd": 8, "n_layer": 1}))
    return model


def _trainer_config(
    model_dir: Path, engine_yaml: Path, hosted: bool, model: str, n: int = 3, mode: str = "sync"
):
    """veRL's ppo_trainer.yaml with the switch on, translated as `agentcore-rollout verl` does.
    `hosted`: the engine service hosts a gateway sampling through veRL's server manager,
    rendering with the char toy's renderer or (SmolLM2) the model's own tokenizer and template."""
    key = "+actor_rollout_ref.rollout.custom.agentcore.gateway"
    renderer = "agentcore_rollout.local.policy.render:CharRenderer"
    # SmolLM2: no renderer given, so the model's path (its tokenizer and template) is the default
    gateway = [f"{key}.renderer={renderer}" if model == "char" else f"{key}.host=127.0.0.1"]
    return trainer_config(
        [
            *(gateway if hosted else []),
            f"actor_rollout_ref.model.path={model_dir}",
            "actor_rollout_ref.rollout.mode=agentcore",
            "actor_rollout_ref.rollout.name=sglang",
            f"actor_rollout_ref.rollout.n={n}",
            f"trainer.v1.trainer_mode={mode}",
            "actor_rollout_ref.rollout.prompt_length=256",
            "actor_rollout_ref.rollout.response_length=256",
            "actor_rollout_ref.rollout.agent.num_workers=1",
            f"+actor_rollout_ref.rollout.custom.agentcore.config={engine_yaml}",
            "transfer_queue.enable=true",
            "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        ]
    )


async def one_step(config, prompts: dict, server_manager=None) -> AgentLoopManagerTQ:
    """Step 1's prompts, registered in TransferQueue and generated as veRL's trainer does; its
    agent loop manager, whose workers (and their engine actor) live as long as it does."""
    manager = await asyncio.to_thread(AgentLoopManagerTQ.create, config, server_manager)
    batch = tu.get_tensordict(
        {
            "uid": np.array(list(prompts), dtype=object),
            "index": np.arange(len(prompts)),
            "extra_info": np.array(list(prompts.values()), dtype=object),
        }
    )
    tu.assign_non_tensor_data(batch, "global_steps", 1)
    tags = [{"is_prompt": True, "status": "pending", "global_steps": 1}] * len(prompts)
    tq.kv_batch_put(keys=list(prompts), partition_id="train", tags=tags)
    await asyncio.to_thread(manager.generate_sequences, batch)
    return manager


@pytest.mark.timeout(240)
@pytest.mark.parametrize("model", ["char", "smollm2"])
@pytest.mark.parametrize("hosted", [False, True], ids=["stack-gateway", "hosted-gateway"])
async def test_veRLs_agent_loop_manager_drives_agentcore_rollouts(
    tmp_path, monkeypatch, hosted, model
):
    monkeypatch.chdir(ROOT)
    model_dir = _model_dir(tmp_path, model)
    local = LocalConfig(
        app="tests.agents.held:app",
        mode="in_process",
        policy="toy" if model == "char" else str(model_dir),
        policy_workers=1,
        record_samples=True,
        bucket="verl-e2e",
        queue="verl-e2e",
    )
    question = {"question": "What is 2 + 5?"}
    prompts = {
        "all-ok": question,
        "one-failed": {**question, "fail": [0]},
        "two-failed": {**question, "fail": [0, 1]},
    }
    async with LocalStack(local) as stack:
        engine = stack.engine_config(flat_config(exp_id="verl-e2e", start_rate=50.0, wait_time=1))
        engine_yaml = tmp_path / "engine.yaml"
        engine_yaml.write_text(yaml.safe_dump({"engine": engine.model_dump(mode="json")}))
        config = _trainer_config(model_dir, engine_yaml, hosted, model)
        # veRL's servers as the hosted gateway samples through them: the local policy worker,
        # its samples labelled with veRL's global step (the stack's gateway says "0").
        server_manager = PolicyServerManager(stack.workers[0].url, global_steps=1)
        _start_ray()
        try:
            tq.init(config.transfer_queue)
            # held: its workers (and their engine actor) live as long as it does
            _held = await one_step(config, prompts, server_manager if hosted else None)
            listing = await _until_settled(list(prompts))
            keys = sorted(k for k, tag in listing.items() if not tag.get("is_prompt"))
            rows = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=FIELDS)
        finally:
            tq.close()
            ray.shutdown()
        sampled = await recorded_samples(stack)
    status = {uid: listing[uid]["status"] for uid in prompts}
    assert status == {"all-ok": "finished", "one-failed": "failure", "two-failed": "failure"}
    # Rows of the survivors only: sessions 1 and 2 of one-failed, none of two-failed.
    assert keys == [f"all-ok_{k}_0" for k in range(3)] + ["one-failed_1_0", "one-failed_2_0"]
    # Sessions of one group may sample the same tokens; the worker batches concurrent requests,
    # and a float32 log-prob depends on its batch, so each row matches one of its samples.
    by_output: dict[tuple, list[dict]] = {}
    for sample in sampled:
        by_output.setdefault(tuple(sample["output_ids"]), []).append(sample)
    for i, key in enumerate(keys):
        mask = rows["response_mask"][i].tolist()
        response = rows["responses"][i].tolist()
        samples = by_output[tuple(t for t, m in zip(response, mask, strict=True) if m)]
        assert all(rows["prompts"][i].tolist() == s["input_ids"] for s in samples), key
        captured = rows["rollout_log_probs"][i].tolist()
        logprobs = [lp for lp, m in zip(captured, mask, strict=True) if m]
        assert any(
            logprobs == pytest.approx(s["output_logprobs"], rel=1e-6)
            for s in samples  # float32
        ), (key, logprobs, [s["output_logprobs"] for s in samples])
        assert rows["rm_scores"][i].tolist()[-1] == float(int(key.split("_")[1]) % 2)
        assert rows["extra_fields"][i]["outcome"] == "ok"
        assert rows["extra_fields"][i]["min_global_steps"] == (1 if hosted else 0)


async def _until_settled(uids: list[str], timeout: float = 120.0) -> dict:
    give_up = time.monotonic() + timeout
    while True:
        listing = tq.kv_list("train")
        listing = listing.get("train", listing)
        if all(listing.get(uid, {}).get("status") in ("finished", "failure") for uid in uids):
            return listing
        assert time.monotonic() < give_up, {uid: listing.get(uid) for uid in uids}
        await asyncio.sleep(0.5)


@pytest.mark.timeout(240)
async def test_colocate_async_steps_overlap_and_an_aborted_turn_resumes_across_them(
    tmp_path, monkeypatch
):
    """veRL's colocate_async shape on its own agent loop manager: step 1's prompt is mid-turn
    when the weights move to version 2 (the worker aborts it, as veRL's checkpoint engine aborts
    its replicas), and step 2's prompt starts while step 1's sessions still run. Both groups
    finish (none fails for staleness); step 1's rows span versions 1-2, each token's version and
    log-prob exactly what the worker's calls gave."""
    from agentcore_rollout.local.policy import PolicyServer

    from .test_gateway import recorded
    from .test_gateway_resume import endless_policy, post

    monkeypatch.chdir(ROOT)
    model_dir = _model_dir(tmp_path, "char")
    local = LocalConfig(
        app="tests.agents.held:app", mode="in_process", bucket="verl-async", queue="verl-async"
    )
    weights = {v: tmp_path / f"v{v}.npz" for v in (1, 2)}
    for v, path in weights.items():
        endless_policy(v).save(path)
    question = {"question": "What is 2 + 5?", "hold": 2.0}
    async with (
        LocalStack(local) as stack,
        PolicyServer(endless_policy(0), record=True, token_delay=0.15) as worker,
    ):
        await post(f"{worker.url}/update_weights_from_disk", _update(weights, 1, abort=False))
        engine = stack.engine_config(
            flat_config(exp_id="verl-async", start_rate=50.0, wait_time=1, run_secret="s" * 32)
        )
        engine_yaml = tmp_path / "engine.yaml"
        engine_yaml.write_text(yaml.safe_dump({"engine": engine.model_dump(mode="json")}))
        config = _trainer_config(model_dir, engine_yaml, True, "char", n=2, mode="colocate_async")
        assert config.trainer.v1.trainer_mode == "colocate_async"
        _start_ray()
        try:
            tq.init(config.transfer_queue)
            manager = await asyncio.to_thread(
                AgentLoopManagerTQ.create, config, PolicyServerManager(worker.url)
            )
            await asyncio.to_thread(manager.generate_sequences, _batch("step1", question, 1))
            for _ in range(600):  # both of step 1's members mid-turn
                if len(worker.worker._paced) == 2:
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)
            await post(f"{worker.url}/update_weights_from_disk", _update(weights, 2, abort=True))
            await asyncio.to_thread(manager.generate_sequences, _batch("step2", question, 2))
            listing = await _until_settled(["step1", "step2"])
            keys = sorted(k for k, tag in listing.items() if not tag.get("is_prompt"))
            rows = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=FIELDS)
        finally:
            tq.close()
            ray.shutdown()
        calls = await recorded(worker.url)
    assert {uid: listing[uid]["status"] for uid in ("step1", "step2")} == {
        "step1": "finished",
        "step2": "finished",
    }
    assert keys == ["step1_0_0", "step1_1_0", "step2_0_0", "step2_1_0"]
    turns: dict[str, list[dict]] = {}
    for call in calls:
        turns.setdefault(call["rid"].split(".")[0], []).append(call)
    by_output = {tuple(t for c in cs for t in c["output_ids"]): cs for cs in turns.values()}
    for i, key in enumerate(keys):
        mask = rows["response_mask"][i].tolist()
        tokens = [t for t, m in zip(rows["responses"][i].tolist(), mask, strict=True) if m]
        worker_calls = by_output[tuple(tokens)]
        logprobs = [
            lp for lp, m in zip(rows["rollout_log_probs"][i].tolist(), mask, strict=True) if m
        ]
        expected = [lp for c in worker_calls for lp in c["output_logprobs"]]
        assert logprobs == pytest.approx(expected, rel=1e-6), key
        extra = rows["extra_fields"][i]
        versions = [int(c["weight_version"]) for c in worker_calls if c["output_ids"]]
        assert (extra["min_global_steps"], extra["max_global_steps"]) == (
            min(versions),
            max(versions),
        )
        if key.startswith("step1"):  # aborted mid-turn at version 1, resumed under 2
            assert (extra["min_global_steps"], extra["max_global_steps"]) == (1, 2), key
            assert len(worker_calls) == 2
        else:
            assert (extra["min_global_steps"], extra["max_global_steps"]) == (2, 2), key


def _update(weights: dict[int, Path], version: int, abort: bool) -> dict:
    return {
        "model_path": str(weights[version]),
        "weight_version": str(version),
        "abort_all_requests": abort,
    }


def _batch(uid: str, payload: dict, step: int):
    """One prompt of veRL's dataloader, registered in TransferQueue as veRL's trainer does."""
    batch = tu.get_tensordict(
        {
            "uid": np.array([uid], dtype=object),
            "index": np.arange(1),
            "extra_info": np.array([payload], dtype=object),
        }
    )
    tu.assign_non_tensor_data(batch, "global_steps", step)
    tags = [{"is_prompt": True, "status": "pending", "global_steps": step}]
    tq.kv_batch_put(keys=[uid], partition_id="train", tags=tags)
    return batch


def _start_ray() -> None:
    """Local Ray for veRL's workers, which import the test agents from the repository."""
    ray.init(
        num_cpus=8,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
    )
