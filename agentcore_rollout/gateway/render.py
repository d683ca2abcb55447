"""Rendering: OpenAI messages + tools -> prompt token ids, and sampled ids -> assistant message.

The gateway owns tokenization so that the trainer gets the exact ids the policy was conditioned on
and the exact ids it sampled: the backend is driven with token ids (SGLang `/generate`), never with
text. A renderer is the one place that knows a model's chat template and its tool-call syntax:

    render(messages, tools) -> prompt ids          (the chat template, generation prompt added)
    parse(output_ids, tools_enabled) -> Parsed      (assistant message; never raises)

`parse` never raises on model output: a tool call the model botched (bad JSON, no name, an
unclosed tag) is returned as plain content with `ill_formed=True`, which the trajectory records,
so a bad sample is a training signal and never an HTTP 500. `TextRenderer` implements `parse` for
the Hermes / Qwen tool-call syntax `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`; a
model with a different syntax gets its own renderer behind the same interface, and
`load_renderer("module:attribute")` is how the gateway's command line picks it up.

`HFRenderer` wraps a Hugging Face fast tokenizer (its Jinja chat template, with tools); it only
loads from local files, never from the hub. The gateway knows no particular model beyond that: the
local toy policy's renderer lives with that policy (`agentcore_rollout.local.policy.render`).
"""

from __future__ import annotations

import importlib
import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

Message = dict[str, Any]
TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class Parsed:
    """An assistant turn as the agent will see it. `message` is an OpenAI assistant message
    (`content`, and `tool_calls` when the model called tools); `error` says why a turn is
    `ill_formed` (one line)."""

    message: Message
    ill_formed: bool = False
    error: str | None = None

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        return self.message.get("tool_calls") or []


@runtime_checkable
class Renderer(Protocol):
    """What the gateway needs from a model's tokenizer and chat template."""

    name: str
    stop_token_ids: tuple[int, ...]  # end-of-turn ids, passed to the backend as stop_token_ids

    def render(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None
    ) -> list[int]:
        """Prompt ids for `messages` (and `tools`), ending with the assistant generation prompt.
        Raises ValueError for malformed messages (the agent's fault: HTTP 400)."""
        ...

    def parse(self, output_ids: Sequence[int], *, tools_enabled: bool) -> Parsed:
        """The assistant message for sampled `output_ids` (a trailing stop token is dropped)."""
        ...

    def token_text(self, token_id: int) -> str:
        """The text of one token (for OpenAI-style `logprobs` in responses)."""
        ...


# -- shared helpers -----------------------------------------------------------------------------


