"""GRPO's group-relative advantage: each member's reward against its group's.

    advantage_i = (reward_i - mean(rewards)) / (std(rewards) + eps)

The standard deviation is the sample one (n - 1), as veRL computes it, so advantages from here
and from veRL's GRPO agree. A one-member group gets its raw reward (mean 0, std 1, veRL's
convention); a group whose rewards are all equal gets zeros, which is why `groups` does not
train such groups at all.
"""

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
