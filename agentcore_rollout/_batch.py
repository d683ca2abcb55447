"""What goes in and what comes out: `RolloutRequest` -> `RolloutOutcome`, many of them a
`RolloutBatch`. A failure carries no rewards: no training row is ever invented for it."""

from __future__ import annotations

import math
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
class StaleResult:
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
        """A flat dict of numbers, ready for a trainer's logger."""
        out: dict[str, float] = {f"rollout/outcome/{k}": v for k, v in self.counts.items()}
        out |= {f"rollout/latency_{k}": v for k, v in self.latency().items()}
        if self.reward_mean is not None:
            out["rollout/reward_mean"] = self.reward_mean
        out["rollout/wall_time"] = self.wall_time
        out["rollout/throughput"] = self.throughput
        out["rollout/api_calls_per_rollout"] = self.api_calls_per_rollout
        out |= self.cost.metrics(ok=len(self.ok))
        return out | self.stats.metrics()


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
