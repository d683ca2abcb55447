"""What the engine needs of a sandbox platform: start a rollout in a new session, stop a
session, and say how fast and how many. docs/runtimes.md shows how to add one."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._redact import redact


class SessionCallError(Exception):
    """A sandbox call failed. The flags drive the dispatcher's reaction:

    - `retryable`: try again after a back-off (throttling, quota, conflicts, 5xx, transport);
    - `throttled`: also slow the start rate down;
    - `outage`: the runtime itself looks down (unreachable, or a 5xx): enough of these in a
      row, for longer than the retry budget, and requests fail at once instead of queueing;
    - `maybe_started`: the session may exist (the call was sent and got no clear refusal),
      so it must be stopped; a connection refused or a 4xx refusal started nothing.
    """

    def __init__(
        self,
        code: str,
        message: str,
        *,
        retryable: bool,
        throttled: bool = False,
        outage: bool = False,
        maybe_started: bool = True,
    ):
        super().__init__(redact(f"{code}: {message}"))  # it reaches logs and outcomes
        self.code = code
        self.retryable = retryable
        self.throttled = throttled
        self.outage = outage
        self.maybe_started = maybe_started


@dataclass(frozen=True)
class RuntimeLimits:
    """What a runtime's sessions are held to. Runtimes that report the same `pool` share one
    budget (AgentCore: an account in a region), so a second runtime there adds no rate."""

    start_rate: float
    """New sessions per second."""
    call_rate: float
    """Calls per second to sessions that exist: invocations and stops."""
    max_live_sessions: int
    """Sessions alive at once, in the whole pool."""
    pool: str
    """Who shares these limits; the start-up line and `EngineStats` name them by it."""
    source: str = ""
    """Where the figures come from, said in the start-up line."""


class SandboxRuntime:
    """One place sessions start. Subclass it and implement `limits`, `invoke` and `stop`; a
    call that fails raises `SessionCallError`, whose flags say what the dispatcher does next.

    `RolloutEngine(config, runtimes=[MyRuntime()])` then runs on it unchanged, and the
    conformance suite (`tests/runtimes/conformance.py`) says whether it behaves as one.
    """

    name: str = "runtime"
    """Unique among the engine's runtimes: stats and the run journal name sessions' places by it."""
    environment: str | None = None
    """The environment its image is (a Harbor task's): once any runtime names one, a request
    starts only on runtimes of its payload's `environment`."""
    max_live_sessions: int | None = None
    """This runtime's own bound, within its pool's; None: only the pool's."""

    async def limits(self) -> RuntimeLimits:
        """Read once at the engine's start-up."""
        raise NotImplementedError(f"{type(self).__name__}.limits")

    async def invoke(self, session_id: str, payload: bytes) -> Mapping[str, Any] | None:
        """Send `payload` to session `session_id`, creating the session on its first call;
        return once the agent accepted it (its result comes back through S3 and SQS), with
        the agent's reply where the runtime reads it (`"warm"`: the session was warmed up)."""
        raise NotImplementedError(f"{type(self).__name__}.invoke")

    async def stop(self, session_id: str) -> None:
        """End the session and release what it holds. An unknown session is not an error."""
        raise NotImplementedError(f"{type(self).__name__}.stop")
