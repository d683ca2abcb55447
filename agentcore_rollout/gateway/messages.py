"""Anthropic Messages (`POST /v1/messages`): the dialect of the anthropic SDK, the Claude Agent SDK,
Claude Code and litellm's anthropic provider.

Also served at `/v1/v1/messages`: agents are handed the gateway URL + `/v1`, and the SDK appends
`/v1/messages` to its base URL. A thinking block's `signature` seals its text, so a block sent
back empty (`display: omitted`) still renders as sampled. The fields honoured, ignored or
refused: docs/gateway.md#each-api-field-by-field."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from ..serving.http import boolean
from .sampling import request_sampling
from .sessions import Session
from .turns import (
    ChatTurn,
    Dialect,
    Ignored,
    ToolChoice,
    TurnAnswer,
    json_schema_of,
    named_choice,
    seal_reasoning,
    steering,
    unseal_reasoning,
)

_HONOURED = {"model", "messages", "system", "max_tokens", "stop_sequences", "temperature"}
_HONOURED |= {"top_p", "top_k", "tools", "tool_choice", "stream", "thinking", "output_config"}
_HONOURED |= {"context_management"}
_NO_EFFECT = {"metadata", "service_tier", "inference_geo", "cache_control", "speed"}
_NO_EFFECT |= {"diagnostics"}
_REFUSED = {
    "container": "the gateway hosts no code-execution container",
    "mcp_servers": "the gateway connects to no MCP server",
}
CLEAR_THINKING = "clear_thinking_20251015"
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
_STOP_REASONS["content_filter"] = "refusal"  # a pass-through backend's filter
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}
_BLOCK_KEYS = {
    "text": {"type", "text", "cache_control", "citations"},
    "tool_use": {"type", "id", "name", "input", "cache_control", "caller", "toolset_name"},
    "tool_result": {"type", "tool_use_id", "content", "is_error", "cache_control", "toolset_name"},
    "thinking": {"type", "thinking", "signature"},
}
_CHOICE_KEYS = {"type", "name", "disable_parallel_tool_use"}
_TOOL_KEYS = {"name", "description", "input_schema", "type", "cache_control", "strict"}
_TOOL_KEYS |= {"eager_input_streaming", "allowed_callers", "defer_loading", "input_examples"}


class MessagesDialect(Dialect):
    name = "messages"
    paths = ("/v1/messages", "/v1/v1/messages")
    honoured, no_effect, refused = _HONOURED, _NO_EFFECT, _REFUSED

    def convert(self, body: dict[str, Any], session: Session, ignored: Ignored) -> ChatTurn:
        _check_thinking(body.get("thinking"), ignored)
        max_tokens = body.get("max_tokens")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError("max_tokens is required: a positive integer")
        stop = body.get("stop_sequences")
        if stop is not None and not (
            isinstance(stop, list) and all(isinstance(s, str) and s for s in stop)
        ):
            raise ValueError("stop_sequences must be a list of non-empty strings")
        picked = {"max_tokens": max_tokens, "stop": stop or None}
        picked.update((k, body.get(k)) for k in ("temperature", "top_p", "top_k"))
        tools = _tools(body.get("tools"), ignored)
        choice, parallel = _tool_choice(body.get("tool_choice"), tools)
        messages = _messages(body.get("messages"), ignored)
        _clear_thinking(messages, body.get("context_management"), ignored)
        system = _system(body.get("system"), ignored)
        return ChatTurn(
            messages=[{"role": "system", "content": system}, *messages] if system else messages,
            tools=tools,
            tool_choice=choice,
            parallel_tool_calls=parallel,
            sampling=request_sampling(picked, session.sampling),
            json_schema=_output_schema(body.get("output_config"), ignored),
            stream=boolean(body.get("stream"), "stream"),
        )

    def reply(self, answer: TurnAnswer, turn: ChatTurn) -> dict[str, Any]:
        stop_sequence = _stop_sequence(answer, turn)
        reason = _STOP_REASONS.get(answer.finish_reason, "end_turn")
        return {
            "id": f"msg_{answer.id}",
            "type": "message",
            "role": "assistant",
            "model": turn.model,
            "content": _content(answer, omit_thinking=_display(turn.body) == "omitted"),
            "stop_reason": "stop_sequence" if stop_sequence else reason,
            "stop_sequence": stop_sequence,
            "usage": {
                "input_tokens": answer.prompt_tokens,
                "output_tokens": answer.completion_tokens,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        }

    def events(self, answer: TurnAnswer, turn: ChatTurn) -> Iterator[tuple[str | None, Any]]:
        """message_start, then per block its start, one delta (two for thinking: the text,
        then the signature) and its stop, then message_delta and message_stop: the order the
        SDK's stream helper assembles into the same Message as the non-streamed reply."""
        reply = self.reply(answer, turn)
        usage = reply["usage"]
        head = {**reply, "content": [], "stop_reason": None, "stop_sequence": None}
        head["usage"] = {**usage, "output_tokens": 0}
        yield "message_start", {"type": "message_start", "message": head}
        for index, block in enumerate(reply["content"]):
            kind = block["type"]
            if kind == "text":
                start = {"type": "text", "text": ""}
                deltas = [("text_delta", "text", block["text"])]
            elif kind == "thinking":
                start = {"type": "thinking", "thinking": "", "signature": ""}
                deltas = [("thinking_delta", "thinking", block["thinking"])]
                deltas.append(("signature_delta", "signature", block["signature"]))
            else:
                start = {**block, "input": {}}
                arguments = json.dumps(block["input"], ensure_ascii=False)
                deltas = [("input_json_delta", "partial_json", arguments)]
            yield "content_block_start", _event("content_block_start", index, content_block=start)
            for delta, key, value in deltas:
                data = _event("content_block_delta", index, delta={"type": delta, key: value})
                yield "content_block_delta", data
            yield "content_block_stop", _event("content_block_stop", index)
        delta = {"stop_reason": reply["stop_reason"], "stop_sequence": reply["stop_sequence"]}
        yield "message_delta", {"type": "message_delta", "delta": delta, "usage": usage}
        yield "message_stop", {"type": "message_stop"}

    def error(self, status: int, message: str, code: str | None) -> dict[str, Any]:
        kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": message}}


