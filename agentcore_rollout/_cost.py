"""What a rollout cost: its sandbox session's seconds, its gateway tokens, and an estimate in
dollars at `engine.cost`'s prices. One rollout's cost and the sum of many are the same type, so
every figure adds up one way.

Tokens nobody reported (no gateway, or one that did not answer) are None and counted in
`untraced`, never 0. What counts and from when: docs/outputs.md#what-a-rollout-cost."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from .config import CostConfig

_MILLION = 1e6


@dataclass(frozen=True)
class RolloutCost:
    """The cost of one rollout, or the sum of several (`+`, `RolloutCost.total`).

    Tokens are sums over the rollouts whose tokens are known; `untraced` counts the others, so a
    total with `untraced > 0` is a lower bound of the tokens spent. `token_usd` is None when no
    rollout's tokens are known. The dollar figures are estimates (see `CostConfig`)."""

    sandbox_seconds: float = 0.0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    reused_prompt_tokens: int | None = None
    """Of `prompt_tokens`, those each turn took from earlier renders: the session's earlier
    turns, or the system prompt and tools another session sent first (the gateway did not
    re-encode them; a backend's prefix cache, shared across requests, holds them)."""
    sandbox_usd: float = 0.0
    token_usd: float | None = None
    rollouts: int = 1
    untraced: int = 0

    @property
    def usd(self) -> float:
        """The estimate: the sandbox's and the known tokens'."""
        return self.sandbox_usd + (self.token_usd or 0.0)

    def __add__(self, other: RolloutCost) -> RolloutCost:
        return RolloutCost(
            sandbox_seconds=self.sandbox_seconds + other.sandbox_seconds,
            prompt_tokens=_plus(self.prompt_tokens, other.prompt_tokens),
            completion_tokens=_plus(self.completion_tokens, other.completion_tokens),
            reused_prompt_tokens=_plus(self.reused_prompt_tokens, other.reused_prompt_tokens),
            sandbox_usd=self.sandbox_usd + other.sandbox_usd,
            token_usd=_plus(self.token_usd, other.token_usd),
            rollouts=self.rollouts + other.rollouts,
            untraced=self.untraced + other.untraced,
        )

    @classmethod
    def total(cls, costs: Iterable[RolloutCost | None]) -> RolloutCost:
        """The sum of `costs` (None, an outcome built outside an engine, is skipped)."""
        out = cls(rollouts=0)
        for cost in costs:
            if cost is not None:
                out += cost
        return out

    def to_dict(self, *, counts: bool = True) -> dict[str, Any]:
        """JSON-ready, with `usd`; without `rollouts` and `untraced` for one rollout's."""
        out = asdict(self) | {"usd": self.usd}
        if not counts:
            del out["rollouts"], out["untraced"]
        return out

    def metrics(self, ok: int, prefix: str = "rollout/cost/") -> dict[str, float]:
        """A sum's figures for a trainer's logger: totals, per rollout, and per `ok` rollout
        (what one training sample cost, failures included). Unknown tokens are left out."""
        out = {k: float(v) for k, v in self.to_dict().items() if v is not None}
        if self.rollouts:
            out["usd_per_rollout"] = self.usd / self.rollouts
            out["sandbox_seconds_mean"] = self.sandbox_seconds / self.rollouts
        if ok:
            out["usd_per_ok"] = self.usd / ok
        return {f"{prefix}{k}": v for k, v in out.items()}


def rollout_cost(
    prices: CostConfig,
    started_at: float | None,
    ended_at: float,
    trace: Mapping[str, Any] | None,
) -> RolloutCost:
    """One rollout's cost: its session from `started_at` (None: never started) to `ended_at`
    (unix seconds), billed per second with AgentCore's 1 s minimum; its tokens from `trace`."""
    seconds = max(0.0, ended_at - started_at) if started_at is not None else 0.0
    billed = max(1.0, seconds) if started_at is not None else 0.0
    sandbox_usd = billed * prices.sandbox_usd_per_second
    tokens = _tokens(trace)
    if tokens is None:
        return RolloutCost(seconds, sandbox_usd=sandbox_usd, untraced=1)
    prompt, completion, reused = tokens
    reused_price = (
        prices.prompt_usd_per_mtok
        if prices.reused_usd_per_mtok is None
        else prices.reused_usd_per_mtok
    )
    token_usd = (
        (prompt - reused) * prices.prompt_usd_per_mtok
        + reused * reused_price
        + completion * prices.completion_usd_per_mtok
    ) / _MILLION
    return RolloutCost(seconds, prompt, completion, reused, sandbox_usd, token_usd)


def idle_usd(seconds: float, prices: CostConfig) -> float:
    """What sessions idling `seconds` (warm ones waiting for their rollouts) cost: the memory
    they hold; AgentCore bills vCPUs only while used."""
    return seconds * prices.session_gb * prices.gb_hour_usd / 3600


def _tokens(trace: Mapping[str, Any] | None) -> tuple[int, int, int] | None:
    """(prompt, completion, reused prompt) tokens of a gateway trace; a trace of a gateway
    that predates `usage.reused_prompt_tokens` has them summed from its turns."""
    if trace is None or not isinstance(usage := trace.get("usage"), Mapping):
        return None
    reused = usage.get("reused_prompt_tokens")
    if reused is None:
        reused = sum(t.get("reused_prompt_tokens") or 0 for t in trace.get("turns") or ())
    return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0), reused


def _plus(a: float | None, b: float | None) -> Any:
    return b if a is None else a if b is None else a + b
