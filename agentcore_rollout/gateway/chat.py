"""OpenAI chat completions (`POST /v1/chat/completions`): the gateway's first dialect.

Which fields are honoured, ignored or refused: docs/gateway.md#each-api-field-by-field."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

from ..serving.http import boolean, chat_chunks, openai_usage
from .sampling import SGLANG_NAMES, request_sampling
from .sessions import Session
from .turns import (
    ChatTurn,
    Dialect,
    Ignored,
    ToolChoice,
    TurnAnswer,
    json_schema_of,
    mode_choice,
    named_choice,
    steering,
    top_logprobs_of,
)

_HONOURED = {"model", "messages", "tools", "tool_choice", "parallel_tool_calls", "stream"}
_HONOURED |= {"stream_options", "logprobs", "top_logprobs", "response_format", "n", "modalities"}
_HONOURED |= {"max_completion_tokens", "reasoning_effort", "verbosity", *SGLANG_NAMES}
_NO_EFFECT = {"user", "metadata", "store", "service_tier", "safety_identifier"}
_NO_EFFECT |= {"prompt_cache_key", "prompt_cache_retention"}
_REFUSED = {
    "logit_bias": "the backends sample from the policy's own distribution",
    "functions": "use tools (function calling's legacy form is not served)",
    "function_call": "use tool_choice (function calling's legacy form is not served)",
    "audio": "the gateway's renderer is text-only",
    "prediction": "predicted outputs are not served",
    "web_search_options": "the gateway hosts no search tool",
}


class ChatDialect(Dialect):
    name = "chat"
    paths = ("/v1/chat/completions",)
    honoured, no_effect, refused = _HONOURED, _NO_EFFECT, _REFUSED

    def convert(self, body: dict[str, Any], session: Session, ignored: Ignored) -> ChatTurn:
        steering(body.get("reasoning_effort"), "reasoning_effort", ignored)
        steering(body.get("verbosity"), "verbosity", ignored)
        modalities = body.get("modalities")
        if modalities not in (None, ["text"]):
            raise ValueError("modalities must be ['text']: the gateway's renderer is text-only")
        tools = _tools(body.get("tools"))
        fmt = body.get("response_format")
        if fmt is not None and not isinstance(fmt, Mapping):
            raise ValueError("response_format must be an object")
        fmt = fmt or {}
        inner = fmt.get("json_schema")
        schema = inner.get("schema") if isinstance(inner, Mapping) else None
        logprobs = boolean(body.get("logprobs"), "logprobs")
        top = top_logprobs_of(body.get("top_logprobs"))
        if top and not logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        parallel = body.get("parallel_tool_calls")
        return ChatTurn(
            messages=_known_keys(body.get("messages"), ignored),
            tools=tools,
            tool_choice=_tool_choice(body.get("tool_choice"), tools),
            parallel_tool_calls=parallel is None or boolean(parallel, "parallel_tool_calls"),
            sampling=request_sampling(body, session.sampling),
            json_schema=json_schema_of(fmt.get("type"), schema, "response_format"),
            logprobs=logprobs,
            top_logprobs=top,
            stream=boolean(body.get("stream"), "stream"),
        )

    def reply(self, answer: TurnAnswer, turn: ChatTurn) -> dict[str, Any]:
        logprobs = None if answer.logprobs is None else {"content": answer.logprobs}
        choice = {"index": 0, "message": answer.chat_message(), "logprobs": logprobs}
        return {
            "id": f"chatcmpl-{answer.id}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": turn.model,
            "choices": [{**choice, "finish_reason": answer.finish_reason}],
            "usage": openai_usage(answer.prompt_tokens, answer.completion_tokens),
        }

    def events(self, answer: TurnAnswer, turn: ChatTurn) -> Iterator[tuple[str | None, Any]]:
        """Reasoning, content, then one chunk per tool call, closed by `[DONE]`."""
        reply = self.reply(answer, turn)
        message, logprobs = reply["choices"][0]["message"], reply["choices"][0]["logprobs"]
        deltas: list[tuple[dict[str, Any], Any]] = []
        if answer.reasoning:
            deltas.append(({"reasoning_content": answer.reasoning}, None))
        if message["content"]:
            deltas.append(({"content": message["content"]}, logprobs))
        for i, call in enumerate(answer.tool_calls):
            deltas.append(({"tool_calls": [{"index": i, **call}]}, None))
        head = {k: reply[k] for k in ("id", "created", "model")}
        finish = {"finish_reason": answer.finish_reason}
        options = turn.body.get("stream_options")
        for chunk in chat_chunks(head, deltas, finish, reply["usage"], options):
            yield None, chunk
        yield None, "[DONE]"


# What a chat message carries that templates read (`thinking`, `reasoning`: the names some
# templates and servers give reasoning_content), and OpenAI's own keys that render nothing.
_MESSAGE_KEYS = {"role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content"}
_MESSAGE_KEYS |= {"thinking", "reasoning", "refusal", "annotations", "audio", "function_call"}


def _known_keys(messages: Any, ignored: Ignored) -> Any:
    """The messages as the template is to see them: a key no template reads (`cache_control`,
    a client's own bookkeeping) is left out and named in the trace (`messages.<key>`), so the
    prompt is what the trace says it is. The renderer checks the rest."""
    if not isinstance(messages, list):
        return messages
    out = messages
    for i, message in enumerate(messages):
        if type(message) is not dict or _MESSAGE_KEYS.issuperset(message):
            continue
        extra = set(message) - _MESSAGE_KEYS
        for key in sorted(extra):
            if message[key] is not None:
                ignored.add(
                    f"messages.{key}", "unknown to the gateway: it changes nothing rendered"
                )
        if out is messages:
            out = list(messages)
        out[i] = {k: v for k, v in message.items() if k not in extra}
    return out


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list) or not all(
        isinstance(t, dict)
        and t.get("type", "function") == "function"
        and isinstance(t.get("function"), dict)
        for t in tools
    ):
        raise ValueError("tools must be a list of {'type': 'function', 'function': {...}}")
    return tools


def _tool_choice(value: Any, tools: list[dict[str, Any]] | None) -> ToolChoice:
    mode = mode_choice(value, tools)
    if mode is not None:
        return mode
    function = value.get("function") if isinstance(value, Mapping) else None
    if isinstance(function, Mapping) and value.get("type") == "function":
        return named_choice(function.get("name"), tools, "tool_choice")
    raise ValueError(
        "tool_choice must be 'none', 'auto', 'required' or "
        "{'type': 'function', 'function': {'name': ...}}"
    )