# -- the request ----------------------------------------------------------------------------------


def _check_thinking(thinking: Any, ignored: Ignored) -> None:
    if thinking is None:
        return
    kind = thinking.get("type") if isinstance(thinking, Mapping) else None
    if kind in ("enabled", "between_tools"):
        raise ValueError(
            f"thinking type {kind!r} is not supported: the gateway cannot steer when or how "
            "long the policy reasons; use 'adaptive' (the model decides) or 'disabled'"
        )
    if kind not in ("adaptive", "disabled"):
        raise ValueError("thinking must be {'type': 'adaptive' | 'disabled'}")
    display = thinking.get("display")
    if display is not None and not isinstance(display, str):
        raise ValueError("thinking.display must be a string")
    if display not in (None, "omitted"):
        ignored.add("thinking.display", "how thinking is shown: it comes back whole")
    for extra in sorted(set(thinking) - {"type", "display"}):
        ignored.add(f"thinking.{extra}", "unknown to the gateway")


def _display(body: Mapping[str, Any]) -> Any:
    thinking = body.get("thinking")
    return thinking.get("display") if isinstance(thinking, Mapping) else None


def _clear_thinking(messages: list[dict[str, Any]], edits: Any, ignored: Ignored) -> None:
    """Carry out `context_management`: a `clear_thinking_20251015` edit leaves the thinking of
    all but the last `keep` assistant turns out of the prompt (1 unless told; "all" keeps it)."""
    if edits is None:
        return
    listed = edits.get("edits") if isinstance(edits, Mapping) else None
    if not isinstance(listed, list) or set(edits) - {"edits"}:
        raise ValueError("context_management must be {'edits': [...]}")
    for i, edit in enumerate(listed):
        kind = edit.get("type") if isinstance(edit, Mapping) else None
        if kind != CLEAR_THINKING or set(edit) - {"type", "keep"}:
            raise ValueError(
                f"context_management.edits[{i}] of type {kind!r} is not supported: the gateway "
                f"carries out {CLEAR_THINKING!r} (with 'keep') only"
            )
        keep = edit.get("keep", {"type": "thinking_turns", "value": 1})
        if keep == "all":
            ignored.add("context_management", "it keeps all thinking: nothing is cleared")
            continue
        turns = keep.get("value") if isinstance(keep, Mapping) else None
        if type(turns) is not int or turns < 0 or keep.get("type") != "thinking_turns":
            raise ValueError(
                f"context_management.edits[{i}].keep must be 'all' or "
                "{'type': 'thinking_turns', 'value': N}"
            )
        assistants = [m for m in messages if m["role"] == "assistant"]
        for message in assistants[: len(assistants) - turns]:
            message.pop("reasoning_content", None)


