"""Response parsing per model family: sampled text -> an OpenAI assistant message (`content`,
`reasoning_content`, `tool_calls`). It never raises on model output: a botched call is the whole
text as content, `ill_formed=True` and a one-line `error`.

Each parser inverts its family's chat template, so a turn re-rendered as history is the text that
was sampled and consecutive turns merge. A family is data (a transformers response schema);
Hermes keeps its hand-written parser, so the toy policy's stack needs no transformers."""

# ruff: noqa: RUF001  (DeepSeek's markers are written with full-width bars, on purpose)
from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Message = dict[str, Any]
TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
TOOL_OPEN = "<tool_call>"


@dataclass(frozen=True)
class Parsed:
    """An assistant turn as the agent will see it. `message` is an OpenAI assistant message
    (`content`; `reasoning_content` when the model reasoned; `tool_calls` when it called tools);
    `error` says why a turn is `ill_formed` (one line)."""

    message: Message
    ill_formed: bool = False
    error: str | None = None

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        return self.message.get("tool_calls") or []

    @property
    def reasoning(self) -> str | None:
        return self.message.get("reasoning_content")


# -- Hermes / Qwen2.5: by hand, without transformers ----------------------------------------------


def parse_tool_calls(text: str) -> Parsed:
    """Split model text into content and Hermes-style tool calls.

    Inverse of the fixture template: content, then each call, separated by one "\\n". Content is
    the text before the first call minus one trailing "\\n"; whitespace between calls is the
    separator; any other text outside the calls is appended to the content. `arguments` is
    returned as a JSON string (OpenAI's shape); if the model wrote an object it is serialized
    as a chat template's `tojson` renders it (json.dumps, non-ASCII kept).
    """
    if TOOL_OPEN not in text:
        return Parsed({"role": "assistant", "content": text})
    calls: list[dict[str, Any]] = []
    pieces: list[str] = []
    last = 0
    for match in TOOL_CALL_RE.finditer(text):
        pieces.append(text[last : match.start()])
        last = match.end()
        try:
            payload = json.loads(match.group(1))
        except ValueError as exc:
            return _ill_formed(text, f"tool call is not valid JSON: {exc}")
        call, error = _tool_call(payload)
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


def _tool_call(payload: Any) -> tuple[dict[str, Any], str | None]:
    """An OpenAI tool call from a parsed call object: `name`, and `arguments` (or Llama's
    `parameters`) as a JSON string; a call `id` the model wrote (Mistral) is kept."""
    if not isinstance(payload, Mapping) or not isinstance(payload.get("name"), str):
        return {}, "tool call must be an object with a string 'name'"
    name = payload["name"]
    arguments = payload.get("arguments", payload.get("parameters"))
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    if not name.strip():
        return {}, "tool call has an empty name"
    call_id = payload.get("id")
    if not (isinstance(call_id, str) and call_id):
        call_id = f"call_{uuid.uuid4().hex[:24]}"
    function = {"name": name, "arguments": arguments}
    return {"id": call_id, "type": "function", "function": function}, None


def _ill_formed(text: str, error: str) -> Parsed:
    return Parsed({"role": "assistant", "content": text}, ill_formed=True, error=_line(error))


def _line(text: str) -> str:
    return " ".join(text.split())[:300]


