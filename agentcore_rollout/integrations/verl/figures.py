"""The engine's figures in veRL's step metrics, so every `trainer.logger` backend shows them.

An agent loop cannot add to veRL 0.9.1's per-step `metrics` (its outputs go to TransferQueue),
but what the replay buffer's `sample()` returns is merged in: so these are veRL's own buffers,
adding the engine service's `take_figures()`. An engine that does not answer gives no figures,
never an error that stops training (docs/verl.md#the-engines-figures-in-verls-logs)."""

from __future__ import annotations

import logging
from typing import Any

from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync

from .agent_loop import SERVICE_NAME, _local_services

log = logging.getLogger(__name__)

_ANSWER_WITHIN = 30.0  # seconds the engine service has to hand over its figures


def engine_figures() -> dict[str, float]:
    """The engine service's figures since the last take (`EngineService.take_figures`): of the
    named Ray actor under Ray, else of this process's services; empty if there is none yet."""
    import ray

    try:
        if not ray.is_initialized():
            out: dict[str, float] = {}
            for service in _local_services.values():
                out |= service.take_figures()
            return out
        try:
            actor = ray.get_actor(SERVICE_NAME)
        except ValueError:  # no rollout has created it yet
            return {}
        return ray.get(actor.take_figures.remote(), timeout=_ANSWER_WITHIN)
    except Exception as e:  # figures are worth less than the step that would wait on them
        log.warning("the engine's figures are left out of this step: %s", e)
        return {}


class EngineFigures:
    """A mixin: `sample()` of the veRL buffer it is mixed into, plus the engine's figures on
    each step's first `train` sample. First among a sampler's bases:
    `class MySampler(EngineFigures, ReplayBuffer)`."""

    _taken_at: int | None = None  # the global step whose figures were taken

    def sample(
        self, global_steps: int, partition_id: str, batch_size: int
    ) -> tuple[Any, dict[str, Any]]:
        batch, metrics = super().sample(global_steps, partition_id, batch_size)  # type: ignore[misc]
        if partition_id == "train" and global_steps != self._taken_at:
            self._taken_at = global_steps
            metrics = {**metrics, **engine_figures()}
        return batch, metrics


class FiguresReplayBuffer(EngineFigures, ReplayBuffer):
    """veRL's sync `ReplayBuffer`, with the engine's figures."""


class FiguresReplayBufferAsync(EngineFigures, ReplayBufferAsync):
    """veRL's `ReplayBufferAsync` (colocate_async, separate_async), with the engine's figures."""