def _output_schema(config: Any, ignored: Ignored) -> dict[str, Any] | None:
    if config is None:
        return None
    if not isinstance(config, Mapping) or set(config) - {"format", "effort"}:
        raise ValueError("output_config must be an object with 'format' or 'effort'")
    steering(config.get("effort"), "output_config.effort", ignored)
    fmt = config.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, Mapping) or fmt.get("type") != "json_schema":
        raise ValueError("output_config.format must be {'type': 'json_schema', 'schema': {...}}")
    return json_schema_of("json_schema", fmt.get("schema"), "output_config.format")


BILLING_HEADER = "x-anthropic-billing-header:"


def _system(system: Any, ignored: Ignored) -> str | None:
    if system is None or isinstance(system, str):
        return system or None
    if isinstance(system, list):
        try:
            texts = _text_blocks(system)
        except ValueError as exc:
            raise ValueError(f"system{exc}") from None
        if texts and texts[0].startswith(BILLING_HEADER):
            # Claude Code's first block: its version, entry point and a hash of the request,
            # for Anthropic's billing, different in every session (or request): nothing the
            # policy could use, and in the prompt's first line it would keep any two sessions
            # from sharing a prefix. Left out of the prompt, named in the trace.
            ignored.add(
                "system:x-anthropic-billing-header",
                "a billing header of Claude Code's: left out of the prompt",
            )
            texts = texts[1:]
        return "\n".join(texts) or None
    raise ValueError("system must be a string or a list of text blocks")


# The block checks below raise errors relative to the block ("[2]: ..."); their callers add
# where the block sits, so the path of a block is only written out when it is wrong.


def _text_blocks(blocks: list[Any]) -> list[str]:
    texts = []
    for i, block in enumerate(blocks):
        kind = _block_type(block, i)
        if kind != "text":
            raise ValueError(f"[{i}]: {_refusal(kind)}")
        texts.append(block["text"])
    return texts


def _block_type(block: Any, i: int) -> str:
    """A content block's type, its fields checked if it is one the gateway renders."""
    kind = block.get("type") if type(block) is dict else None
    if not isinstance(kind, str):
        raise ValueError(f"[{i}] must be a content block with a string 'type'")
    keys = _BLOCK_KEYS.get(kind)
    if keys is not None and not keys.issuperset(block):
        extra = sorted(set(block) - keys)[0]
        raise ValueError(f"[{i}]: unknown field {extra!r} in a {kind} block")
    if kind == "text" and not isinstance(block.get("text"), str):
        raise ValueError(f"[{i}]: a text block needs a string 'text'")
    return kind


def _refusal(kind: str) -> str:
    if kind in ("image", "document", "search_result"):
        return f"{kind} blocks are not supported: the gateway's renderer is text-only"
    if kind == "redacted_thinking":
        return "redacted_thinking blocks are not supported: their text is encrypted by Anthropic"
    return f"a {kind!r} block is not supported here"