# -- families -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Family:
    """How one model family writes its answer, as data.

    `reasoning`: a regex matched at the start of the text, with a `reasoning_content` group (the
    separators the template puts around it are outside the group). `calls_at`: a regex searched
    in the rest, with a `calls` group that runs to the end; the content is what precedes the
    match. `calls`: transformers response schemas for that region, tried in order (one with an
    `x-regex` applies only where its regex matches); each yields a list of call objects (`name`,
    `arguments` or `parameters`, maybe `id`). `call_open`: the marker of one call; left over once
    the calls are taken, the region was malformed. `frame`: markers around the calls (dropped
    from what is left over). `strip_content`: the template strips the content. `coerce_values`:
    argument values were written as text (GLM) and are read back as JSON where they are JSON.
    `markers`: strings whose presence in a chat template names the family. `keep`: special
    tokens the parser reads (kept when decoding). `stop`: end-of-turn tokens besides EOS.
    `object_arguments`: the template reads `arguments` as an object (as vLLM passes it), so the
    renderer parses the agent's JSON string before rendering."""

    name: str
    markers: tuple[str, ...] = ()
    reasoning: str | None = None
    calls_at: str | None = None
    calls: tuple[Mapping[str, Any], ...] = ()
    call_open: str = ""
    frame: tuple[str, ...] = ()
    strip_content: bool = False
    coerce_values: bool = False
    keep: tuple[str, ...] = ()
    stop: tuple[str, ...] = ()
    object_arguments: bool = False
    assemble: Callable[[str, bool], Parsed] | None = None  # a parser of its own (harmony)

    def parse(self, text: str, *, tools_enabled: bool) -> Parsed:
        """The assistant message for decoded text; never raises on model output."""
        if self.assemble is not None:
            return self.assemble(text, tools_enabled)
        if not self.calls:  # Hermes
            return parse_tool_calls(text) if tools_enabled else _message(text, None, [])
        reasoning, rest = None, text
        if self.reasoning is not None:
            found = re.match(self.reasoning, text, re.DOTALL)
            if found is not None:
                reasoning, rest = found.group("reasoning_content"), text[found.end() :]
        where = None
        if tools_enabled and self.calls_at:
            where = re.search(self.calls_at, rest, re.DOTALL)
        if where is None:
            return _message(self._content(rest), reasoning, [])
        content, region = rest[: where.start()], where.group("calls")
        try:
            objects, leftover = self._calls(region)
        except Exception as exc:  # recursive_parse raises ValueError/TypeError on a bad call
            return _ill_formed(text, f"{self.name} tool call: {_schema_error(exc)}")
        calls = []
        for payload in objects:
            call, error = _tool_call(self._coerced(payload))
            if error is not None:
                return _ill_formed(text, f"{self.name} {error}")
            calls.append(call)
        if not calls:
            what = f"{self.call_open} block" if self.call_open else "tool call"
            return _ill_formed(text, f"{self.name}: unterminated or malformed {what}")
        if self.call_open and self.call_open in leftover:
            return _ill_formed(text, f"{self.name}: unterminated {self.call_open} block")
        extra = leftover.strip()
        content = self._content(content)
        content = "\n".join(p for p in (content, extra) if p) if extra else content
        return _message(content, reasoning, calls)

    def _calls(self, region: str) -> tuple[list[Any], str]:
        """The call objects in `region`, and what is left of it outside them."""
        from transformers.utils.chat_parsing_utils import recursive_parse  # [gateway]

        schema = self.calls[-1]
        for option in self.calls:
            if "x-regex" not in option or re.search(option["x-regex"], region, re.DOTALL):
                schema = option
                break
        objects = recursive_parse(region, dict(schema)) or []
        iterator = schema.get("x-regex-iterator")
        leftover = re.sub(iterator, "", region, flags=re.DOTALL) if iterator else ""
        for marker in self.frame:
            leftover = leftover.replace(marker, "")
        return list(objects), leftover

    def _content(self, content: str) -> str:
        return content.strip() if self.strip_content else content

    def _coerced(self, payload: Any) -> Any:
        if not (self.coerce_values and isinstance(payload, dict)):
            return payload
        arguments = payload.get("arguments") or {}
        return {**payload, "arguments": {k: _json_or_text(v) for k, v in arguments.items()}}


def _schema_error(exc: Exception) -> str:
    """transformers' parse errors in one short line (they quote the content and advise)."""
    message = str(exc)
    if "could not parse its contents as JSON" in message:
        return "not valid JSON: " + message.rsplit("Error: ", 1)[-1]
    return message.splitlines()[0] if message else type(exc).__name__


