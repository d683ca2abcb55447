"""Character-level tokenizer with ChatML special tokens: a vocabulary of 100 ids that still
exercises what real tokenizers make hard (special tokens as single ids, a template to reproduce
exactly, ids that do not round-trip through lossy text). Any character but printable ASCII and
"\\n" encodes to "?", on purpose: the server never rejects a prompt for its alphabet."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

from ...gateway.render import Message, Messages, normalize_messages

PAD, ENDOFTEXT, IM_START, IM_END = "<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, ENDOFTEXT, IM_START, IM_END)
PAD_ID, ENDOFTEXT_ID, IM_START_ID, IM_END_ID = range(4)
_CHARS = "\n" + "".join(chr(c) for c in range(32, 127))
_FIRST_CHAR_ID = len(SPECIAL_TOKENS)
VOCAB_SIZE = _FIRST_CHAR_ID + len(_CHARS)
_SPECIAL_RE = re.compile("(" + "|".join(re.escape(s) for s in SPECIAL_TOKENS) + ")")


def char_id(char: str) -> int:
    """The id of a single character that is in the vocabulary (e.g. `char_id("7")`)."""
    return _FIRST_CHAR_ID + _CHARS.index(char)


class CharTokenizer:
    """Encode/decode text and render chats; stateless, so one shared instance is enough.

    The surface mirrors the few Hugging Face tokenizer calls a gateway needs (`encode`, `decode`,
    `apply_chat_template`, `eos_token_id`) so code written against this one ports to a real model.
    """

    vocab_size = VOCAB_SIZE
    eos_token_id = IM_END_ID
    special_ids = frozenset(range(_FIRST_CHAR_ID))
    _char_to_id = {c: _FIRST_CHAR_ID + i for i, c in enumerate(_CHARS)}
    _unknown_id = _FIRST_CHAR_ID + _CHARS.index("?")

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special-token strings become their single id."""
        ids: list[int] = []
        for part in _SPECIAL_RE.split(text):
            if part in SPECIAL_TOKENS:
                ids.append(SPECIAL_TOKENS.index(part))
            else:
                ids.extend(self._char_to_id.get(c, self._unknown_id) for c in part)
        return ids

    def token_text(self, token_id: int) -> str:
        """The text of one token (special tokens as their literal string)."""
        self.check_ids([token_id])
        if token_id < _FIRST_CHAR_ID:
            return SPECIAL_TOKENS[token_id]
        return _CHARS[token_id - _FIRST_CHAR_ID]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of `ids`; with `skip_special_tokens` the four special tokens render as ""."""
        return "".join(
            "" if skip_special_tokens and i in self.special_ids else self.token_text(i) for i in ids
        )

    def check_ids(self, ids: Iterable[Any], what: str = "token id") -> None:
        """Raise ValueError naming the first element that is not an id of this vocabulary."""
        for i in ids:
            if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < self.vocab_size:
                raise ValueError(
                    f"{what} {i!r:.40} is not in the vocabulary [0, {self.vocab_size})"
                )

    def render_chat(self, messages: Messages, add_generation_prompt: bool = True) -> str:
        """The ChatML text of `messages`: `<|im_start|>{role}\\n{content}<|im_end|>\\n` each.

        Content may be a string, None, or a list of OpenAI content parts (their "text" fields are
        concatenated; other part types are dropped). An assistant message's `tool_calls` are
        appended to its content as plain text, one `<tool_call>{"name": ..., "arguments": ...}
        </tool_call>` line per call (Qwen's convention), and a `tool` message is rendered like any
        other role: the toy policy cannot call tools, but the prompt stays faithful and exact.
        Malformed messages raise ValueError (`gateway.render.normalize_messages`).
        """
        return chatml(normalize_messages(messages), add_generation_prompt)

    def apply_chat_template(
        self, messages: Messages, add_generation_prompt: bool = True
    ) -> list[int]:
        """Token ids of `render_chat(messages, add_generation_prompt)`."""
        return self.encode(self.render_chat(messages, add_generation_prompt))


def chatml(messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
    """`CharTokenizer.render_chat` of messages `normalize_messages` has already checked."""
    parts = [_render_message(m) for m in messages]
    if add_generation_prompt:
        parts.append(f"{IM_START}assistant\n")
    return "".join(parts)


def _render_message(message: Message) -> str:
    content = message.get("content") or ""
    for call in message.get("tool_calls") or []:
        function = call["function"]
        payload = {"name": function.get("name"), "arguments": function.get("arguments")}
        content += f"\n<tool_call>{json.dumps(payload)}</tool_call>"
    return f"{IM_START}{message['role']}\n{content}{IM_END}\n"