def _messages(messages: Any, ignored: Ignored) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        role = message.get("role") if type(message) is dict else None
        if role not in ("user", "assistant", "system") or "content" not in message:
            raise ValueError(
                f"messages[{i}] must be {{'role': 'user' | 'assistant' | 'system', 'content'}}"
            )
        _message_keys(message, i, ignored)
        content = message.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
        elif not isinstance(content, list):
            raise ValueError(f"messages[{i}].content must be a string or a list of blocks")
        else:
            try:
                if role == "user":
                    out.extend(_user(content))
                elif role == "assistant":
                    out.append(_assistant(content))
                else:
                    out.append({"role": "system", "content": "\n".join(_text_blocks(content))})
            except ValueError as exc:
                raise ValueError(f"messages[{i}].content{exc}") from None
    if out[-1]["role"] == "assistant":
        raise ValueError(
            "a final assistant message (prefill) is not supported: the gateway always "
            "samples a new assistant turn"
        )
    return out


def _message_keys(message: dict[str, Any], i: int, ignored: Ignored) -> None:
    """A message's keys besides role and content, by the field policy: an `output_config` on a
    message (Claude Code >= 2.1.332 sets one on its system messages) is read as the request's
    is (its effort steers a hosted model: ignored; a format there cannot be carried out for one
    message: refused); `cache_control` and keys the gateway does not know change nothing
    rendered: ignored, named `messages.<key>`."""
    for key in sorted(set(message) - {"role", "content"}):
        value = message[key]
        if value is None:
            continue
        if key == "output_config":
            if not isinstance(value, Mapping) or set(value) - {"format", "effort"}:
                raise ValueError(f"messages[{i}].output_config must be an object with 'effort'")
            if value.get("format") is not None:
                raise ValueError(
                    f"messages[{i}].output_config.format is not supported: a format binds the "
                    "whole reply; set output_config.format on the request"
                )
            steering(value.get("effort"), "messages.output_config.effort", ignored)
        else:
            why = (
                "it has no effect on the turn"
                if key == "cache_control"
                else "unknown to the gateway"
            )
            ignored.add(f"messages.{key}", why)


def _user(blocks: list[Any]) -> list[dict[str, Any]]:
    """One `tool` message per tool_result, in order, then the user's text, if any."""
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for i, block in enumerate(blocks):
        kind = _block_type(block, i)
        if kind == "text":
            texts.append(block["text"])
        elif kind == "tool_result":
            out.append(_tool_result(block, i))
        else:
            raise ValueError(f"[{i}]: {_refusal(kind)} in a user message")
    if texts or not out:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _tool_result(block: dict[str, Any], i: int) -> dict[str, Any]:
    call_id, content = block.get("tool_use_id"), block.get("content")
    if not isinstance(call_id, str):
        raise ValueError(f"[{i}]: a tool_result needs a string 'tool_use_id'")
    if content is None or isinstance(content, str):
        text = content or ""
    elif isinstance(content, list):
        try:
            text = "\n".join(_text_blocks(content))
        except ValueError as exc:
            raise ValueError(f"[{i}].content{exc}") from None
    else:
        raise ValueError(f"[{i}].content must be a string or a list of text blocks")
    if boolean(block.get("is_error"), f"[{i}].is_error"):
        text = f"Error: {text}"
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _assistant(blocks: list[Any]) -> dict[str, Any]:
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[dict[str, Any]] = []
    for i, block in enumerate(blocks):
        kind = _block_type(block, i)
        if kind == "text":
            texts.append(block["text"])
        elif kind == "thinking":
            if not isinstance(block.get("thinking"), str):
                raise ValueError(f"[{i}]: a thinking block needs a string 'thinking'")
            thoughts.append(block["thinking"] or unseal_reasoning(block.get("signature")) or "")
        elif kind == "tool_use":
            calls.append(_tool_use(block, i))
        else:
            raise ValueError(f"[{i}]: {_refusal(kind)} in an assistant message")
    message: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) or None}
    if thoughts:
        message["reasoning_content"] = "\n".join(thoughts)
    if calls:
        message["tool_calls"] = calls
    return message