def _json_or_text(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


def _message(content: str, reasoning: str | None, calls: list[dict[str, Any]]) -> Parsed:
    message: Message = {"role": "assistant", "content": content}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["content"] = content or None
        message["tool_calls"] = calls
    return Parsed(message)


# -- harmony (gpt-oss): messages on channels ------------------------------------------------

HARMONY_MESSAGES: Mapping[str, Any] = {
    "type": "array",
    "x-regex-iterator": (
        r"(?:<\|start\|>assistant)?(?P<header>(?:(?!<\|message\|>|<\|start\|>).)*)<\|message\|>"
        r"(?P<body>(?:(?!<\|start\|>).)*?)(?:<\|end\|>|<\|call\|>|<\|return\|>|(?=<\|start\|>)|\Z)"
    ),
    "items": {
        "type": "object",
        "properties": {"header": {"type": "string"}, "body": {"type": "string"}},
    },
}
_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")


def _harmony(text: str, tools_enabled: bool) -> Parsed:
    """analysis = reasoning; commentary `to=functions.NAME` = a call (its body the JSON
    arguments); final, or commentary to no one (a preamble) = content."""
    from transformers.utils.chat_parsing_utils import recursive_parse  # [gateway]

    if "<|message|>" not in text:
        return _message(text, None, [])
    try:
        messages = recursive_parse(text, dict(HARMONY_MESSAGES)) or []
    except Exception as exc:
        return _ill_formed(text, f"harmony: {_schema_error(exc)}")
    reasoning, content, calls = [], [], []
    for item in messages:
        header, body = item.get("header", ""), item.get("body", "")
        channel = _CHANNEL.search(header)
        recipient = _RECIPIENT.search(header)
        if channel is None:
            return _ill_formed(text, f"harmony: a message without a channel: {header[:40]!r}")
        if channel.group(1) == "analysis":
            reasoning.append(body)
        elif recipient is None:
            content.append(body)
        elif not tools_enabled:
            return _message(text, None, [])
        else:
            try:
                arguments = json.loads(body) if body.strip() else {}
            except ValueError as exc:
                return _ill_formed(text, f"harmony tool call is not valid JSON: {exc}")
            name = recipient.group(1).removeprefix("functions.")
            call, error = _tool_call({"name": name, "arguments": arguments})
            if error is not None:
                return _ill_formed(text, f"harmony {error}")
            calls.append(call)
    return _message("".join(content), "".join(reasoning) or None, calls)


# -- the families, and choosing one ---------------------------------------------------------

_THINK = r"(?:<think>)?\n?(?P<reasoning_content>.*?)\n?</think>\n*"
_JSON_ITEMS = {"type": "object", "x-parser": "json"}
_NAMED_JSON_ARGUMENTS = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "id": {"type": "string"},
        "arguments": {"x-parser": "json"},
    },
}

