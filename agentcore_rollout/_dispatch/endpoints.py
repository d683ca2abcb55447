"""The places sessions start (`RuntimeEndpoint`) and what the dispatcher keeps of each.

Runtimes that report one pool share its budgets (`Pool`: AgentCore's quotas are an account's
in a region): a start rate cut on throttling, a call rate every invoke and stop takes from,
and a live bound; a second endpoint in a pool adds no rate. Each endpoint (`EndpointState`)
has its own outage state, optional live bound, and at most `ceil(start_rate *
session_start_time)` starts in flight (Little's law), so a cold-start wave cannot pile up
connections on it.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from .._flow import AdaptiveRate, Gauge, TokenBucket
from .._redact import get_logger
from ..config import DispatchConfig
from ..runtimes.base import RuntimeLimits, SandboxRuntime, SessionCallError

log = get_logger("agentcore_rollout.dispatcher")

EARLY = 0.002  # seconds: a token due this soon counts as there (timers fire a hair early)


class SubmitFailed(Exception):
    """The rollout could not be started: non-retryable error, retries spent, every endpoint
    down, or it waited too long to start. The message says which, with the last cause."""


@dataclass(frozen=True)
class RuntimeEndpoint:
    """One place sessions start: a runtime, its own live bound, its pool."""

    name: str
    """Where a session started, as journaled (AgentCore: `RuntimeTarget.name`)."""
    runtime: SandboxRuntime
    max_live_sessions: int | None = None
    """None: only its pool's bound."""
    pool: str = ""
    """Who it shares start rate, call rate and live bound with (`RuntimeLimits.pool`)."""
    environment: str | None = None
    """The environment its image is (`RuntimeTarget.environment`): a request naming one starts
    only where it is."""


class Outage:
    """Tracks whether one endpoint is down: outage errors with no answer in between, for longer
    than the retry budget."""

    def __init__(
        self, name: str, budget: float, probe_every: float, on_change: Callable[[], None]
    ) -> None:
        self._name = name
        self._budget = budget
        self._probe_every = probe_every
        self._on_change = on_change
        self._since: float | None = None
        self._next_probe = 0.0
        self.cause: SessionCallError | None = None
        self.declared = asyncio.Event()

    def failed(self, error: SessionCallError) -> None:
        now = time.monotonic()
        self._since = now if self._since is None else self._since
        self.cause = error
        if now - self._since >= self._budget and not self.declared.is_set():
            log.error("%s down for %.1fs: %s", self._name, self.down_for(), error)
            self.declared.set()
            self._next_probe = now + self._probe_every
            self._on_change()

    def answered(self) -> None:
        self._since, self.cause = None, None
        if self.declared.is_set():
            log.warning("%s answers again", self._name)
            self.declared.clear()
            self._on_change()

    def down_for(self) -> float:
        return time.monotonic() - self._since if self._since is not None else 0.0

    def in_doubt(self) -> bool:
        """Outage errors seen, with no answer since, but not yet for the whole budget."""
        return self._since is not None and not self.declared.is_set()

    def due(self) -> bool:
        """Up, or down and due for one probe (taking nothing)."""
        return not self.declared.is_set() or time.monotonic() >= self._next_probe

    def may_try(self) -> bool:
        """Up, or down and due for one probe, which this takes."""
        if not self.due():
            return False
        if self.declared.is_set():
            self._next_probe = time.monotonic() + self._probe_every
        return True

    def refusal(self) -> SubmitFailed:
        return SubmitFailed(f"{self._name} down for {self.down_for():.1f}s: {self.cause}")


class Pool:
    """One pool's budgets, shared by its endpoints: new sessions (adapted down on
    throttling), data-plane calls (invokes and stops), live sessions."""

    def __init__(self, limits: RuntimeLimits) -> None:
        self.limits = limits
        self.bound = limits.max_live_sessions
        self.starts = AdaptiveRate(_bucket(limits.start_rate))
        self.calls = _bucket(limits.call_rate)
        self.live = Gauge()

    def ready_in(self) -> float:
        """Seconds until a start may take both its tokens."""
        return max(self.starts.bucket.ready_in(), self.calls.ready_in())


class EndpointState:
    """One endpoint's state: starts in flight, live sessions and outage; its pool's budgets."""

    def __init__(
        self,
        spec: RuntimeEndpoint,
        pool: Pool,
        cfg: DispatchConfig,
        on_change: Callable[[], None],
    ) -> None:
        self.name = spec.name
        self.runtime = spec.runtime
        self.environment = spec.environment
        self.pool = pool
        rate = pool.limits.start_rate
        self.max_starting = max(1, math.ceil(rate * cfg.session_start_time))
        self.max_live = min(spec.max_live_sessions or pool.bound, pool.bound)
        self.starting = Gauge()
        self.live = Gauge()
        self.started = 0
        self.outage = Outage(spec.name, retry_budget(cfg), cfg.backoff_max, on_change)
        self.probe: asyncio.Task[None] | None = None

    def can_start(self, holding: bool) -> bool:
        """A start slot and the pool's tokens are free, and a live slot here and in the
        pool (unless the session holds one here already)."""
        if self.starting.value >= self.max_starting or self.pool.ready_in() > EARLY:
            return False
        return holding or (
            self.live.value < self.max_live and self.pool.live.value < self.pool.bound
        )

    def load(self) -> float:
        return self.live.value / self.max_live

    def take_live(self) -> None:
        self.live.add()
        self.pool.live.add()

    def release_live(self) -> None:
        self.live.remove()
        self.pool.live.remove()


def retry_budget(config: DispatchConfig) -> float:
    """The longest back-off one request can spend retrying: the sum of the capped delays."""
    return sum(
        min(config.backoff_max, config.backoff_base * 2**k) for k in range(config.max_retries)
    )


def _bucket(rate: float) -> TokenBucket:
    """A tenth of a second of burst lets the bucket make up for a late wake-up of the event
    loop (otherwise a busy loop loses rate it never gets back) without bunching starts."""
    return TokenBucket(rate, burst=max(1.0, rate / 10))
