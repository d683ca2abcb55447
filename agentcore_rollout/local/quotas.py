"""The emulator's quotas, counted as AgentCore counts them.

Three separate limits, each with its own error, so a client that only handles one of them
fails here as it would on AWS:
- InvokeAgentRuntime calls per second per agent endpoint, every call counted, whether it
  opens a session or reuses one (429 ThrottlingException);
- new sessions per minute per endpoint (429 ThrottlingException);
- active sessions per account (402 ServiceQuotaExceededException).
Each endpoint (runtime ARN + qualifier) has its own invocation and new-session windows, and
the runtimes of one account (the ARN's account and region) share its active sessions, so one
emulator serving several runtimes and endpoints counts as the service would. The emulator's
defaults are the published quotas (`_agentcore`); each can be changed or switched off (None)
for tests.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

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
    """The limits of one emulator: per endpoint (`invoke_tps`, `new_sessions_per_minute`) and
    per account (`max_sessions`). Endpoints are `(runtime ARN, qualifier)` pairs."""

    invoke_tps: float | None
    new_sessions_per_minute: float | None
    max_sessions: int
    throttle_every: int = 0
    _tps: dict[tuple[str, str], WindowLimit] = field(default_factory=dict, init=False)
    _new: dict[tuple[str, str], WindowLimit] = field(default_factory=dict, init=False)
    active: Counter[str] = field(default_factory=Counter, init=False)
    """Sessions open, by account (`account id:region`)."""

    def __post_init__(self) -> None:
        self._invokes = 0

    def admit_invoke(self, endpoint: tuple[str, str]) -> None:
        """Every InvokeAgentRuntime call, before it reaches a session."""
        self._invokes += 1
        if self.throttle_every and self._invokes % self.throttle_every == 0:
            raise ApiError("ThrottlingException", "Rate exceeded (injected)")
        if self.invoke_tps and not _window(self._tps, endpoint, self.invoke_tps, 1.0).try_take():
            raise ApiError("ThrottlingException", "Rate exceeded")

    def admit_session(self, endpoint: tuple[str, str]) -> None:
        """A call that would open a new session on `endpoint`; counted open if admitted
        (`closed` when it ends)."""
        account = account_of(endpoint[0])
        if self.active[account] >= self.max_sessions:
            raise ApiError(
                "ServiceQuotaExceededException",
                f"active sessions quota ({self.max_sessions}) reached",
            )
        per_minute = self.new_sessions_per_minute
        if per_minute and not _window(self._new, endpoint, per_minute, 60.0).try_take():
            raise ApiError("ThrottlingException", "Rate exceeded for new sessions")
        self.active[account] += 1

    def closed(self, endpoint: tuple[str, str]) -> None:
        self.active[account_of(endpoint[0])] -= 1


def account_of(arn: str) -> str:
    """`account id:region`: whose active-session quota a runtime's sessions count against."""
    parts = arn.split(":")
    return f"{parts[4]}:{parts[3]}"


def _window(
    windows: dict[tuple[str, str], WindowLimit], key: tuple[str, str], limit: float, period: float
) -> WindowLimit:
    if key not in windows:
        windows[key] = WindowLimit(limit, period)
    return windows[key]
