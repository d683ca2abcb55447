"""The engine's figures in veRL's step metrics: the switch makes veRL's replay buffer ours
(`figures`), whose `sample()` adds what the engine service ran since the last step, so veRL's
own `Tracking` writes them with the step's other metrics to every `trainer.logger` backend.

The e2e test drives veRL 0.9.1's `AgentLoopManagerTQ` on local Ray and TransferQueue against
the embedded stack (as tests/test_verl_e2e.py does): a group with a failed member, then the
buffer veRL's trainer builds from the translated config samples the step, and veRL's file
logger writes its metrics. About 25 s on 2 CPU cores."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import replace

import pytest
import ray
import transfer_queue as tq
import yaml
from omegaconf import OmegaConf
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync
from verl.utils.import_utils import load_extern_type
from verl.utils.tracking import Tracking

from agentcore_rollout import EngineStats, Outcome, RolloutBatch, RolloutTally
from agentcore_rollout._batch import failure_reason
from agentcore_rollout.contract import ErrorInfo
from agentcore_rollout.integrations.verl.agent_loop import SERVICE_NAME
from agentcore_rollout.integrations.verl.figures import (
    EngineFigures,
    FiguresReplayBuffer,
    FiguresReplayBufferAsync,
    engine_figures,
)
from agentcore_rollout.integrations.verl.switch import trainer_config
from agentcore_rollout.local.config import LocalConfig
from agentcore_rollout.local.stack import LocalStack

from .factories import flat_config, make_outcome, make_result
from .test_verl_e2e import (
    ROOT,
    _model_dir,
    _start_ray,
    _trainer_config,
    _until_settled,
    one_step,
)

SWITCH = "actor_rollout_ref.rollout.mode=agentcore"


def _failed(error_type: str | None, status: str = "agent_error"):
    """An agent's own failure, with the error type it reported."""
    outcome = make_outcome(outcome=Outcome.AGENT_ERROR)
    error = ErrorInfo(type=error_type, message="boom") if error_type is not None else None
    result = make_result(status=status, rewards=None, error=error)
    return replace(outcome, result=result)


@pytest.mark.unit
def test_failure_reasons_are_short_keys_never_free_text():
    assert failure_reason(make_outcome()) is None
    assert failure_reason(make_outcome(outcome=Outcome.TIMEOUT)) == "engine"
    assert failure_reason(_failed("RuntimeError")) == "RuntimeError"
    assert failure_reason(_failed(None)) == "unspecified"
    assert failure_reason(_failed("it broke: /etc/x " + "y" * 80)) == "it_broke_etc_x_" + "y" * 25
    # Many distinct reasons: the first 16 kept, the rest counted as `other`.
    tally = RolloutTally.of(_failed(f"E{i}") for i in range(20))
    assert len(tally.failures) == 17 and tally.failures["agent_error/other"] == 4


@pytest.mark.unit
def test_batch_metrics_count_failures_turns_and_resumed_turns():
    turns = [{"resumed": 0}, {"resumed": 2}, {"resumed": 0}]
    outcomes = [
        make_outcome(k=0, trace={"turns": turns}),
        make_outcome(k=1, trace={"turns": turns[:1]}),
        _failed("RuntimeError"),
        make_outcome(k=3, outcome=Outcome.TIMEOUT),
    ]
    metrics = RolloutBatch(0, outcomes, stats=EngineStats(), wall_time=2.0).metrics()
    assert metrics["rollout/outcome/ok"] == 2 and metrics["rollout/outcome/stale"] == 0
    assert metrics["rollout/failure/agent_error/RuntimeError"] == 1
    assert metrics["rollout/failure/timeout/engine"] == 1
    assert (metrics["rollout/turns"], metrics["rollout/resumed_turns"]) == (4, 1)
    assert metrics["rollout/throughput"] == 2.0


@pytest.mark.unit
@pytest.mark.parametrize(
    ("mode", "expected", "verl_class"),
    [
        ("sync", FiguresReplayBuffer, ReplayBuffer),
        ("colocate_async", FiguresReplayBufferAsync, ReplayBufferAsync),
    ],
)
def test_the_switch_makes_veRLs_replay_buffer_ours(mode, expected, verl_class, monkeypatch):
    monkeypatch.setenv("AGENTCORE_ROLLOUT_CONFIG", "configs/aws.yaml")
    config = trainer_config([SWITCH, f"trainer.v1.trainer_mode={mode}"])
    custom = config.trainer.v1.sampler.custom_sampler
    loaded = load_extern_type(custom.path, custom.name)  # as veRL's `_build_replay_buffer`
    assert loaded is expected and issubclass(loaded, verl_class)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("setting", "said"),
    [
        (
            [
                "trainer.v1.sampler.custom_sampler.path=mine.py",
                "trainer.v1.sampler.custom_sampler.name=Mine",
            ],
            "custom_sampler is yours (Mine)",
        ),
        (["algorithm.filter_groups.enable=true"], "algorithm.filter_groups is on"),
        (["trainer.v1.sampler.sync_refill_failed_groups=true"], "sync_refill_failed_groups"),
    ],
    ids=["own-sampler", "dapo", "refill"],
)
def test_a_sampler_of_the_users_or_veRLs_settings_are_kept(setting, said, monkeypatch, caplog):
    monkeypatch.setenv("AGENTCORE_ROLLOUT_CONFIG", "configs/aws.yaml")
    with caplog.at_level(logging.WARNING):
        config = trainer_config([SWITCH, *setting])
    custom = config.trainer.v1.sampler.custom_sampler
    assert custom.name in (None, "Mine")
    [record] = [r for r in caplog.records if "EngineFigures first" in r.getMessage()]
    assert said in record.getMessage()


