"""What staleness cost a step: its rollouts delivered and dropped, by how many steps behind they
were and by how long they ran. A trainer that drops stale rollouts drifts towards the prompts
whose rollouts are quick (the long ones fall behind): these two tables show it happening, or not."""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterable

from .. import Outcome, RolloutOutcome
from .groups import Group, GroupStatus

DURATION_EDGES = (1, 3, 10, 30, 100, 300, 1000)
"""Seconds: the upper edges of the duration buckets, from session start to outcome."""


def staleness_report(
    groups: Iterable[Group], step: int, *, trained: Collection[str] | None = None
) -> dict[str, dict[str, dict[str, int]]]:
    """`{"by_staleness": {"0": {"delivered": n, "dropped": n}, "1": ...}, "by_duration":
    {"<1s": ..., "1-3s": ..., ">=1000s": ...}}` for the rollouts of `groups` taken at `step`.
    `trained`: the request ids left with a trainable token after the staleness bound (None:
    no token bound was applied)."""
    by_staleness: dict[str, dict[str, int]] = {}
    by_duration: dict[str, dict[str, int]] = {}
    for group in groups:
        kept = {m.request.request_id for m in group.kept}
        for member in group.members:
            if (verdict := _verdict(member, group, kept, trained)) is not None:
                lag, bucket = str(step - member.step), _bucket(member)
                for table, key in ((by_staleness, lag), (by_duration, bucket)):
                    table.setdefault(key, {"delivered": 0, "dropped": 0})[verdict] += 1
    return {
        "by_staleness": dict(sorted(by_staleness.items(), key=lambda kv: int(kv[0]))),
        "by_duration": {b: by_duration[b] for b in _BUCKETS if b in by_duration},
    }


def _verdict(
    member: RolloutOutcome, group: Group, kept: set[str], trained: Collection[str] | None
) -> str | None:
    if member.outcome is not Outcome.OK:  # stale: dropped; failed or cancelled: neither
        return "dropped" if member.outcome is Outcome.STALE else None
    rid = member.request.request_id
    trainable = group.status is GroupStatus.TRAIN and rid in kept
    untrained = trained is not None and trainable and rid not in trained  # no token in bound
    return "dropped" if group.status is GroupStatus.STALE or untrained else "delivered"


_BUCKETS = [
    f"<{DURATION_EDGES[0]}s",
    *(f"{lo}-{hi}s" for lo, hi in itertools.pairwise(DURATION_EDGES)),
    f">={DURATION_EDGES[-1]}s",
    "unstarted",
]


def _bucket(member: RolloutOutcome) -> str:
    if member.started_at is None:
        return "unstarted"
    ran = member.finished_at - member.started_at
    for edge, label in zip(DURATION_EDGES, _BUCKETS, strict=False):
        if ran < edge:
            return label
    return _BUCKETS[-2]
