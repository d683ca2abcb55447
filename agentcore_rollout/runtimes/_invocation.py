"""An invocation as the agent's server sees it, for runtimes that call the agent themselves (not
through AgentCore, which adds these itself): the path, the session header, the reply that
means the rollout started (or the session warmed up)."""

from __future__ import annotations

import json
from typing import Any

from .agentcore.published import SESSION_HEADER
from .base import SessionCallError

PATH = "/invocations"
PING_PATH = "/ping"


def healthy(ping: object) -> bool:
    """`GET /ping`'s reply is that of an agent taking invocations."""
    return isinstance(ping, dict) and ping.get("status") in ("Healthy", "HealthyBusy")


def headers(session_id: str) -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "Accept": "application/json",
        SESSION_HEADER: session_id,
    }


def accepted(status: int, body: bytes) -> dict[str, Any]:
    """The agent's reply: a RolloutApp answers 200 `{"status": "accepted", ...}`; anything
    else means it started no rollout. The session exists all the same (its agent answered),
    so it must be stopped."""
    try:
        reply = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        reply = None
    if status != 200 or not isinstance(reply, dict) or reply.get("status") != "accepted":
        shown = body[:200].decode(errors="replace")
        raise SessionCallError(
            "NotAccepted", f"agent did not accept (HTTP {status}): {shown}", retryable=False
        )
    return reply
