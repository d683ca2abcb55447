"""GRPO on the local policy through the whole pipeline: what `agentcore-rollout train` runs.

Each step rolls out a batch of groups, turns the kept members' traces into samples, takes one
clipped policy-gradient step, pushes the weights to every worker and moves the engine's step.
`max_staleness` keeps the pipeline full; `train.asynchronous` also takes the update off the
rollouts' path (docs/getting-started.md#asynchronous-training-train-async). The learner follows
`local.policy`: the toy in numpy, a Hugging Face model in torch (`hf_grpo`, imported only then)."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import shutil
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import aiohttp

from .. import ConfigError, EngineConfig, EngineStats, Outcome, RolloutCost, RolloutEngine
from .._cost import idle_usd
from ..config import CostConfig
from ..contract import NamedRewards
from ..training import (
    Group,
    GroupPolicy,
    GroupRollout,
    GroupStatus,
    TrainingSample,
    staleness_report,
    training_samples,
    within_staleness,
)
from .config import LocalConfig, TrainConfig
from .grpo import UpdateStats, grpo_update
from .policy.model import TinyPolicy
from .policy.sampling import SamplingParams
from .stack import LocalStack

if TYPE_CHECKING:
    from .hf_grpo import HFLearner

METRICS = "metrics.jsonl"


class StackFailed(RuntimeError):
    """A part of the local stack the trainer needs stopped working (its message names it)."""


FAILED = frozenset(Outcome) - {Outcome.OK, Outcome.CANCELLED, Outcome.STALE}
"""What a step's row (and `train`'s progress bar) counts as `failed`: every outcome but ok and
those the trainer itself ended (cancelled, stale)."""


class TrainerConfig(Protocol):
    """The sections `train` reads: the CLI's `Config` is one (local/ imports no cli/)."""

    @property
    def engine(self) -> EngineConfig: ...
    @property
    def local(self) -> LocalConfig: ...
    @property
    def train(self) -> TrainConfig: ...


class TrainView(Protocol):
    """What the CLI shows while training (a progress bar per step)."""

    def step_started(self, step: int, groups: int) -> None: ...
    def group_resolved(self, group: Group) -> None: ...
    def step_ended(self, row: dict[str, Any]) -> None: ...


async def train(
    config: TrainerConfig,
    prompts: Sequence[tuple[str, dict[str, Any]]],
    out: Path,
    *,
    view: TrainView | None = None,
    interrupted: asyncio.Event | None = None,
    start: int = 0,
) -> list[dict[str, Any]]:
    """Train for `config.train.steps` steps on `prompts` ((input_id, payload) rows); write
    `out/metrics.jsonl` (a row per step, as it ends) and `out/weights/step-NNNN[.npz]`.
    Returns the rows. An `interrupted` event ends the run after the step under way. `start`:
    the steps a previous run trained (`train --resume`), continued from the weights (and the
    optimizer's state, where there is one) it saved after its last step."""
    check_config(config)
    tc = config.train
    resume_from = weights_of(config, out, start) if start else None
    learner = await asyncio.to_thread(make_learner, config, resume_from)
    group_policy = GroupPolicy(tc.n, tc.extra, tc.min_ok)
    per_step = tc.groups_per_step or len(prompts)
    limits = config.engine.limits
    staleness, keep = limits.max_staleness, limits.stale_policy == "keep"
    (out / "weights").mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    async with AsyncExitStack() as stack:
        local = await stack.enter_async_context(LocalStack(config.local))
        engine_config = local.engine_config(config.engine)
        engine = await stack.enter_async_context(RolloutEngine(engine_config, step=start))
        http = await stack.enter_async_context(aiohttp.ClientSession(headers=local.policy_headers))
        workers = [w.url for w in local.workers]
        saved = resume_from or learner.save(out, 0)
        await _push(http, workers, saved, str(start))  # trainer and workers agree
        groups = await stack.enter_async_context(GroupRollout(engine, group_policy))
        prompt_cycle = itertools.cycle(prompts)
        for _ in itertools.islice(prompt_cycle, (start * per_step) % len(prompts)):
            pass  # a resumed run goes on through the prompts where the last one stopped

        def submit(count: int) -> None:
            for input_id, payload in itertools.islice(prompt_cycle, count):
                groups.submit(input_id, payload)

        # async: `max_staleness` steps' groups in flight, so one submitted during step s is
        # taken by step s + max_staleness, its tokens within the bound; what still runs when
        # training ends is cancelled
        in_flight = per_step * max(1, staleness) if tc.asynchronous else per_step
        # pipelined: enough sessions ready to cover one cold start at the start rate
        ready_pool = math.ceil(
            (engine_config.dispatch.start_rate or 1.0) * engine_config.dispatch.session_start_time
        )
        submit(in_flight)
        began = time.monotonic()
        for step in range(start, tc.steps):
            step_began, stats_then = time.monotonic(), engine.stats()
            if not staleness and step + 1 < tc.steps:  # ready as it begins (`engine.warm`)
                engine.warm(per_step * group_policy.size, step=step + 1)
            if view is not None:
                view.step_started(step, per_step)
            taken: list[Group] = []
            stale: list[Group] = []
            while len(taken) < per_step:
                group = await _next_group(groups, local)
                (stale if group.status is GroupStatus.STALE else taken).append(group)
                still_needed = per_step * (tc.steps - step) - len(taken)
                if staleness and groups.pending < (in_flight if tc.asynchronous else still_needed):
                    submit(1)  # keep the pipeline full: the next step's rollouts start now
                    engine.warm(ready_pool)  # ... on sessions already up
                if view is not None:
                    view.group_resolved(group)
            rolled_out = time.monotonic()
            samples = training_samples(taken)
            if keep:
                samples = within_staleness(samples, step, staleness)
            update = await asyncio.to_thread(learner.update, samples, str(step))
            saved = await asyncio.to_thread(learner.save, out, step + 1)
            await _push(http, workers, saved, str(step + 1), abort=tc.asynchronous)
            engine.set_step(step + 1)
            if not staleness and step + 1 < tc.steps:
                submit(per_step)
            now = time.monotonic()
            warm = _warm(engine.stats().since(stats_then), engine_config.cost)
            row = _row(step, taken, stale, update) | warm
            trained = {s.request_id for s in samples} if keep else None
            row |= {
                "staleness": staleness_report([*taken, *stale], step, trained=trained),
                "weight_version": str(step + 1),
                "rollout_s": round(rolled_out - step_began, 3),
                "update_s": round(now - rolled_out, 3),
                "wall_time_s": round(now - step_began, 3),
                "elapsed_s": round(now - began, 3),
            }
            rows.append(row)
            with (out / METRICS).open("a") as sink:
                sink.write(json.dumps(row) + "\n")
            if view is not None:
                view.step_ended(row)
            if interrupted is not None and interrupted.is_set():
                break
    return rows