def _tool_use(block: dict[str, Any], i: int) -> dict[str, Any]:
    call_id, name, arguments = block.get("id"), block.get("name"), block.get("input")
    if not isinstance(call_id, str) or not isinstance(name, str):
        raise ValueError(f"[{i}]: a tool_use block needs a string 'id' and 'name'")
    if not isinstance(arguments, dict):
        raise ValueError(f"[{i}]: a tool_use block's input must be an object")
    caller = block.get("caller")
    if caller is not None and caller != {"type": "direct"}:
        raise ValueError(f"[{i}]: a tool_use caller other than 'direct' is not supported")
    # As the parser writes it: non-ASCII kept, or the next prompt holds text the model never wrote.
    function = {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}
    return {"id": call_id, "type": "function", "function": function}


def _tools(tools: Any, ignored: Ignored) -> list[dict[str, Any]] | None:
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise ValueError("tools must be a list of {'name', 'description', 'input_schema'}")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise ValueError(f"tools[{i}] must be an object with a string 'name'")
        kind = tool.get("type")
        if kind not in (None, "custom"):
            ignored.add(
                f"tools:{kind}", "a server tool: the gateway runs none, the model sees none"
            )
            continue
        for extra in sorted(set(tool) - _TOOL_KEYS):
            ignored.add(f"tools.{extra}", "unknown to the gateway")
        if tool.get("strict"):
            ignored.add("tools.strict", "tool inputs are not constrained while sampling")
        if tool.get("input_examples"):
            raise ValueError(
                f"tools[{i}].input_examples is not supported: the chat template renders none"
            )
        if tool.get("allowed_callers") not in (None, ["direct"]):
            raise ValueError(f"tools[{i}].allowed_callers must be ['direct']: no code execution")
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise ValueError(f"tools[{i}].input_schema must be a JSON schema object")
        if tool.get("defer_loading"):
            continue  # honoured: not in the prompt, and no tool search would load it
        function = {"name": tool["name"], "parameters": schema}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out or None


def _tool_choice(value: Any, tools: list[dict[str, Any]] | None) -> tuple[ToolChoice, bool]:
    """The choice and whether parallel calls are allowed (`disable_parallel_tool_use`)."""
    if value is None:
        return ToolChoice("auto" if tools else "none"), True
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in ("auto", "any", "tool", "none") or set(value) - _CHOICE_KEYS:
        raise ValueError(
            "tool_choice must be {'type': 'auto' | 'any' | 'tool' | 'none', 'name'?, "
            "'disable_parallel_tool_use'?}"
        )
    parallel = not boolean(value.get("disable_parallel_tool_use"), "disable_parallel_tool_use")
    if kind == "tool":
        return named_choice(value.get("name"), tools, "tool_choice"), parallel
    if kind == "any" and not tools:
        raise ValueError("tool_choice 'any' needs tools")
    return ToolChoice({"any": "required"}.get(kind, kind)), parallel  # type: ignore[arg-type]


# -- the reply ------------------------------------------------------------------------------------


def _content(answer: TurnAnswer, *, omit_thinking: bool) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if answer.reasoning:
        shown = "" if omit_thinking else answer.reasoning
        sealed = seal_reasoning(answer.reasoning)
        blocks.append({"type": "thinking", "thinking": shown, "signature": sealed})
    if answer.content:
        blocks.append({"type": "text", "text": answer.content})
    for call in answer.tool_calls:
        function = call["function"]
        try:  # Anthropic's `input` is the arguments as a value; `{}` if they are not JSON
            arguments = json.loads(function.get("arguments") or "{}")
        except ValueError:
            arguments = {}
        blocks.append(
            {"type": "tool_use", "id": call["id"], "name": function["name"], "input": arguments}
        )
    return blocks


def _stop_sequence(answer: TurnAnswer, turn: ChatTurn) -> str | None:
    """The request's stop sequence that ended the turn, if the backend said which."""
    matched = answer.stop_sequence
    if matched is None or answer.finish_reason != "stop":
        return None
    return matched if matched in (turn.body.get("stop_sequences") or ()) else None


def _event(kind: str, index: int, **fields: Any) -> dict[str, Any]:
    return {"type": kind, "index": index, **fields}