def normalize_messages(messages: Any) -> list[Message]:
    """Validate OpenAI chat messages and flatten list-of-parts content to a string, so every
    template sees the same simple shape. Raises ValueError naming the first bad message."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    out: list[Message] = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise ValueError(f"messages[{i}] must be an object with a string 'role'")
        norm = dict(message)
        content = message.get("content")
        if isinstance(content, list):
            texts = [p.get("text") for p in content if isinstance(p, Mapping)]
            norm["content"] = "".join(t for t in texts if isinstance(t, str))
        elif content is not None and not isinstance(content, str):
            raise ValueError(f"messages[{i}].content must be a string, null or a list of parts")
        calls = message.get("tool_calls")
        if calls is not None and (
            not isinstance(calls, list)
            or not all(
                isinstance(c, Mapping) and isinstance(c.get("function"), Mapping) for c in calls
            )
        ):
            raise ValueError(f"messages[{i}].tool_calls must be a list of {{'function': {{...}}}}")
        out.append(norm)
    return out


def parse_tool_calls(text: str) -> Parsed:
    """Split model text into content and Hermes-style tool calls.

    Inverse of the fixture template: content, then each call, separated by one "\\n". Content is
    the text before the first call minus one trailing "\\n"; whitespace between calls is the
    separator; any other text outside the calls is appended to the content. `arguments` is
    returned as a JSON string (OpenAI's shape); if the model wrote an object it is serialized
    with json.dumps defaults, which is what the template's `tojson` re-renders.
    """
    if TOOL_OPEN not in text:
        return Parsed({"role": "assistant", "content": text})
    calls: list[dict[str, Any]] = []
    pieces: list[str] = []
    last = 0
    for match in TOOL_CALL_RE.finditer(text):
        pieces.append(text[last : match.start()])
        last = match.end()
        call, error = _tool_call(match.group(1))
        if error is not None:
            return _ill_formed(text, error)
        calls.append(call)
    tail = text[last:]
    if TOOL_OPEN in tail or not calls:
        return _ill_formed(text, "unterminated <tool_call> block")
    content = pieces[0].removesuffix("\n")
    extra = [p.strip() for p in [*pieces[1:], tail] if p.strip()]
    content = "\n".join([content, *extra]) if extra else content
    message: Message = {"role": "assistant", "content": content or None, "tool_calls": calls}
    return Parsed(message)


def _tool_call(raw: str) -> tuple[dict[str, Any], str | None]:
    try:
        payload = json.loads(raw)
    except ValueError as exc:
        return {}, f"tool call is not valid JSON: {exc}"
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return {}, "tool call must be an object with a string 'name'"
    arguments = payload.get("arguments", {})
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments)
    function = {"name": payload["name"], "arguments": arguments}
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": function}, None


def _ill_formed(text: str, error: str) -> Parsed:
    return Parsed({"role": "assistant", "content": text}, ill_formed=True, error=error)


class TextRenderer:
    """A renderer's `parse` for models that write Hermes tool calls as text: drop a trailing stop
    token, `decode`, then split tool calls if enabled. Subclasses supply `name`,
    `stop_token_ids`, `render`, `decode` and `token_text`."""

    stop_token_ids: tuple[int, ...] = ()

    def decode(self, ids: Sequence[int]) -> str:
        raise NotImplementedError

    def parse(self, output_ids: Sequence[int], *, tools_enabled: bool) -> Parsed:
        ids = list(output_ids)
        if ids and ids[-1] in self.stop_token_ids:
            ids.pop()
        text = self.decode(ids)
        if tools_enabled:
            return parse_tool_calls(text)
        return Parsed({"role": "assistant", "content": text})


# -- Hugging Face ---------------------------------------------------------------------------------


class HFRenderer(TextRenderer):
    """A Hugging Face fast tokenizer and its chat template (rendered with `tools`).

    The template is rendered to text and then encoded without adding BOS/EOS, which is what
    `apply_chat_template(tokenize=True)` does; decoding skips special tokens, so a template's
    control tokens never reach the agent. `<tool_call>` must decode as text (an added token that
    is not special, as in Qwen2.5) for tool calls to be parsed.
    """

    def __init__(self, tokenizer: Any, *, name: str | None = None) -> None:
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("the tokenizer has no chat_template")
        self.tokenizer = tokenizer
        self.name = name or f"hf:{getattr(tokenizer, 'name_or_path', '') or 'tokenizer'}"
        eos = tokenizer.eos_token_id
        self.stop_token_ids = () if eos is None else (int(eos),)

    @classmethod
    def from_pretrained(cls, path: str | PathLike[str]) -> HFRenderer:
        """Load a tokenizer saved with `save_pretrained` from a local directory (never the hub:
        rollout machines have no business downloading at run time)."""
        from transformers import PreTrainedTokenizerFast  # optional dependency: [gateway]

        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(path), local_files_only=True)
        return cls(tokenizer)

    def render(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None
    ) -> list[int]:
        norm = normalize_messages(messages)
        try:
            text = self.tokenizer.apply_chat_template(
                norm,
                tools=list(tools) if tools else None,
                add_generation_prompt=True,
                tokenize=False,
            )
        except Exception as exc:  # jinja2 errors (raise_exception in templates) are the request's
            raise ValueError(f"chat template failed: {exc}") from None
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])


# -- choosing one ---------------------------------------------------------------------------------


def load_renderer(spec: str) -> Renderer:
    """The renderer `spec` names: a local directory holding a Hugging Face tokenizer with a chat
    template (`HFRenderer`), or `module:attribute`, a Renderer class or zero-argument factory (how
    a model with another template or tool-call syntax plugs in). Raises ValueError, in one line."""
    if Path(spec).is_dir():
        try:
            return HFRenderer.from_pretrained(spec)
        except (ImportError, OSError, ValueError) as exc:
            raise ValueError(f"no tokenizer with a chat template in {spec}: {_line(exc)}") from None
    module, sep, attribute = spec.partition(":")
    if not (sep and module and attribute):
        raise ValueError(f"{spec!r} is neither a tokenizer directory nor module:attribute")
    try:
        factory = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError, TypeError) as exc:  # TypeError: a relative module
        raise ValueError(f"cannot import {spec}: {_line(exc)}") from None
    try:
        renderer = factory()
    except Exception as exc:  # the user's factory: any failure is a configuration error
        raise ValueError(f"{spec}() failed: {type(exc).__name__}: {_line(exc)}") from None
    if not isinstance(renderer, Renderer):
        raise ValueError(f"{spec}() returned a {type(renderer).__name__}, not a Renderer")
    return renderer


def _line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
