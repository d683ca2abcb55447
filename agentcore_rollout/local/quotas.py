"""The emulator's quotas, counted as AgentCore counts them.

Three separate limits, each with its own error, so a client that only handles one of them
fails here as it would on AWS:
- InvokeAgentRuntime calls per second per agent endpoint, every call counted, whether it
  opens a session or reuses one (429 ThrottlingException);
- new sessions per minute per endpoint (429 ThrottlingException);
- active sessions per account (402 ServiceQuotaExceededException).
The emulator's defaults are the published quotas (`_agentcore`); each can be changed or
switched off (None) for tests.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from .wire import ApiError


class WindowLimit:
    """At most `limit` events in any `period` seconds (a sliding window: "N per minute" read
    literally, with no burst beyond N)."""

    def __init__(
        self, limit: float, period: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if limit <= 0 or period <= 0:
            raise ValueError("WindowLimit needs limit > 0 and period > 0")
        # A fractional limit below one is one event per longer period (0.5/s: one per 2 s).
        self.limit = int(limit) if limit >= 1 else 1
        self.period = period if limit >= 1 else period / limit
        self._clock = clock
        self._times: deque[float] = deque()

    def try_take(self) -> bool:
        now = self._clock()
        while self._times and now - self._times[0] >= self.period:
            self._times.popleft()
        if len(self._times) >= self.limit:
            return False
        self._times.append(now)
        return True


@dataclass
class Quotas:
    """The limits of one emulator (one endpoint of one runtime, one account)."""

    invoke_tps: float | None
    new_sessions_per_minute: float | None
    max_sessions: int
    throttle_every: int = 0

    def __post_init__(self) -> None:
        self._invokes = 0
        per_minute = self.new_sessions_per_minute
        self._tps = WindowLimit(self.invoke_tps, 1.0) if self.invoke_tps else None
        self._new = WindowLimit(per_minute, 60.0) if per_minute else None

    def admit_invoke(self) -> None:
        """Every InvokeAgentRuntime call, before it reaches a session."""
        self._invokes += 1
        if self.throttle_every and self._invokes % self.throttle_every == 0:
            raise ApiError("ThrottlingException", "Rate exceeded (injected)")
        if self._tps is not None and not self._tps.try_take():
            raise ApiError("ThrottlingException", "Rate exceeded")

    def admit_session(self, active: int) -> None:
        """A call that would open a new session, `active` sessions being open."""
        if active >= self.max_sessions:
            raise ApiError(
                "ServiceQuotaExceededException",
                f"active sessions quota ({self.max_sessions}) reached",
            )
        if self._new is not None and not self._new.try_take():
            raise ApiError("ThrottlingException", "Rate exceeded for new sessions")