@pytest.mark.unit
def test_the_mixin_adds_the_figures_once_a_step_to_a_users_sampler(monkeypatch):
    """On the step's first `train` sample only: veRL averages what each sample of a step
    returns, and validation is no training step."""
    from agentcore_rollout.integrations.verl import figures

    taken = iter(range(1, 100))
    monkeypatch.setattr(figures, "engine_figures", lambda: {"rollout/take": next(taken)})

    class Users:
        def sample(self, global_steps, partition_id, batch_size):
            return "batch", {"mine": global_steps}

    class Mixed(EngineFigures, Users):
        pass

    sampler = Mixed()
    got = [sampler.sample(*call, 4)[1] for call in [(1, "train"), (1, "train"), (1, "val")]]
    got.append(sampler.sample(2, "train", 4)[1])
    assert got == [
        {"mine": 1, "rollout/take": 1},
        {"mine": 1},
        {"mine": 1},
        {"mine": 2, "rollout/take": 2},
    ]


@pytest.mark.unit
def test_no_engine_no_figures():
    assert engine_figures() == {}  # neither Ray nor a local service: nothing, and no error


@pytest.mark.e2e
@pytest.mark.timeout(240)
async def test_veRLs_step_metrics_and_its_file_logger_hold_the_engines_figures(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(ROOT)
    local = LocalConfig(
        app="tests.agents.held:app",
        mode="in_process",
        policy="toy",
        policy_workers=1,
        bucket="verl-figures",
        queue="verl-figures",
    )
    question = {"question": "What is 2 + 5?"}
    prompts = {"all-ok": question, "one-failed": {**question, "fail": [0]}}
    async with LocalStack(local) as stack:
        # warm=None: no next-step warm-ups, so the invocations counted are the step's own
        settings = flat_config(exp_id="verl-fig", start_rate=50.0, wait_time=1, warm=None)
        engine = stack.engine_config(settings)
        engine_yaml = tmp_path / "engine.yaml"
        engine_yaml.write_text(yaml.safe_dump({"engine": engine.model_dump(mode="json")}))
        config = _trainer_config(_model_dir(tmp_path, "char"), engine_yaml, False, "char")
        _start_ray()
        try:
            tq.init(config.transfer_queue)
            buffer = _veRLs_buffer(config)
            assert engine_figures() == {}  # no rollout yet: no engine actor, no figures
            manager = await one_step(config, prompts)  # held: its workers hold the engine
            await _until_settled(list(prompts))
            _, metrics = await asyncio.to_thread(buffer.sample, 1, "train", 1)
            _, again = await asyncio.to_thread(buffer.sample, 1, "train", 1)  # same step
            later = await ray.get_actor(SERVICE_NAME).take_figures.remote()
            del manager
        finally:
            tq.close()
            ray.shutdown()
    assert metrics["rollout/outcome/ok"] == 5 and metrics["rollout/outcome/agent_error"] == 1
    assert metrics["rollout/failure/agent_error/RuntimeError"] == 1
    assert 0 < metrics["rollout/latency_p50"] <= metrics["rollout/latency_p99"]
    assert metrics["rollout/staleness/0/delivered"] == 5
    assert metrics["rollout/cost/rollouts"] == 6 and metrics["rollout/cost/usd"] > 0
    assert metrics["rollout/cost/completion_tokens"] > 0 and metrics["rollout/turns"] >= 5
    assert metrics["rollout/engine/invokes"] == 6 and "rollout/engine/throttles" in metrics
    assert not any(k.startswith("rollout/") for k in again)  # once a step
    assert later["rollout/outcome/ok"] == 0 and later["rollout/engine/invokes"] == 0  # reset
    # veRL's own logger writes them as the trainer does (`self.logger.log(data=metrics, ...)`).
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "metrics.jsonl"))
    logger = Tracking("p", "e", default_backend=["file"])
    logger.log(data=metrics, step=1)
    logger.finish()
    [line] = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert json.loads(line) == {"step": 1, "data": metrics}


def _veRLs_buffer(config):
    """The replay buffer veRL's v1 trainer builds from `config` (`_build_replay_buffer`, the
    arguments it gives a custom sampler)."""
    sampler = config.trainer.v1.sampler
    cls = load_extern_type(sampler.custom_sampler.path, sampler.custom_sampler.name)
    assert cls is FiguresReplayBuffer
    mode = config.trainer.v1.trainer_mode
    return cls(
        trainer_mode=mode,
        trainer_config=config.trainer.v1.get(mode, OmegaConf.create({})),
        max_off_policy_threshold=sampler.max_off_policy_threshold,
        max_off_policy_strategy=sampler.max_off_policy_strategy,
        sampler_kwargs=sampler.sampler_kwargs,
        refill_fn=None,
    )
