"""The two calls the dispatcher needs from a sandbox platform: start an invocation in a new
session, and stop a session.

AgentCore Runtime implements them with its data-plane API (`_agentcore`). Another platform (Modal,
OpenYuanrong, a Kubernetes job runner) implements the same `SandboxRuntime` protocol and
classifies its failures into `SessionCallError`s, and the dispatcher works unchanged:
`RolloutEngine(config, runtime=MyRuntime())`.
"""

from __future__ import annotations

from typing import Protocol

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


class SandboxRuntime(Protocol):
    async def invoke(self, session_id: str, payload: bytes) -> None:
        """Start the rollout in session `session_id`; return once the agent accepted it."""

    async def stop(self, session_id: str) -> None:
        """End the session and release what it holds. Unknown sessions are not an error."""
