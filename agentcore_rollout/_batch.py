"""What goes in and what comes out: `RolloutRequest` -> `RolloutOutcome`, many of them a
`RolloutBatch`. A failure carries no rewards: no training row is ever invented for it.
`RolloutTally` holds a batch's figures as counts and sums, for who takes them step by step
without keeping the outcomes."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import uuid4

from ._cost import RolloutCost
from ._stats import EngineStats
from .contract import Outcome, RolloutResult


@dataclass
class RolloutRequest:
    """One rollout: the user's JSON payload, its group (`input_id`) and index in the group."""

    payload: dict[str, Any]
    input_id: str
    sample_index: int = 0
    request_id: str = field(default_factory=lambda: uuid4().hex)


@dataclass(frozen=True)
class RolloutStart:
    """A request whose session started: what `RolloutEngine.resume` takes after a restart."""

    request: RolloutRequest
    step: int
    session_id: str
    started_at: float | None
    """When the invocation that started the session was sent (unix seconds); None: unknown (a
    session `reclaim` took over without a journal)."""
    deadline: float
    """The rollout's deadline given to its agent: `started_at + timeout`, no later than the
    deadline `submit` was given."""
    gateway_session_id: str | None
    """The gateway session the agent calls the policy through (none without a gateway)."""
    gateway_url: str | None
    """The gateway replica holding that session (its admin URL): where its trace is."""
    endpoint: str
    """The runtime endpoint the session started on (`RuntimeTarget.name`: `<arn>#<qualifier>`),
    where `resume` stops it."""


@dataclass(frozen=True)
class RolloutOutcome:
    """The terminal outcome of one request, built once when it ended and never changed;
    `result` is set only if the agent wrote one."""

    request: RolloutRequest
    step: int
    outcome: Outcome
    session_id: str
    result: RolloutResult | None = None
    error: str | None = None
    submitted_at: float = 0.0
    trace: dict[str, Any] | None = None
    """Exact token trace from the gateway (prompt ids, sampled ids, mask, log-probs)."""
    started_at: float | None = None
    """When the invocation that started the session was sent (unix seconds)."""
    deadline: float | None = None
    """The rollout's deadline given to its agent (see `RolloutStart.deadline`)."""
    gateway_session_id: str | None = None
    """The gateway session the agent called the policy through (none without a gateway)."""
    gateway_url: str | None = None
    """The gateway replica that session was on (its admin URL)."""
    delivered_at: float | None = None
    finished_at: float = 0.0
    cost: RolloutCost | None = None
    """What it cost: sandbox seconds from `started_at` to `finished_at` (0 if its session never
    started), the trace's tokens (None without one) and the estimate at `engine.cost`'s prices.
    Every outcome an engine builds has one, failures included; None only for one built by hand."""

    @property
    def reward(self) -> float | None:
        return self.result.scalar_reward() if self.result is not None else None

    @property
    def weight_versions(self) -> tuple[str, ...]:
        """The policy weight versions that sampled this rollout's turns, in the order they
        were first used, from the gateway's trace (empty without one). More than one: the
        weights changed while it ran."""
        seen: dict[str, None] = {}
        for turn in (self.trace or {}).get("turns", []):
            if turn.get("weight_version") is not None:
                seen.setdefault(str(turn["weight_version"]), None)
        return tuple(seen)

    @property
    def latency(self) -> float:
        return self.finished_at - self.submitted_at

    def to_dict(self) -> dict[str, Any]:
        """One JSON line per request: what `rollouts.jsonl` holds."""
        return {
            "request_id": self.request.request_id,
            "input_id": self.request.input_id,
            "sample_index": self.request.sample_index,
            "step": self.step,
            "weight_versions": list(self.weight_versions),
            "session_id": self.session_id,
            "gateway_url": self.gateway_url,  # the replica its trace came from (or was lost on)
            "outcome": str(self.outcome),
            "reward": self.reward,
            "error": self.error,
            "latency": round(self.latency, 4),
            "cost": self.cost.to_dict(counts=False) if self.cost is not None else None,
            "result": self.result.model_dump(mode="json", exclude={"sig"}) if self.result else None,
            "trace": self.trace,
        }


@dataclass(frozen=True)
class LateResult:
    """A result that arrived after its request had ended (timed out, cancelled, or of an older
    step). Kept apart, never mixed into a batch."""

    request_id: str
    step: int
    reward: float | None


