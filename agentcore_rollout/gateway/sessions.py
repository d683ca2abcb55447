"""Sessions: one per rollout request, each with its own random API key, limits and trajectory.

The key is the only thing tying an agent's LLM calls, from a remote sandbox, to one rollout, so
it is random (256 bits), shown once, and stored as a SHA-256 digest only: no log line, trace or
heap dump holds a usable key. Placeholder keys ("", "EMPTY") are refused outright because OpenAI
clients send them by default."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from .._engine.tracing import checked_traceparent
from .render import Rendered, RenderState
from .sampling import check_sampling
from .trajectory import RENDER_KINDS, Trajectory, Turn

log = logging.getLogger(__name__)

TRACE_VERSION = 1
KEY_PREFIX = "sk-gw-"
PLACEHOLDER_KEYS = frozenset({"", "EMPTY", "empty", "None", "null", "sk-no-key-required"})
# Render states kept per session: one per conversation an agent interleaves (sub-agents).
MAX_RENDER_STATES = 4


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass
class Session:
    """Live state of one rollout's session (never holds its own API key)."""

    id: str
    request_id: str
    sampling: dict[str, Any]
    max_context: int | None
    max_turns: int | None
    created: float = field(default_factory=time.time)
    last_active: float = field(default_factory=time.monotonic)
    trajectory: Trajectory = field(default_factory=Trajectory)
    turns_started: int = 0
    in_flight: int = 0  # turns being answered
    requests: int = 0  # HTTP requests in flight, turns and count_tokens (`_limits.in_flight`)
    rejected_turns: int = 0
    closed: bool = False
    traceparent: str | None = None  # the rollout's span: its turns' parent (OpenTelemetry)
    render_states: list[RenderState] = field(default_factory=list, repr=False)  # newest first
    # Held while the session's CPU work runs in the pool: one request of a session at a time.
    cpu: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)
    # Responses API `store`: response id -> its conversation as chat messages, oldest first
    responses: dict[str, list[dict[str, Any]]] = field(default_factory=dict, repr=False)
    _digest: str = field(default="", repr=False)

    def begin_turn(self) -> int | None:
        """Reserve the next turn number; None past max_turns (the turn ends at once as
        `length`). Reserved at request time so concurrent calls of one agent cannot exceed the
        limit together."""
        self.last_active = time.monotonic()
        if self.max_turns is not None and self.turns_started >= self.max_turns:
            self.rejected_turns += 1
            return None
        self.turns_started += 1
        self.in_flight += 1
        return self.turns_started - 1

    def remember_render(self, rendered: Rendered) -> None:
        """Keep a render's state for the next turns, newest first, in place of the state it
        reused (that conversation moved on); past MAX_RENDER_STATES the oldest goes."""
        if rendered.state is None:
            return
        others = [s for s in self.render_states if s is not rendered.base]
        self.render_states = [rendered.state, *others[: MAX_RENDER_STATES - 1]]

    def end_turn(self, turn: Turn | None) -> None:
        """Release an in-flight turn; record it unless the session closed meanwhile."""
        self.in_flight -= 1
        self.last_active = time.monotonic()
        if turn is not None and not self.closed:
            self.trajectory.add(turn)

    def usage(self) -> dict[str, int]:
        """Tokens over the recorded turns: a trace's, and what a dropped session spent."""
        turns = self.trajectory.turns
        return {
            "prompt_tokens": sum(t.prompt_tokens or 0 for t in turns),
            "completion_tokens": sum(t.completion_tokens or 0 for t in turns),
            "reused_prompt_tokens": sum(t.reused_prompt_tokens for t in turns),
        }

    def trace(
        self, *, token_capture: bool, backend: str, model: str, renderer: str | None
    ) -> dict[str, Any]:
        """The JSON-serializable trace (see `GatewayAdmin.finish_session`)."""
        data = self.trajectory.to_json()
        turns = self.trajectory.turns
        return {
            "v": TRACE_VERSION,
            "session_id": self.id,
            "request_id": self.request_id,
            "token_capture": token_capture,
            "backend": backend,
            "model": model,
            "renderer": renderer,  # what the ids are tokens of: `hf:<tokenizer>`, or `char`
            "created": self.created,
            "finished": time.time(),
            "num_turns": len(turns),
            "num_samples": len(data["samples"]),
            "usage": self.usage(),
            "limits": {
                "max_turns": self.max_turns,
                "max_context": self.max_context,
                "rejected_turns": self.rejected_turns,
                "context_limited_turns": sum(t.context_limited for t in turns),
            },
            "in_flight_at_finish": self.in_flight,
            "undelivered_turns": sum(not t.delivered for t in turns),
            "truncated": any(t.truncated for t in turns),
            "ill_formed": any(t.ill_formed for t in turns),
            "render": {k: sum(t.render == k for t in turns) for k in RENDER_KINDS},
            **data,
        }


