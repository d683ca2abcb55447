"""`actor_rollout_ref.rollout.mode=agentcore`: the switch, translated into veRL's native settings.

veRL 0.9.1 does not know the mode (it only warns, and its async recipes assert `mode == "async"`),
so we translate it before veRL sees it, and check what veRL's async trainers assert at start-up,
one line each, before any GPU is asked for. The v1 trainer only: v0 needs one row per request,
so a failed rollout could only be hidden behind a fabricated row. The settings it writes:
docs/verl.md."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

AGENT_LOOPS = Path(__file__).with_name("agent_loops.yaml")
MODE = "agentcore"
FIGURES = "pkg://agentcore_rollout.integrations.verl.figures"  # veRL's `load_extern_type` path

log = logging.getLogger(__name__)


class SwitchError(ValueError):
    """The trainer config cannot run with `rollout.mode=agentcore`."""


def trainer_config(
    overrides: Sequence[str] = (),
    *,
    config_path: str | None = None,
    config_name: str = "ppo_trainer",
) -> DictConfig:
    """veRL's trainer config (or `config_name` in `config_path`, which may extend veRL's via
    `defaults: [ppo_trainer, _self_]`), composed with `overrides`, then translated."""
    import verl
    from hydra import compose, initialize_config_dir

    verl_configs = Path(verl.__file__).parent / "trainer" / "config"
    directory = Path(config_path).resolve() if config_path else verl_configs
    searchpath = [] if directory == verl_configs else [f"hydra.searchpath=[file://{verl_configs}]"]
    with initialize_config_dir(str(directory), version_base=None):
        config = compose(config_name, overrides=[*searchpath, *overrides])
    return translate(config)


def translate(
    config: DictConfig, environ: os._Environ[str] | dict[str, str] | None = None
) -> DictConfig:
    """In place, and returned: `rollout.mode=agentcore` becomes veRL's native settings. Any
    other mode is left as it is."""
    rollout = config.actor_rollout_ref.rollout
    if rollout.get("mode") != MODE:
        return config
    if not config.trainer.get("use_v1", True):
        raise SwitchError(
            "trainer.use_v1=false: rollout.mode=agentcore needs veRL's v1 trainer (the default); "
            "the legacy one needs a row per request, so failed rollouts would need fabricated rows"
        )
    _check_async(config)
    environ = os.environ if environ is None else environ
    with open_dict(config):
        rollout.mode = "async"
        rollout.agent.default_agent_loop = MODE
        rollout.agent.agent_loop_config_path = str(AGENT_LOOPS)
        custom = rollout.get("custom") or {}
        agentcore = dict(custom.get(MODE) or {})
        if not agentcore.get("config"):
            path = environ.get("AGENTCORE_ROLLOUT_CONFIG")
            if not path:
                raise SwitchError(
                    "rollout.mode=agentcore needs the engine's config: "
                    "+actor_rollout_ref.rollout.custom.agentcore.config=PATH or "
                    "AGENTCORE_ROLLOUT_CONFIG"
                )
            agentcore["config"] = str(Path(path).resolve())  # the workers may run elsewhere
        rollout.custom = OmegaConf.merge(custom, {MODE: agentcore})
        _figures_sampler(config)
    return config


def _figures_sampler(config: DictConfig) -> None:
    """veRL's replay buffer with the engine's figures (`figures`), unless a sampler is set or
    veRL would not give ours the settings its own gets."""
    sampler = config.trainer.v1.sampler
    custom = sampler.get("custom_sampler") or {}
    if custom.get("path") or custom.get("name"):
        why = f"trainer.v1.sampler.custom_sampler is yours ({custom.get('name')})"
    elif (config.algorithm.get("filter_groups") or {}).get("enable"):
        why = "algorithm.filter_groups is on (not given to a custom sampler)"
    elif sampler.get("sync_refill_failed_groups"):
        why = "trainer.v1.sampler.sync_refill_failed_groups is on (not given to a custom sampler)"
    else:
        sync = config.trainer.v1.trainer_mode == "sync"
        name = "FiguresReplayBuffer" if sync else "FiguresReplayBufferAsync"
        sampler.custom_sampler = {"path": FIGURES, "name": name}
        return
    log.warning(
        "%s: the engine's rollout/... figures are not in veRL's step metrics; to add them, "
        "put agentcore_rollout.integrations.verl.figures.EngineFigures first among your "
        "sampler's bases (docs/verl.md)",
        why,
    )


def _check_async(config: DictConfig) -> None:
    """What veRL 0.9.1's async trainers assert at start-up, as one-line SwitchErrors."""
    v1 = config.trainer.v1
    mode = v1.trainer_mode
    if mode == "sync":
        return
    if mode not in ("colocate_async", "separate_async"):
        raise SwitchError(
            f"trainer.v1.trainer_mode={mode}: use sync, colocate_async or separate_async"
        )
    sampler = v1.sampler
    threshold, strategy = sampler.max_off_policy_threshold, sampler.max_off_policy_strategy
    if threshold is not None and (not isinstance(threshold, int) or threshold < 1):
        raise SwitchError(
            f"trainer.v1.sampler.max_off_policy_threshold={threshold}: "
            "set an integer >= 1, or null for no bound"
        )
    if strategy not in ("drop", "wait"):
        raise SwitchError(
            f"trainer.v1.sampler.max_off_policy_strategy={strategy}: use drop or wait"
        )
    batch = config.data.train_batch_size
    if mode == "colocate_async":
        return
    sync_step = v1.separate_async.parameter_sync_step
    mini = config.actor_rollout_ref.actor.ppo_mini_batch_size
    if batch != sync_step * mini:
        raise SwitchError(
            f"separate_async needs data.train_batch_size ({batch}) == trainer.v1.separate_async."
            f"parameter_sync_step ({sync_step}) * actor.ppo_mini_batch_size ({mini}): "
            f"set data.train_batch_size={sync_step * mini}"
        )
    rollout = config.actor_rollout_ref.rollout
    for key in ("nnodes", "n_gpus_per_node"):
        if not rollout[key] > 0:
            raise SwitchError(
                f"separate_async needs actor_rollout_ref.rollout.{key} > 0 (its standalone "
                f"rollout pool); got {rollout[key]}"
            )
    if rollout.checkpoint_engine.backend == "naive":
        raise SwitchError(
            "separate_async cannot sync weights with actor_rollout_ref.rollout.checkpoint_engine"
            ".backend=naive: use nccl, nixl or mooncake"
        )