HERMES = Family("hermes", markers=("<tool_call>",))
FAMILIES: dict[str, Family] = {
    family.name: family
    for family in (
        HERMES,
        Family(  # Qwen3: <think>\n...\n</think>\n\n, then Hermes calls with newlines inside
            "qwen3",
            markers=("<think>", "<tool_call>"),
            reasoning=_THINK,
            calls_at=r"\n?(?P<calls><tool_call>.*)\Z",
            calls=(
                {
                    "type": "array",
                    "x-regex-iterator": r"<tool_call>\s*(.*?)\s*</tool_call>",
                    "items": _JSON_ITEMS,
                },
            ),
            call_open="<tool_call>",
            stop=("<|im_end|>", "<|endoftext|>"),
        ),
        Family(  # Llama 3.x: {"name": ..., "parameters": {...}}, maybe after <|python_tag|>
            "llama3",
            markers=("<|start_header_id|>", "<|eot_id|>"),
            calls_at=r"\A\s*(?:<\|python_tag\|>\s*|(?=\{\s*\"name\"\s*:))(?P<calls>.*)\Z",
            calls=(
                {
                    "type": "array",
                    "x-regex-iterator": r"(\{.*?\})\s*(?:;|\Z)",
                    "items": _JSON_ITEMS,
                },
            ),
            call_open='{"name"',
            keep=("<|python_tag|>",),
            stop=("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"),
            object_arguments=True,
        ),
        Family(  # Mistral: [TOOL_CALLS][{...}] (v3) or [TOOL_CALLS]name[ARGS]{...} (v11+)
            "mistral",
            markers=("[TOOL_CALLS]",),
            reasoning=r"\[THINK\](?P<reasoning_content>.*?)\[/THINK\]",
            calls_at=r"(?P<calls>\[TOOL_CALLS\].*)\Z",
            calls=(
                {
                    "type": "array",
                    "x-regex": r"\A\[TOOL_CALLS\]\s*(\[.*\])\s*\Z",
                    "x-parser": "json",
                    "items": {"type": "object"},
                },
                {
                    "type": "array",
                    "x-regex-iterator": (
                        r"\[TOOL_CALLS\](?P<name>[^\[\]{}]+?)(?:\[CALL_ID\](?P<id>[^\[\]]+?))?"
                        r"\[ARGS\](?P<arguments>.*?)(?=\[TOOL_CALLS\]|\Z)"
                    ),
                    "items": _NAMED_JSON_ARGUMENTS,
                },
            ),
            call_open="[TOOL_CALLS]",
            keep=("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "[THINK]", "[/THINK]"),
            stop=("</s>",),
        ),
        Family(  # DeepSeek V3: calls in fenced JSON between its full-width markers
            "deepseek_v3",
            markers=("<｜tool▁calls▁begin｜>",),
            reasoning=r"(?:<think>)?(?P<reasoning_content>.*?)</think>\n*",
            calls_at=r"(?P<calls><｜tool▁calls▁begin｜>.*)\Z",
            calls=(
                {
                    "type": "array",
                    "x-regex-iterator": (
                        r"<｜tool▁call▁begin｜>(?P<type>[^<]*?)<｜tool▁sep｜>(?P<name>[^\n<]+)\n"
                        r"```(?:json)?\n(?P<arguments>.*?)\n```\s*<｜tool▁call▁end｜>"
                    ),
                    "items": _NAMED_JSON_ARGUMENTS,
                },
            ),
            call_open="<｜tool▁call▁begin｜>",
            frame=("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"),
            keep=(
                "<｜tool▁calls▁begin｜>",
                "<｜tool▁calls▁end｜>",
                "<｜tool▁call▁begin｜>",
                "<｜tool▁call▁end｜>",
                "<｜tool▁sep｜>",
            ),
            stop=("<｜end▁of▁sentence｜>",),
        ),
        Family(  # GLM-4.5: \n<think>..</think>, \ncontent, \n<tool_call>name\n<arg_key>..
            "glm45",
            markers=("<arg_key>", "<tool_call>"),
            reasoning=r"\s*<think>(?P<reasoning_content>.*?)</think>",
            calls_at=r"\s*(?P<calls><tool_call>.*)\Z",
            calls=(
                {
                    "type": "array",
                    "x-regex-iterator": (
                        r"<tool_call>\s*(?P<name>[^<\n]+?)\s*"
                        r"(?P<arguments>(?:<arg_key>.*?</arg_value>\s*)*)</tool_call>"
                    ),
                    "items": {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string"},
                            "arguments": {
                                "type": "object",
                                "x-regex-key-value": (
                                    r"<arg_key>(?P<key>.*?)</arg_key>\s*"
                                    r"<arg_value>(?P<value>.*?)</arg_value>"
                                ),
                            },
                        },
                    },
                },
            ),
            call_open="<tool_call>",
            strip_content=True,
            coerce_values=True,
            stop=("<|user|>", "<|observation|>", "<|endoftext|>"),
            object_arguments=True,
        ),
        Family(  # gpt-oss: <|channel|>analysis / commentary to=functions.NAME / final
            "harmony",
            markers=("<|channel|>", "<|message|>"),
            keep=(
                "<|start|>",
                "<|channel|>",
                "<|message|>",
                "<|constrain|>",
                "<|end|>",
                "<|call|>",
                "<|return|>",
            ),
            stop=("<|return|>", "<|call|>"),
            assemble=_harmony,
        ),
    )
}
# The most specific markers first: GLM's and Qwen3's templates hold <tool_call> too.
DETECTION_ORDER = ("harmony", "glm45", "deepseek_v3", "mistral", "llama3", "qwen3")


def family(name: str) -> Family:
    """The family called `name`; a ValueError listing the known ones otherwise."""
    found = FAMILIES.get(name)
    if found is None:
        known = ", ".join(sorted(FAMILIES))
        raise ValueError(f"unknown parser {name!r}: known parsers are {known}")
    return found


def detect_family(chat_template: str | Mapping[str, str] | Sequence[Any] | None) -> Family:
    """The family whose markers all occur in a chat template (Hermes when none does)."""
    if isinstance(chat_template, Mapping):  # named templates: the default one speaks
        chat_template = chat_template.get("default") or "".join(chat_template.values())
    if not isinstance(chat_template, str):
        return HERMES
    for name in DETECTION_ORDER:
        if all(marker in chat_template for marker in FAMILIES[name].markers):
            return FAMILIES[name]
    return HERMES
