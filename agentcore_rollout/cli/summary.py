"""The figures of a run: what `summary.json` holds and the tables show, typed, and built once
the run's outcomes are all in (a resumed run's count in what ended before the crash), from a
tally taken as they ended."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from .. import EngineStats, Outcome, RolloutCost, RolloutOutcome, RolloutTally

SUMMARY = "summary.json"
_WHEN_SET = ("resumed_after", "run_again", "write_error")


@dataclass(frozen=True)
class GroupFigures:
    """One group (a dataset row's `n` samples)."""

    n: int
    ok: int
    reward_mean: float | None


@dataclass
class Tally(RolloutTally):
    """What the summary needs of each outcome, taken as it ends (counts and sums, and each
    group's members' outcome and reward); not the outcomes, which hold trajectories and traces
    (kilobytes each): a long run's memory would grow with them."""

    groups: dict[str, list[tuple[Outcome, float | None]]] = field(default_factory=dict)

    def add(self, outcome: RolloutOutcome) -> None:
        super().add(outcome)
        self.groups.setdefault(outcome.request.input_id, []).append(
            (outcome.outcome, outcome.reward)
        )

    def progress(self) -> dict[str, float]:
        """The figures so far, for a tracker while the run goes on (at step `ended`): the
        outcome counts, failure reasons and reward mean of `RolloutTally.metrics`."""
        out = {"progress/ended": float(len(self.latencies))}
        for key, value in self.metrics().items():
            if key.startswith(_PROGRESS):
                out[f"progress/{key.removeprefix('rollout/')}"] = value
        return out


_PROGRESS = ("rollout/outcome/", "rollout/failure/", "rollout/reward_mean")


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
    cost: dict[str, Any]  # RolloutCost's sums (estimated usd), usd_per_rollout, usd_per_ok
    failures: dict[str, int]  # by `<outcome>/<reason>` (`RolloutTally.failures`)
    engine: EngineStats
    interrupted: bool
    resumed_after: int = 0  # a resumed run: the requests that had ended before it, counted in
    run_again: int = 0  # a resumed run: the requests an interrupt had cancelled, run again
    write_error: str | None = None  # what could not be written to the output folder

    @classmethod
    def of(
        cls, tally: Tally, stats: EngineStats, wall_time: float, *, interrupted: bool
    ) -> RunSummary:
        requests, counts = len(tally.latencies), tally.counts
        return cls(
            requests=requests,
            outcomes={str(k): counts[k] for k in Outcome},
            reward_mean=tally.reward_sum / tally.rewarded if tally.rewarded else None,
            groups={g: _group(members) for g, members in tally.groups.items()},
            latency_s=tally.latency(),
            wall_time_s=wall_time,
            throughput_per_s=requests / wall_time if wall_time > 0 else 0.0,
            api_calls=stats.api_calls,
            api_calls_per_rollout=sum(stats.api_calls.values()) / requests if requests else 0.0,
            cost=_cost(tally.cost, counts[Outcome.OK]),
            failures=dict(sorted(tally.failures.items())),
            engine=stats,
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
        n = len(ended)
        return replace(self, requests=self.requests + n, outcomes=outcomes, resumed_after=n)

    def metrics(self) -> dict[str, Any]:
        """The figures for a tracker, under the keys `RolloutBatch.metrics()` gives them."""
        out: dict[str, Any] = {f"rollout/outcome/{k}": v for k, v in self.outcomes.items()}
        out |= {f"rollout/latency_{k}": v for k, v in self.latency_s.items()}
        out |= {
            "rollout/requests": self.requests,
            "rollout/reward_mean": self.reward_mean,
            "rollout/wall_time": self.wall_time_s,
            "rollout/throughput": self.throughput_per_s,
            "rollout/api_calls_per_rollout": self.api_calls_per_rollout,
        }
        out |= {f"rollout/cost/{k}": v for k, v in self.cost.items()}
        out |= {f"rollout/failure/{k}": v for k, v in self.failures.items()}
        return out | self.engine.metrics()

    def to_json(self) -> str:
        """summary.json's text: `resumed_after`, `run_again` and `write_error` only when they
        happened."""
        fields = {k: v for k, v in asdict(self).items() if v or k not in _WHEN_SET}
        return json.dumps(fields, indent=2) + "\n"


def _cost(cost: RolloutCost, ok: int) -> dict[str, Any]:
    """This run's cost (a resumed run's: what ran after the restart), with the dollars per
    rollout and per ok rollout: what one training sample cost, failures included."""
    per_rollout = cost.usd / cost.rollouts if cost.rollouts else None
    per_ok = cost.usd / ok if ok else None
    return cost.to_dict() | {"usd_per_rollout": per_rollout, "usd_per_ok": per_ok}


def _group(members: list[tuple[Outcome, float | None]]) -> GroupFigures:
    rewards = [r for _, r in members if r is not None]
    return GroupFigures(len(members), sum(o is Outcome.OK for o, _ in members), _mean(rewards))


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None
