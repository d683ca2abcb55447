"""GRPO's group-relative advantage: `(reward_i - mean) / (std + eps)`, with the sample standard
deviation (n - 1), as veRL computes it, so the two agree. A one-member group gets its raw reward
(veRL's convention); an all-equal group gets zeros, which is why `groups` does not train one."""

from __future__ import annotations

import math
from collections.abc import Sequence


def grpo_advantages(
    rewards: Sequence[float], *, scale_by_std: bool = True, eps: float = 1e-6
) -> list[float]:
    """One advantage per reward. `scale_by_std=False` keeps only the mean baseline (Dr. GRPO),
    which does not up-weight groups whose rewards barely differ."""
    values = [float(r) for r in rewards]
    if not all(math.isfinite(r) for r in values):
        raise ValueError(f"rewards must be finite numbers, got {values}")
    if len(values) < 2:  # none, or one member: its raw reward
        return values
    mean = sum(values) / len(values)
    centered = [r - mean for r in values]
    if not scale_by_std:
        return centered
    std = math.sqrt(sum(c * c for c in centered) / (len(values) - 1))
    return [c / (std + eps) for c in centered]
