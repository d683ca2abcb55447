"""EngineStats: a typed snapshot of what the engine holds now and has done so far.

Counters count from the engine's start; `since(earlier)` turns two snapshots into what
happened in between, which is how a `RolloutBatch` reports its own share. Gauges (sessions
alive, starts in flight, peaks, bounds and rates, requests tracked) are not differences:
`since` keeps the later value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

_GAUGES = frozenset(
    {
        "step",
        "live_sessions",
        "starts_in_flight",
        "peak_live_sessions",
        "peak_starts_in_flight",
        "max_live_sessions",
        "start_rate",
        "pool_limits",
        "runtime_down",
        "endpoints_down",
        "tracked_requests",
        "warm_parked",
    }
)


def _nonzero(counts: Mapping[str, float] | None = None) -> dict[str, float]:
    return {k: v for k, v in sorted((counts or {}).items()) if v}


@dataclass(frozen=True)
class EngineStats:
    """What `RolloutEngine.stats()` returns. Mappings are keyed by error kind or reason."""

    step: int = 0
    # dispatcher: sessions and the calls that start and stop them
    live_sessions: int = 0
    starts_in_flight: int = 0
    peak_live_sessions: int = 0
    peak_starts_in_flight: int = 0
    max_live_sessions: int = 0
    """Sessions the engine may hold alive at once: its accounts' live bounds together."""
    start_rate: float = 0.0
    """The adaptive start rate now (sessions/s, all accounts); below the accounts' start rates
    after throttling."""
    pool_limits: dict[str, float] = field(default_factory=dict)
    """What each pool of runtimes is held to, by `<pool>/<name>` (AgentCore's pools:
    `<account id>:<region>`): `start_rate`, `call_rate`, `max_live_sessions` (`engine.dispatch`'s
    values, else what its runtimes report; the start-up log line says where each came from)."""
    rate_cuts: int = 0
    runtime_down: bool = False
    """Every endpoint failed with outage errors for longer than the retry budget: starts fail
    at once (one probe per `backoff_max` seconds each) until one answers again."""
    endpoints_down: int = 0
    """Endpoints declared down: their waiting requests go to the others."""
    starts_by_endpoint: dict[str, int] = field(default_factory=dict)
    """Sessions started, by endpoint (`RuntimeTarget.name`: runtime ARN#qualifier)."""
    invokes: int = 0
    stops: int = 0
    throttles: int = 0
    retries: dict[str, int] = field(default_factory=dict)
    """Invocations retried, by the error kind that caused the retry."""
    invoke_errors: dict[str, int] = field(default_factory=dict)
    stop_errors: dict[str, int] = field(default_factory=dict)
    # warm sessions: started ahead of their requests (`RolloutEngine.warm`)
    warm_started: int = 0
    warm_used: int = 0
    """Rollouts started on a warm session: one call, no new session."""
    warm_missed: int = 0
    """Of those, on a session its runtime created anew (the warm one had ended): cold."""
    warm_stopped: int = 0
    """Warm sessions no request took, stopped (idle past `warm_max_idle`, or at close)."""
    warm_parked: int = 0
    warm_idle_seconds: float = 0.0
    """Seconds warm sessions waited for their rollouts, summed: billed (their memory)."""
    # buffer: notifications and result objects
    messages: int = 0
    downloads: int = 0
    inline_results: int = 0
    """Results delivered from the agent's own message, verified as objects are: no GetObject."""
    rejected_inline: dict[str, int] = field(default_factory=dict)
    """Messages whose carried result failed verification, by reason: set aside unread; the
    object in S3 decides."""
    duplicates: int = 0
    unmatched: int = 0
    """Results of this experiment that no request (waiting or remembered) expects."""
    late_results: int = 0
    """Results that arrived after their request had ended (kept apart, see `take_late`)."""
    foreign_messages: int = 0
    malformed_messages: int = 0
    test_events: int = 0
    unsettled_messages: int = 0
    """Handled messages whose batched delete or release failed: they come back after the
    visibility timeout (and are recognized as duplicates)."""
    s3_lookups: int = 0
    recovered_by_lookup: int = 0
    invalid_results: dict[str, int] = field(default_factory=dict)
    """Result objects refused, by reason (`signature`, `too_large`, `schema`, ...)."""
    handler_errors: int = 0
    tracked_requests: int = 0
    """Requests the buffer remembers: waiting, or ended within the retained steps."""
    api_calls: dict[str, int] = field(default_factory=dict)
    """AWS API calls (HTTP attempts) by `service:Operation`."""

    def __post_init__(self) -> None:  # own copies, without zeros, in a stable order
        for f in fields(self):
            if isinstance(value := getattr(self, f.name), Mapping):
                object.__setattr__(self, f.name, _nonzero(value))

    def since(self, earlier: EngineStats) -> EngineStats:
        """Counters minus `earlier`'s; gauges as they are now."""
        changes: dict[str, Any] = {}
        for f in fields(self):
            if f.name in _GAUGES:
                continue
            now, then = getattr(self, f.name), getattr(earlier, f.name)
            if isinstance(now, Mapping):
                changes[f.name] = {k: v - then.get(k, 0) for k, v in now.items()}
            else:
                changes[f.name] = now - then
        return replace(self, **changes)

    def metrics(self, prefix: str = "rollout/engine/") -> dict[str, float]:
        """A flat dict of numbers for a trainer's logger; mappings become `name/key`."""
        out: dict[str, float] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Mapping):
                out |= {f"{prefix}{f.name}/{k}": v for k, v in value.items()}
            else:
                out[f"{prefix}{f.name}"] = value
        return out
