"""The switch: `actor_rollout_ref.rollout.mode=agentcore` composed with veRL 0.9.1's own trainer
config (Hydra) becomes veRL's native settings, which veRL's config classes accept; the legacy
trainer and a missing engine config are refused in one line, before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hydra.utils import get_class
from verl.utils.config import omega_conf_to_dataclass

from agentcore_rollout.cli import main
from agentcore_rollout.integrations.verl import AgentCoreAgentLoop, AgentCoreSettings
from agentcore_rollout.integrations.verl.agent_loop import engine_limits, reissue_settings
from agentcore_rollout.integrations.verl.switch import SwitchError, trainer_config

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
SWITCH = "actor_rollout_ref.rollout.mode=agentcore"


def _native(rollout) -> None:
    assert rollout.mode == "async"  # what veRL and its async recipes expect
    assert rollout.agent.default_agent_loop == "agentcore"
    [entry] = yaml.safe_load(Path(rollout.agent.agent_loop_config_path).read_text())
    assert entry["name"] == "agentcore"
    assert get_class(entry["_target_"]) is AgentCoreAgentLoop
    omega_conf_to_dataclass(rollout)  # veRL's RolloutConfig accepts it


def test_the_switch_composes_into_veRLs_native_settings(monkeypatch):
    monkeypatch.setenv("AGENTCORE_ROLLOUT_CONFIG", "configs/aws.yaml")
    monkeypatch.chdir(ROOT)
    config = trainer_config([SWITCH, "actor_rollout_ref.rollout.name=sglang"])
    rollout = config.actor_rollout_ref.rollout
    _native(rollout)
    assert config.trainer.use_v1 is True
    settings = AgentCoreSettings.from_rollout_config(rollout)
    assert settings.config == str(ROOT / "configs/aws.yaml")  # absolute: workers run elsewhere
    assert (settings.payload_key, settings.min_group_ok, settings.on_failure) == (
        "extra_info",
        2,
        "raise",
    )


def test_the_example_config_extends_veRLs_and_keeps_its_own_settings(monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    engine = tmp_path / "engine.yaml"
    config = trainer_config(
        [f"+actor_rollout_ref.rollout.custom.agentcore.config={engine}"],
        config_path="configs/verl",
        config_name="agentcore_grpo",
    )
    rollout = config.actor_rollout_ref.rollout
    _native(rollout)
    assert config.algorithm.adv_estimator == "grpo" and rollout.n == 8
    assert rollout.custom.agentcore.config == str(engine)  # the one given wins over the env
    assert rollout.custom.agentcore.min_group_ok == 2


def test_other_modes_are_left_alone(monkeypatch):
    monkeypatch.delenv("AGENTCORE_ROLLOUT_CONFIG", raising=False)
    rollout = trainer_config([]).actor_rollout_ref.rollout
    assert rollout.mode == "async" and rollout.get("custom") is None
    assert rollout.agent.default_agent_loop != "agentcore"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([SWITCH, "trainer.use_v1=false"], "trainer.use_v1=false: rollout.mode=agentcore needs"),
        ([SWITCH], "rollout.mode=agentcore needs the engine's config"),
        ([SWITCH, "actor_rollout_ref.rollout.bogus=1"], "Could not override"),
        (["--config-name"], "--config-name needs a value"),
        (["--verbose"], "unknown option --verbose"),
    ],
)
def test_refusals_are_one_line_and_start_nothing(args, message, capsys, monkeypatch):
    monkeypatch.delenv("AGENTCORE_ROLLOUT_CONFIG", raising=False)
    assert main(["verl", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and len(err.splitlines()) == 1, err


def test_translate_refuses_the_legacy_trainer_directly():
    with pytest.raises(SwitchError, match="use_v1=false"):
        trainer_config([SWITCH, "trainer.use_v1=false"])


ASYNC = "trainer.v1.trainer_mode"
SEPARATE = [
    f"{ASYNC}=separate_async",
    "actor_rollout_ref.rollout.nnodes=1",
    "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
]


@pytest.mark.parametrize("mode", ["colocate_async", "separate_async"])
def test_veRLs_async_trainers_compose_with_the_switch(mode, monkeypatch, tmp_path):
    """veRL's own config classes accept the result; the engine gets veRL's staleness bound."""
    from verl.trainer.config import HybridRolloutSwitchConfig
    from verl.workers.config import CheckpointEngineConfig

    monkeypatch.setenv("AGENTCORE_ROLLOUT_CONFIG", str(tmp_path / "engine.yaml"))
    extra = SEPARATE if mode == "separate_async" else [f"{ASYNC}={mode}"]
    micro = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1"
    config = trainer_config([SWITCH, "actor_rollout_ref.rollout.name=sglang", micro, *extra])
    _native(config.actor_rollout_ref.rollout)
    assert config.trainer.v1.trainer_mode == mode
    omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    engine = omega_conf_to_dataclass(config.actor_rollout_ref.rollout.checkpoint_engine)
    assert isinstance(engine, CheckpointEngineConfig)
    switch = omega_conf_to_dataclass(config.trainer.v1.separate_async.hybrid_rollout)
    assert isinstance(switch, HybridRolloutSwitchConfig)
    # veRL's default bound: drop what spans more than 8 versions -> the engine ends at 7 behind
    assert engine_limits(config) == {"max_staleness": 7, "stale_policy": "end"}


@pytest.mark.parametrize(
    ("sampler", "limits"),
    [
        (["trainer.v1.sampler.max_off_policy_threshold=2"], {"max_staleness": 1}),
        (["trainer.v1.sampler.max_off_policy_strategy=wait"], {}),
        (["trainer.v1.sampler.max_off_policy_threshold=null"], {}),
    ],
    ids=["drop-2", "wait", "unbounded"],
)
def test_the_engine_ends_nothing_veRLs_bound_keeps(sampler, limits, monkeypatch):
    """`drop` with bound T: the engine ends what is T - 1 steps behind (veRL evicts it anyway);
    `wait` (dropless) or no bound: the engine keeps everything and veRL decides."""
    monkeypatch.setenv("AGENTCORE_ROLLOUT_CONFIG", "configs/aws.yaml")
    config = trainer_config([SWITCH, f"{ASYNC}=colocate_async", *sampler])
    policy = "end" if limits else "keep"
    assert engine_limits(config) == {**limits, "stale_policy": policy}
    assert engine_limits(trainer_config([SWITCH])) is None  # sync: steps never overlap
    # A re-issued prompt's earlier session is looked for as far back as veRL's bound (8, its
    # default, when unbounded), and the run secret is kept with veRL's checkpoints.
    reissue = reissue_settings(config)
    assert reissue is not None
    assert reissue.steps == (2 if limits else 8)
    assert reissue.secret_dir == config.trainer.default_local_dir
    assert reissue_settings(trainer_config([SWITCH])) is None  # sync: veRL re-issues nothing


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            [f"{ASYNC}=separate_async"],
            "separate_async needs actor_rollout_ref.rollout.nnodes > 0",
        ),
        (
            [*SEPARATE, "data.train_batch_size=512"],
            "separate_async needs data.train_batch_size (512) == trainer.v1.separate_async."
            "parameter_sync_step (4) * actor.ppo_mini_batch_size (256): set data.train_batch_size"
            "=1024",
        ),
        (
            [*SEPARATE[:2]],
            "checkpoint_engine.backend=naive: use nccl, nixl or mooncake",
        ),
        (
            [*SEPARATE, "actor_rollout_ref.rollout.n_gpus_per_node=0"],
            "needs actor_rollout_ref.rollout.n_gpus_per_node > 0",
        ),
        (
            [f"{ASYNC}=colocate_async", "trainer.v1.sampler.max_off_policy_threshold=0"],
            "max_off_policy_threshold=0: set an integer >= 1, or null for no bound",
        ),
        (
            [f"{ASYNC}=colocate_async", "trainer.v1.sampler.max_off_policy_strategy=skip"],
            "max_off_policy_strategy=skip: use drop or wait",
        ),
        ([f"{ASYNC}=fully_async"], "trainer_mode=fully_async: use sync, colocate_async or"),
    ],
)
def test_what_veRLs_async_trainers_assert_is_refused_in_one_line(args, message, capsys):
    assert (
        main(["verl", SWITCH, "+actor_rollout_ref.rollout.custom.agentcore.config=x", *args]) == 2
    )
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and len(err.splitlines()) == 1, err
