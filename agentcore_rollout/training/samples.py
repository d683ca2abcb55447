"""Training samples: an ok outcome's token trace, as the rows a policy-gradient trainer needs,
nothing re-tokenized (the trace: docs/gateway.md#the-traces-json-shape). A row adds the
rollout's reward and its group's advantage. Failures never become rows, nor does an ok outcome
without a trace: a reward without its tokens is not a training sample."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from .. import Outcome, RolloutOutcome
from .advantages import grpo_advantages
from .groups import Group, GroupStatus


@dataclass(frozen=True)
class TrainingSample:
    """One row. `logprobs[t]` is the log-prob the sampling policy gave `response_ids[t]` where
    `loss_mask[t]` is 1, and 0.0 where it is 0 (those tokens were not sampled)."""

    request_id: str
    input_id: str
    step: int
    """The step its request was submitted at."""
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    reward: float
    advantage: float
    weight_versions: tuple[str | None, ...]
    """The weight version that sampled each of its turns (the policy server's label)."""
    truncated: bool = False
    ill_formed: bool = False
    token_versions: tuple[str | None, ...] = ()
    """Per response token, the weight version that sampled it (None where `loss_mask` is 0);
    a turn resumed after a weight update holds several. Empty for traces without it."""

    def on_policy(self, weight_version: str) -> bool:
        """True if every turn, and every sampled token, was sampled by the weights labelled
        `weight_version` (a resumed turn's `weight_versions` entry is only its last call's)."""
        sampled = [v for v, m in zip(self.token_versions, self.loss_mask, strict=False) if m]
        versions = [*self.weight_versions, *sampled]
        return bool(self.weight_versions) and all(v == weight_version for v in versions)

    def sampled_runs(self) -> list[tuple[int, int]]:
        """`(start, end)` of each run of sampled tokens in `response_ids` (one per turn the
        policy generated, when turns are separated by any observation or template token)."""
        runs: list[tuple[int, int]] = []
        start: int | None = None
        for t, m in enumerate([*self.loss_mask, 0]):
            if m and start is None:
                start = t
            elif not m and start is not None:
                runs.append((start, t))
                start = None
        return runs


def outcome_samples(outcome: RolloutOutcome, advantage: float) -> list[TrainingSample]:
    """The rows of one ok outcome (one per sample of its trace; a trace with none gives none),
    each with the outcome's reward and `advantage`. A sample the agent did not get all of (the
    gateway marks it `delivered: false`: a reply lost on its way, say a turn the agent's client
    gave up on and sent again) is no row: nothing the agent did, nor its reward, followed
    from it."""
    rid = outcome.request.request_id
    if outcome.outcome is not Outcome.OK:
        raise ValueError(
            f"request {rid} ended {outcome.outcome}: a failure never becomes a training row"
        )
    if outcome.trace is None:
        raise ValueError(
            f"request {rid} ended ok without a token trace: put the gateway in front of the "
            "policy (engine.gateway) to train on it"
        )
    reward = outcome.reward
    if reward is None or not math.isfinite(advantage):
        raise ValueError(f"request {rid}: reward {reward} and advantage {advantage} must be set")
    return [
        _row(outcome, sample, reward, advantage, i)
        for i, sample in enumerate(outcome.trace.get("samples", []))
        if sample.get("delivered", True)
    ]


def group_samples(group: Group, *, scale_by_std: bool = True) -> list[TrainingSample]:
    """The rows of a group's kept members, with GRPO advantages; none unless it is `train`."""
    if group.status is not GroupStatus.TRAIN:
        return []
    advantages = grpo_advantages(group.rewards, scale_by_std=scale_by_std)
    return [
        row
        for member, advantage in zip(group.kept, advantages, strict=True)
        for row in outcome_samples(member, advantage)
    ]


def training_samples(groups: Iterable[Group], *, scale_by_std: bool = True) -> list[TrainingSample]:
    """The rows of every trainable group, in group order."""
    return [row for g in groups for row in group_samples(g, scale_by_std=scale_by_std)]


def within_staleness(
    samples: Iterable[TrainingSample], version: int, max_staleness: int
) -> list[TrainingSample]:
    """The samples as trained at weight `version` with a bound of `max_staleness` steps: each
    sampled token of a version older than `version - max_staleness` is masked out (it stays in
    the sequence as context, untrained), and a sample left with no sampled token is dropped.
    Versions are step numbers (the local stack's and veRL's); a sample without per-token
    versions counts as sampled at its request's step. What `stale_policy` `keep` trains: a long
    rollout whose turns resumed under newer weights trains its recent tokens."""
    oldest, kept = version - max_staleness, []
    for sample in samples:
        versions = sample.token_versions or (str(sample.step),) * len(sample.response_ids)
        mask = [
            int(m and _step_of(v, sample) >= oldest)
            for m, v in zip(sample.loss_mask, versions, strict=True)
        ]
        if not any(mask):
            continue
        if mask != sample.loss_mask:  # tokens out of the bound: context now, not trained
            versions = zip(sample.token_versions, mask, strict=False)
            sample = replace(
                sample,
                loss_mask=mask,
                logprobs=[lp if m else 0.0 for lp, m in zip(sample.logprobs, mask, strict=True)],
                token_versions=tuple(v if m else None for v, m in versions),
            )
        kept.append(sample)
    return kept


def _step_of(version: str | None, sample: TrainingSample) -> int:
    try:
        return int(version if version is not None else sample.step)
    except ValueError:
        raise ValueError(
            f"request {sample.request_id}: weight version {version!r} is not a step number, "
            "which a staleness bound in steps needs"
        ) from None


def _row(
    outcome: RolloutOutcome, sample: Mapping[str, Any], reward: float, advantage: float, index: int
) -> TrainingSample:
    rid = outcome.request.request_id
    try:
        prompt = [int(t) for t in sample["prompt_ids"]]
        response = [int(t) for t in sample["response_ids"]]
        mask = [int(m) for m in sample["loss_mask"]]
        captured = list(sample["logprobs"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"request {rid}: trace sample {index} is malformed ({e!r})") from None
    if not len(response) == len(mask) == len(captured) or set(mask) - {0, 1}:
        raise ValueError(
            f"request {rid}: trace sample {index} needs one 0/1 mask entry and one log-prob "
            "per response token"
        )
    logprobs: list[float] = []
    for t, (m, lp) in enumerate(zip(mask, captured, strict=True)):
        if m and not isinstance(lp, int | float):
            raise ValueError(f"request {rid}: trace sample {index} has no log-prob at token {t}")
        logprobs.append(float(lp) if m else 0.0)
    return TrainingSample(
        request_id=rid,
        input_id=outcome.request.input_id,
        step=outcome.step,
        prompt_ids=prompt,
        response_ids=response,
        loss_mask=mask,
        logprobs=logprobs,
        reward=reward,
        advantage=advantage,
        weight_versions=tuple(sample.get("weight_versions", ())),
        truncated=bool(sample.get("truncated", False)),
        ill_formed=bool(sample.get("ill_formed", False)),
        token_versions=_token_versions(sample.get("version_runs"), len(response), rid, index),
    )


def _token_versions(runs: Any, n: int, rid: str, index: int) -> tuple[str | None, ...]:
    """A trace sample's `version_runs` ([[version, count], ...]) as one version per token."""
    if runs is None:
        return ()
    try:
        versions = tuple(v for version, count in runs for v in [version] * int(count))
    except (TypeError, ValueError):
        raise ValueError(f"request {rid}: trace sample {index}: malformed version_runs") from None
    if len(versions) != n:
        raise ValueError(f"request {rid}: trace sample {index}'s version_runs do not cover it")
    return versions
