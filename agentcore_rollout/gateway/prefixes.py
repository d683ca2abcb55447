"""SharedPrefixes: the renders one session's prompts may reuse from another's (a batch's shared
system prompt and tools, rendered once instead of once per session).

Exactness is `render.AnchoredRenderer`'s; which session rendered a prefix does not enter
(docs/gateway.md#a-shared-prefix-rendered-once). Renders run in a thread pool, so access holds a
lock; states are immutable, so a snapshot of the list is safe to read unlocked."""

from __future__ import annotations

import threading
from typing import Generic, Protocol, TypeVar


class _Encoded(Protocol):
    @property
    def ids(self) -> list[int]: ...


State = TypeVar("State", bound=_Encoded)  # `render.RenderState`; typed apart, so no import cycle

MAX_ENTRIES = 32
MAX_TOKENS = 500_000  # about 10 Claude Code first turns; at most some tens of MB with their text


class SharedPrefixes(Generic[State]):
    """A bounded, thread-safe LRU of full renders' states, newest first."""

    def __init__(self, max_entries: int = MAX_ENTRIES, max_tokens: int = MAX_TOKENS) -> None:
        if max_entries < 1 or max_tokens < 1:
            raise ValueError("max_entries and max_tokens must be positive")
        self.max_entries = max_entries
        self.max_tokens = max_tokens
        self._states: list[State] = []
        self._tokens = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._states)

    @property
    def tokens(self) -> int:
        """The ids held, over all entries (what the token bound limits)."""
        return self._tokens

    def states(self) -> list[State]:
        """A snapshot, most recently used first."""
        with self._lock:
            return list(self._states)

    def add(self, state: State) -> None:
        """Keep `state` as the most recently used; evict the least recently used past the
        bounds. A state bigger than the token bound is not kept."""
        if len(state.ids) > self.max_tokens:
            return
        with self._lock:
            self._states.insert(0, state)
            self._tokens += len(state.ids)
            while len(self._states) > self.max_entries or self._tokens > self.max_tokens:
                self._tokens -= len(self._states.pop().ids)

    def used(self, state: State) -> None:
        """Mark `state` most recently used (if it is still held)."""
        with self._lock:
            for i, held in enumerate(self._states):
                if held is state:
                    self._states.insert(0, self._states.pop(i))
                    return
