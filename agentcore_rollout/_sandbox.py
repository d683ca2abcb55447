"""The two calls the dispatcher needs from a sandbox platform: start an invocation in a new
session, and stop a session.

AgentCore Runtime implements them with aiobotocore (`_agentcore`). Another platform (Modal,
OpenYuanrong, a Kubernetes job runner) implements the same `SandboxRuntime` protocol and
classifies its failures into `SessionCallError`s, and the dispatcher works unchanged:
`RolloutEngine(config, runtime=MyRuntime())`.
"""

from __future__ import annotations

from typing import Protocol


class SessionCallError(Exception):
    """A sandbox call failed. `retryable` and `throttled` drive the dispatcher's reaction."""

    def __init__(self, code: str, message: str, *, retryable: bool, throttled: bool = False):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.retryable = retryable
        self.throttled = throttled


class SandboxRuntime(Protocol):
    async def invoke(self, session_id: str, payload: bytes) -> None:
        """Start the rollout in session `session_id`; return once the agent accepted it."""

    async def stop(self, session_id: str) -> None:
        """End the session and release what it holds. Unknown sessions are not an error."""
