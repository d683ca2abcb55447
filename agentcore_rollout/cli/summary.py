"""The figures of a run: what `summary.json` holds and the tables show."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict
from typing import Any

from .. import Outcome, RolloutBatch, RolloutOutcome

SUMMARY = "summary.json"


def summarize(batch: RolloutBatch) -> dict[str, Any]:
    """The batch's figures, plus per group."""
    groups: dict[str, list[RolloutOutcome]] = defaultdict(list)
    for o in batch.outcomes:
        groups[o.request.input_id].append(o)
    return {
        "requests": len(batch.outcomes),
        "outcomes": batch.counts,
        "reward_mean": batch.reward_mean,
        "groups": {
            gid: {
                "n": len(members),
                "ok": sum(m.outcome is Outcome.OK for m in members),
                "reward_mean": _mean([m.reward for m in members if m.reward is not None]),
            }
            for gid, members in groups.items()
        },
        "latency_s": batch.latency(),
        "wall_time_s": batch.wall_time,
        "throughput_per_s": batch.throughput,
        "api_calls": batch.api_calls,
        "api_calls_per_rollout": batch.api_calls_per_rollout,
        "engine": asdict(batch.stats),
    }


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None