async def _next_group(groups: GroupRollout, local: LocalStack) -> Group:
    """The next resolved group; a child of the stack that died meanwhile is StackFailed, at
    once, rather than a step of rollouts that wait out their deadline."""
    resolved = asyncio.ensure_future(groups.next())
    while True:
        done, _ = await asyncio.wait({resolved}, timeout=0.5)
        # Looked at even when the group resolved: rollouts that fail at once on a dead
        # gateway resolve groups faster than any timeout, and are no step to train on.
        if (dead := local.dead()) is not None:
            resolved.cancel()
            raise StackFailed(dead)
        if done:
            return resolved.result()


def check_config(config: TrainerConfig) -> None:
    """What `train` needs of the config beyond each field's own checks: a ConfigError."""
    if config.train.asynchronous and not config.engine.limits.max_staleness:
        raise ConfigError(
            "config: train.asynchronous needs engine.limits.max_staleness >= 1: rollouts that "
            "run across an update are a step behind (train --async --max-staleness 1)"
        )


def _row(step: int, taken: list[Group], stale: list[Group], update: UpdateStats) -> dict[str, Any]:
    members = [m for g in taken for m in g.members]
    rewards = [r for g in taken for r in g.rewards]
    by_status = {s: sum(g.status is s for g in taken) for s in GroupStatus}
    diff = update.logprob_max_abs_diff
    return {
        "step": step,
        "reward_mean": _mean(rewards),
        "reward_components": _component_means(taken),
        "requests": len(members),
        "ok": sum(m.outcome is Outcome.OK for m in members),
        "failed": sum(m.outcome in FAILED for m in members),
        "cancelled": sum(m.outcome is Outcome.CANCELLED for m in members),
        "groups_trained": by_status[GroupStatus.TRAIN],
        "groups_skipped": len(taken) - by_status[GroupStatus.TRAIN],
        "groups_all_equal": by_status[GroupStatus.ALL_EQUAL],
        "groups_too_few_ok": by_status[GroupStatus.TOO_FEW_OK],
        "stale": len(stale),
        "stale_requests": sum(m.outcome is Outcome.STALE for g in stale for m in g.members),
        "cost": RolloutCost.total(m.cost for g in [*taken, *stale] for m in g.members).to_dict(),
        "step_lag_mean": _mean([step - g.step for g in taken if g.status is GroupStatus.TRAIN]),
        "resumed_turns": sum(
            bool(turn.get("resumed"))
            for m in members
            if m.trace is not None
            for turn in m.trace.get("turns", [])
        ),
        "samples": update.samples,
        "tokens": update.tokens,
        "on_policy_samples": update.on_policy_samples,
        "off_policy_samples": update.samples - update.on_policy_samples,
        "logprob_max_abs_diff": diff,
        "ratio_mean": round(update.ratio_mean, 6),
        "ratio_max": round(update.ratio_max, 6),
        "clipped_fraction": round(update.clipped_fraction, 6),
        "grad_norm": round(update.grad_norm, 6),
    }


