"""The figures of a run: what `summary.json` holds and the tables show, typed, and built once
the run's outcomes are all in (a resumed run's count in what ended before the crash)."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass, replace

from .. import EngineStats, Outcome, RolloutBatch, RolloutOutcome

SUMMARY = "summary.json"
_WHEN_SET = ("resumed_after", "write_error")


@dataclass(frozen=True)
class GroupFigures:
    """One group (a dataset row's `n` samples)."""

    n: int
    ok: int
    reward_mean: float | None


@dataclass(frozen=True)
class RunSummary:
    """A run's figures. The field names are summary.json's keys, which scripts read (CI reads
    `requests` and `outcomes`): renaming one breaks them."""

    requests: int
    outcomes: dict[str, int]  # every outcome's count, zeros included
    reward_mean: float | None
    groups: dict[str, GroupFigures]
    latency_s: dict[str, float]  # p50, p95, p99
    wall_time_s: float
    throughput_per_s: float
    api_calls: dict[str, int]
    api_calls_per_rollout: float
    engine: EngineStats
    interrupted: bool
    resumed_after: int = 0  # a resumed run: the requests that had ended before it, counted in
    write_error: str | None = None  # what could not be written to the output folder

    @classmethod
    def of(cls, batch: RolloutBatch, *, interrupted: bool) -> RunSummary:
        groups: dict[str, list[RolloutOutcome]] = defaultdict(list)
        for o in batch.outcomes:
            groups[o.request.input_id].append(o)
        return cls(
            requests=len(batch.outcomes),
            outcomes=batch.counts,
            reward_mean=batch.reward_mean,
            groups={
                gid: GroupFigures(
                    n=len(members),
                    ok=sum(m.outcome is Outcome.OK for m in members),
                    reward_mean=_mean([m.reward for m in members if m.reward is not None]),
                )
                for gid, members in groups.items()
            },
            latency_s=batch.latency(),
            wall_time_s=batch.wall_time,
            throughput_per_s=batch.throughput,
            api_calls=batch.api_calls,
            api_calls_per_rollout=batch.api_calls_per_rollout,
            engine=batch.stats,
            interrupted=interrupted,
        )

    @property
    def ok(self) -> int:
        return self.outcomes[str(Outcome.OK)]

    def counting_in(self, ended: list[str]) -> RunSummary:
        """The whole run for a resumed one: `ended` holds the outcome of each request that had
        ended before it (its rollouts.jsonl lines). Counts only: the figures are this run's."""
        outcomes = dict(self.outcomes)
        for outcome in ended:
            outcomes[outcome] += 1
        return replace(
            self,
            requests=self.requests + len(ended),
            outcomes=outcomes,
            resumed_after=len(ended),
        )

    def to_json(self) -> str:
        """summary.json's text: `resumed_after` and `write_error` only when they happened."""
        fields = {k: v for k, v in asdict(self).items() if v or k not in _WHEN_SET}
        return json.dumps(fields, indent=2) + "\n"


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None
