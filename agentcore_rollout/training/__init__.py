"""From outcomes to training rows, for a trainer of any framework (plain Python, no numpy).

    groups = collect_groups(batch.outcomes, GroupPolicy(n=8, min_ok=2))   # or GroupRollout
    rows = training_samples(groups)   # prompt ids, response ids, loss mask, log-probs, advantage

`groups` judges each prompt's members (`GroupPolicy`: `n`, over-provisioning `extra`,
`min_ok`; all-equal and stale groups are reported, not trained), `samples` turns ok outcomes'
token traces into rows (`within_staleness` masks tokens sampled too many versions ago),
`advantages` computes GRPO's group-relative advantages, and `staleness` reports the rollouts
delivered and dropped by staleness and by duration.
"""

from .advantages import grpo_advantages
from .groups import Group, GroupPolicy, GroupRollout, GroupStatus, collect_groups
from .samples import (
    TrainingSample,
    group_samples,
    outcome_samples,
    training_samples,
    within_staleness,
)
from .staleness import staleness_report

__all__ = [
    "Group",
    "GroupPolicy",
    "GroupRollout",
    "GroupStatus",
    "TrainingSample",
    "collect_groups",
    "group_samples",
    "grpo_advantages",
    "outcome_samples",
    "staleness_report",
    "training_samples",
    "within_staleness",
]