def run(args: Sequence[str]) -> int:
    """`agentcore-rollout verl ...`: compose, translate, run veRL's `main_ppo`. A config the
    switch refuses is one line on stderr and exit code 2."""
    from hydra.errors import HydraException

    try:
        config_path, config_name, overrides = _split(list(args))
        config = trainer_config(overrides, config_path=config_path, config_name=config_name)
    except (SwitchError, HydraException) as e:
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    from verl.trainer import main_ppo

    main_ppo.main.__wrapped__(config)  # veRL's main, minus its own Hydra command line
    return 0


def _split(args: list[str]) -> tuple[str | None, str, list[str]]:
    """`--config-path DIR`, `--config-name NAME` (or `=` forms), the rest: Hydra overrides."""
    found: dict[str, str] = {}
    rest: list[str] = []
    it = iter(args)
    for arg in it:
        name, sep, value = arg.partition("=")
        if name in ("--config-path", "--config-name"):
            if not sep:
                value = next(it, "")
            if not value:
                raise SwitchError(f"{name} needs a value")
            found[name] = value
        elif arg.startswith("-"):
            raise SwitchError(f"unknown option {arg}: give Hydra overrides as key=value")
        else:
            rest.append(arg)
    return found.get("--config-path"), found.get("--config-name", "ppo_trainer"), rest