@dataclass
class RolloutBatch:
    """Outcomes in request order, with the figures a trainer logs. `stats` holds what the
    engine did while the batch ran (retries, throttles, duplicates, API calls, ...)."""

    step: int
    outcomes: list[RolloutOutcome]
    stats: EngineStats
    wall_time: float

    @property
    def counts(self) -> dict[str, int]:
        counted = Counter(str(o.outcome) for o in self.outcomes)
        return {str(k): counted.get(str(k), 0) for k in Outcome}

    @property
    def ok(self) -> list[RolloutOutcome]:
        return [o for o in self.outcomes if o.outcome is Outcome.OK]

    def latency(self) -> dict[str, float]:
        return _quantiles([o.latency for o in self.outcomes])

    @property
    def reward_mean(self) -> float | None:
        """Mean scalar reward of the outcomes that have one (failures have none)."""
        rewards = [o.reward for o in self.outcomes if o.reward is not None]
        return sum(rewards) / len(rewards) if rewards else None

    @property
    def throughput(self) -> float:
        return len(self.outcomes) / self.wall_time if self.wall_time > 0 else 0.0

    @property
    def cost(self) -> RolloutCost:
        """The sum of its outcomes' costs: sandbox seconds, tokens, estimated dollars."""
        return RolloutCost.total(o.cost for o in self.outcomes)

    @property
    def api_calls(self) -> dict[str, int]:
        return self.stats.api_calls

    @property
    def api_calls_per_rollout(self) -> float:
        return sum(self.api_calls.values()) / len(self.outcomes) if self.outcomes else 0.0

    def metrics(self) -> dict[str, float]:
        """A flat dict of numbers, ready for a trainer's logger (see `RolloutTally.metrics`)."""
        out = RolloutTally.of(self.outcomes).metrics()
        out["rollout/wall_time"] = self.wall_time
        out["rollout/throughput"] = self.throughput
        out["rollout/api_calls_per_rollout"] = self.api_calls_per_rollout
        return out | self.stats.metrics()


# Distinct failure reasons one tally keeps: an agent's error types are its own words, and a
# logger (wandb, MLflow, ...) makes a chart per key. The rest count as `other`.
_MAX_REASONS = 16
_NOT_KEY = re.compile(r"[^A-Za-z0-9_.-]+")


def failure_reason(outcome: RolloutOutcome) -> str | None:
    """A short key for why a rollout failed (None if ok): the error type the agent reported
    (cleaned to `[A-Za-z0-9_.-]`, at most 40 characters), `unspecified` for an agent's own
    failure without one, `engine` for an outcome the engine decided (a deadline, a refused
    result, a start that failed: `EngineStats` counts those by cause). Never free text."""
    if outcome.outcome is Outcome.OK:
        return None
    if outcome.result is None:
        return "engine"
    error = outcome.result.error
    reason = _NOT_KEY.sub("_", error.type).strip("_")[:40] if error is not None else ""
    return reason or "unspecified"


@dataclass
class RolloutTally:
    """The figures of many outcomes as counts and sums, without keeping the outcomes (their
    traces are large): what a long-lived consumer adds each outcome to, and takes per step."""

    counts: Counter[str] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)
    """By `<outcome>/<reason>` (`failure_reason`), at most `_MAX_REASONS` reasons, then `other`."""
    latencies: list[float] = field(default_factory=list)
    reward_sum: float = 0.0
    rewarded: int = 0
    cost: RolloutCost = field(default_factory=lambda: RolloutCost(rollouts=0))
    turns: int = 0
    resumed_turns: int = 0
    """Turns a weight update aborted mid-generation that the gateway resumed."""

    @classmethod
    def of(cls, outcomes: Iterable[RolloutOutcome]) -> RolloutTally:
        tally = cls()
        for outcome in outcomes:
            tally.add(outcome)
        return tally

    def add(self, outcome: RolloutOutcome) -> None:
        self.counts[str(outcome.outcome)] += 1
        if (reason := failure_reason(outcome)) is not None:
            seen = {k.split("/", 1)[1] for k in self.failures}
            if reason not in seen and len(seen) >= _MAX_REASONS:
                reason = "other"
            self.failures[f"{outcome.outcome}/{reason}"] += 1
        self.latencies.append(outcome.latency)
        if outcome.reward is not None:
            self.reward_sum += outcome.reward
            self.rewarded += 1
        if outcome.cost is not None:
            self.cost += outcome.cost
        turns = (outcome.trace or {}).get("turns", [])
        self.turns += len(turns)
        self.resumed_turns += sum(1 for t in turns if t.get("resumed"))

    def latency(self) -> dict[str, float]:
        """Latency quantiles (`p50`, `p95`, `p99`), as `RolloutBatch.latency` has them."""
        return _quantiles(self.latencies)

    def metrics(self) -> dict[str, float]:
        """`rollout/outcome/<kind>` (every kind, 0 included), `rollout/failure/<outcome>/
        <reason>`, `rollout/latency_p50|p95|p99`, `rollout/reward_mean`, `rollout/turns`,
        `rollout/resumed_turns` and `rollout/cost/...` (`RolloutCost.metrics`)."""
        out: dict[str, float] = {
            f"rollout/outcome/{k}": self.counts.get(str(k), 0) for k in Outcome
        }
        out |= {f"rollout/failure/{k}": v for k, v in sorted(self.failures.items())}
        out |= {f"rollout/latency_{k}": v for k, v in self.latency().items()}
        if self.rewarded:
            out["rollout/reward_mean"] = self.reward_sum / self.rewarded
        out["rollout/turns"] = self.turns
        out["rollout/resumed_turns"] = self.resumed_turns
        return out | self.cost.metrics(ok=self.counts.get("ok", 0))


def _quantiles(
    values: Sequence[float], qs: Iterable[float] = (0.5, 0.95, 0.99)
) -> dict[str, float]:
    """Nearest-rank quantiles, keyed `p50`, `p95`, ...; empty input gives an empty dict."""
    ordered = sorted(values)
    if not ordered:
        return {}
    return {
        f"p{round(q * 100)}": ordered[
            min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
        ]
        for q in qs
    }