def _warm(stats: EngineStats, prices: CostConfig) -> dict[str, Any]:
    """The step's rollouts that started on a session warmed during the last update, and what
    the wait for them cost."""
    return {
        "warm_used": stats.warm_used,
        "warm_missed": stats.warm_missed,
        "warm_idle_s": round(stats.warm_idle_seconds, 3),
        "warm_idle_usd": idle_usd(stats.warm_idle_seconds, prices),
    }


def _component_means(taken: list[Group]) -> dict[str, float]:
    """The mean of each named reward component over the trained-on members that report it:
    what the scalar is made of (the math agent's `correct` and `format`, say)."""
    values: dict[str, list[float]] = {}
    for member in (m for g in taken for m in g.kept):
        rewards = member.result.rewards if member.result is not None else None
        if isinstance(rewards, NamedRewards):
            for name, value in rewards.components.items():
                values.setdefault(name, []).append(value)
    return {name: round(sum(v) / len(v), 6) for name, v in values.items()}


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def weights_of(config: TrainerConfig, out: Path, step: int) -> Path:
    """Where `train` saves the weights after `step` steps (the toy's .npz, a model's dir)."""
    return _weights(out, step, ".npz" if config.local.policy == "toy" else "")


def _weights(out: Path, step: int, suffix: str) -> Path:
    return (out / "weights" / f"step-{step:04d}{suffix}").resolve()


def make_learner(config: TrainerConfig, resume_from: Path | None = None) -> _ToyLearner | _HFSteps:
    """The trainer's copy of the policy `config.local.policy` names (the toy, or a Hugging Face
    model), from the weights a previous run saved at `resume_from`, if given: one `update` a
    step, then `save` its weights for the workers."""
    if config.local.policy == "toy":
        return _ToyLearner(config, resume_from)
    from .models import model_of

    model_dir = resume_from or model_of(config.local.policy)
    from .hf_grpo import HFLearner  # torch and transformers: only for a Hugging Face policy

    llm = config.engine.llm
    sampling = {"temperature": 1.0, **(llm.sampling if llm else {})}
    # the trainer must recompute under the transform the agents sample with: engine.llm.sampling
    sp = SamplingParams.from_json({k: sampling.get(k) for k in _TRANSFORM})
    hf = HFLearner(model_dir, lr=config.train.lr, clip=config.train.clip, sampling=sp)
    if resume_from is not None:
        hf.load_optimizer()
    return _HFSteps(hf)


_TRANSFORM = ("temperature", "top_p", "top_k", "min_p")


class _ToyLearner:
    def __init__(self, config: TrainerConfig, resume_from: Path | None) -> None:
        self.policy = TinyPolicy(seed=config.local.policy_seed)
        if weights := resume_from or config.local.policy_params:
            self.policy.load(weights)
        self.lr, self.clip = config.train.lr, config.train.clip

    def update(self, samples: Sequence[TrainingSample], weight_version: str) -> UpdateStats:
        return grpo_update(
            self.policy, samples, lr=self.lr, clip=self.clip, weight_version=weight_version
        )

    def save(self, out: Path, step: int) -> Path:
        path = _weights(out, step, ".npz")
        self.policy.save(path)
        return path


class _HFSteps:
    """An HFLearner saving `out/weights/step-NNNN/`, the two newest kept: the workers load the
    newest, and the one before is the last weights every worker is known to hold."""

    def __init__(self, learner: HFLearner) -> None:
        self.learner = learner

    def update(self, samples: Sequence[TrainingSample], weight_version: str) -> UpdateStats:
        return self.learner.update(samples, weight_version=weight_version)

    def save(self, out: Path, step: int) -> Path:
        path = self.learner.save(_weights(out, step, ""))
        for old in sorted((out / "weights").glob("step-*"))[:-2]:
            shutil.rmtree(old, ignore_errors=True)
        return path


async def _push(
    http: aiohttp.ClientSession,
    workers: list[str],
    path: Path,
    version: str,
    *,
    abort: bool = False,
) -> None:
    """Load `path` on every worker under the label `version`; any refusal is an error, since
    a worker left on old weights would make every later sample silently off-policy. `abort`:
    the generations in flight are aborted (the gateway resumes them), not waited for."""

    async def one(url: str) -> None:
        body = {"model_path": str(path), "weight_version": version, "abort_all_requests": abort}
        try:
            async with http.post(f"{url}/update_weights_from_disk", json=body) as resp:
                answer = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError) as e:
            raise StackFailed(f"policy worker {url} cannot be reached ({e!r:.200})") from None
        if resp.status != 200 or not answer.get("success"):
            raise StackFailed(f"policy worker {url} refused weights {path.name}: {answer}")

    await asyncio.gather(*(one(url) for url in workers))
