"""A GRPO update of the local `TinyPolicy` from training samples, exact and in numpy.

PPO's clipped objective per sampled token, `min(r_t * A, clip(r_t, 1 - eps, 1 + eps) * A)` with
`r_t = exp(logp_now(t) - logp_behaviour(t))`, averaged over the batch's sampled tokens
("token-mean"). `logp_behaviour` is what the gateway captured, so an off-policy sample is weighed
by its importance ratio; on-policy, r_t is exactly 1, which `logprob_max_abs_diff` checks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..training import TrainingSample
from .policy.model import TinyPolicy


@dataclass(frozen=True)
class UpdateStats:
    """What one update saw and did."""

    samples: int
    tokens: int
    """Sampled tokens (loss mask 1) the update averaged over."""
    on_policy_samples: int
    logprob_max_abs_diff: float | None
    """max |recomputed - captured log-prob| over on-policy samples' tokens, before the update
    (None if there were none); 0 when the trainer and the servers hold the same weights."""
    ratio_mean: float
    ratio_max: float
    clipped_fraction: float
    """Tokens whose clipped ratio took them out of the gradient."""
    grad_norm: float


@dataclass
class UpdateTally:
    """An update's running sums, kept alike by both learners (this one and `hf_grpo`'s)."""

    on_policy: int = 0
    tokens: int = 0
    clipped: int = 0
    max_diff: float | None = None
    ratio_sum: float = 0.0
    ratio_max: float = 0.0

    def add_run(
        self, ratio: np.ndarray, advantage: float, clip: float, diff: float | None
    ) -> np.ndarray:
        """A run of sampled tokens (ratios, max |recomputed - captured| or None); returns the
        tokens the clip takes out of the gradient, their ratio out of range the advantage's way."""
        a = advantage
        out = (ratio > 1 + clip) if a > 0 else (ratio < 1 - clip) if a < 0 else ratio < 0
        self.tokens += len(ratio)
        self.clipped += int(out.sum())
        self.ratio_sum += float(ratio.sum())
        self.ratio_max = max(self.ratio_max, float(ratio.max()))
        if diff is not None:
            self.max_diff = diff if self.max_diff is None else max(self.max_diff, diff)
        return out

    def stats(self, samples: int, grad_norm: float) -> UpdateStats:
        return UpdateStats(
            samples=samples,
            tokens=self.tokens,
            on_policy_samples=self.on_policy,
            logprob_max_abs_diff=self.max_diff,
            ratio_mean=self.ratio_sum / self.tokens if self.tokens else 1.0,
            ratio_max=self.ratio_max,
            clipped_fraction=self.clipped / self.tokens if self.tokens else 0.0,
            grad_norm=grad_norm,
        )


def grpo_update(
    policy: TinyPolicy,
    samples: Sequence[TrainingSample],
    *,
    lr: float,
    clip: float = 0.2,
    weight_version: str,
    temperature: float = 1.0,
) -> UpdateStats:
    """One gradient-ascent step of the clipped objective over `samples`, in place.
    `weight_version` is the label of the weights `policy` holds now (what on-policy means);
    `temperature` must be the one the rollouts sampled at."""
    grads = {name: np.zeros_like(value) for name, value in policy.params.items()}
    tally = UpdateTally()
    for sample in samples:
        tally.on_policy += (fresh := sample.on_policy(weight_version))
        for start, end in sample.sampled_runs():
            context = [*sample.prompt_ids, *sample.response_ids[:start]]
            run = sample.response_ids[start:end]
            behaviour = np.asarray(sample.logprobs[start:end])
            now, _ = policy.logprobs_and_grad(context, run, temperature=temperature)
            ratio = np.exp(now - behaviour)
            diff = float(np.max(np.abs(now - behaviour))) if fresh else None
            out = tally.add_run(ratio, sample.advantage, clip, diff)
            weights = np.where(out, 0.0, sample.advantage * ratio)
            _, g = policy.logprobs_and_grad(context, run, weights, temperature)
            for name, value in g.items():
                grads[name] += value
    if tally.tokens:
        for value in grads.values():
            value /= tally.tokens
        policy.apply_update(grads, lr)
    grad_norm = float(np.sqrt(sum(float((v * v).sum()) for v in grads.values())))
    return tally.stats(len(samples), grad_norm)