class SessionStore:
    """All live sessions of one gateway, by id and by key digest."""

    def __init__(self, ttl: float | None = None) -> None:
        self.ttl = ttl
        self._by_id: dict[str, Session] = {}
        self._by_digest: dict[str, Session] = {}
        self._by_request: dict[str, Session] = {}  # the newest session opened for a request id

    def __len__(self) -> int:
        return len(self._by_id)

    def create(
        self,
        request_id: str,
        *,
        sampling: dict[str, Any] | None = None,
        max_context: int | None = None,
        max_turns: int | None = None,
        traceparent: str | None = None,
    ) -> tuple[Session, str]:
        """A new session and its API key (the only time the key exists in clear)."""
        if not isinstance(request_id, str) or not 0 < len(request_id) <= 256:
            raise ValueError("request_id must be a non-empty string of at most 256 characters")
        for name, value in (("max_context", max_context), ("max_turns", max_turns)):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ValueError(f"{name} must be a positive integer or null")
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        session = Session(
            id=f"gws-{uuid.uuid4().hex}",
            request_id=request_id,
            sampling=check_sampling(sampling, "sampling"),
            max_context=max_context,
            max_turns=max_turns,
            traceparent=checked_traceparent(traceparent),
            _digest=_digest(key),
        )
        self._by_id[session.id] = session
        self._by_digest[session._digest] = session
        self._by_request[request_id] = session
        log.info("session created", extra={"session_id": session.id, "request_id": request_id})
        return session, key

    def by_key(self, key: str | None) -> Session | None:
        """The live session a key belongs to; None for placeholders and unknown keys."""
        if key is None or key.strip() in PLACEHOLDER_KEYS:
            return None
        session = self._by_digest.get(_digest(key))
        if session is None or session.closed:
            return None
        if self._expired(session, time.monotonic()):
            self.remove(session.id, reason="expired")
            return None
        return session

    def by_request(self, request_id: str) -> Session | None:
        """The live session opened for `request_id`, if any: how an engine that restarted finds
        the trace of a request an earlier engine started."""
        session = self._by_request.get(request_id)
        if session is None or self._expired(session, time.monotonic()):
            return None
        return session

    def remove(self, session_id: str, *, reason: str) -> Session | None:
        """Close and forget a session (its key stops working at once)."""
        session = self._by_id.pop(session_id, None)
        if session is None:
            return None
        session.closed = True
        self._by_digest.pop(session._digest, None)
        if self._by_request.get(session.request_id) is session:
            del self._by_request[session.request_id]
        extra = {"session_id": session.id, "request_id": session.request_id}
        log.info("session %s after %d turns", reason, session.turns_started, extra=extra)
        return session

    def expire(self) -> list[str]:
        """Drop sessions idle for longer than the TTL; returns their ids."""
        now = time.monotonic()
        gone = [s.id for s in self._by_id.values() if self._expired(s, now)]
        for session_id in gone:
            self.remove(session_id, reason="expired")
        return gone

    def _expired(self, session: Session, now: float) -> bool:
        return (
            self.ttl is not None and session.in_flight == 0 and now - session.last_active > self.ttl
        )

    def close_all(self) -> None:
        for session_id in list(self._by_id):
            self.remove(session_id, reason="closed at shutdown")
