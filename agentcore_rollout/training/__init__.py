"""From outcomes to training rows, for a trainer of any framework (plain Python, no numpy): GRPO
groups judged (`groups`), ok outcomes' token traces as rows (`samples`), group-relative
advantages (`advantages`), and what staleness cost (`staleness`).
docs/how-it-works.md#grpo-groups-and-training-rows."""

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
