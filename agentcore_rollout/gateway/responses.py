"""OpenAI Responses API (`POST /v1/responses`): the dialect of the OpenAI Agents SDK's default
model, pydantic-ai's Responses model, `client.responses.create` and Codex.

Items become chat messages in order, so a conversation sent back item by item renders as it was
sampled. `previous_response_id` continues a response the session stored (or, over WebSocket, the
connection's last). Which fields are honoured, ignored or refused:
docs/gateway.md#each-api-field-by-field."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
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
    mode_choice,
    named_choice,
    seal_reasoning,
    steering,
    top_logprobs_of,
    unseal_reasoning,
)

MAX_STORED_RESPONSES = 8  # per session: a few agents' threads, bounded
LOGPROBS_INCLUDE = "message.output_text.logprobs"
SEALED_INCLUDE = "reasoning.encrypted_content"

_HONOURED = {"model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls"}
_HONOURED |= {"max_output_tokens", "temperature", "top_p", "text", "top_logprobs", "include"}
_HONOURED |= {"stream", "store", "previous_response_id", "truncation", "background", "reasoning"}
_NO_EFFECT = {"user", "metadata", "service_tier", "safety_identifier", "prompt_cache_key"}
_NO_EFFECT |= {"prompt_cache_retention", "prompt_cache_options", "stream_options"}
_NO_EFFECT |= {"max_tool_calls", "client_metadata"}
_REFUSED = {
    "conversation": "the gateway keeps no conversation objects; send the items, or "
    "previous_response_id within the session",
    "prompt": "stored prompt templates are not served",
    "context_management": "the gateway never compacts a conversation",
    "moderation": "the gateway does not moderate",
    "image": "the gateway's renderer is text-only",
    "access_programs": "not served by the gateway",
}
_TEXT_PARTS = {"input_text", "output_text"}

# Over WebSocket (`GET /v1/responses`, as OpenAI serves it), a connection keeps its last
# response's conversation whether or not it was stored, so the next `response.create` may
# continue it by `previous_response_id` and send only the new items (Codex does, with
# `store: false`). The server's connection handler sets this to the connection's store.
CONNECTION: ContextVar[dict[str, list[dict[str, Any]]] | None] = ContextVar(
    "responses_connection", default=None
)


@dataclass
class ResponsesTurn(ChatTurn):
    """A ChatTurn with what the Responses API keeps between turns: the conversation without the
    instructions (what `store` keeps, the continued response's included), whether to store, and
    the session that stores it."""

    conversation: list[dict[str, Any]] = field(default_factory=list)
    store: bool = True
    session: Session | None = None
    sealed: bool = False  # reasoning items carry their text sealed (`encrypted_content`)


class ResponsesDialect(Dialect):
    name = "responses"
    paths = ("/v1/responses",)
    honoured, no_effect, refused = _HONOURED, _NO_EFFECT, _REFUSED

    def convert(self, body: dict[str, Any], session: Session, ignored: Ignored) -> ChatTurn:
        _check_modes(body, ignored)
        tools = _tools(body.get("tools"), ignored)
        include = body.get("include") or []
        if not isinstance(include, list) or not all(isinstance(i, str) for i in include):
            raise ValueError("include must be a list of strings")
        for name in include:
            if name not in (LOGPROBS_INCLUDE, SEALED_INCLUDE):
                ignored.add(f"include:{name}", "the gateway never produces those items")
        top = top_logprobs_of(body.get("top_logprobs"))
        logprobs = LOGPROBS_INCLUDE in include
        if top and not logprobs:
            raise ValueError(f"top_logprobs needs include: [{LOGPROBS_INCLUDE!r}]")
        instructions = body.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise ValueError("instructions must be a string")
        system = {"role": "system", "content": instructions} if instructions else None
        conversation = _continued(body.get("previous_response_id"), session)
        new = body.get("input")
        if not (conversation and new == []):  # a continued response may add no item
            conversation += _messages(new, ignored)
        parallel = body.get("parallel_tool_calls")
        picked = {k: body.get(k) for k in ("temperature", "top_p")}
        picked["max_tokens"] = body.get("max_output_tokens")
        store = body.get("store")
        return ResponsesTurn(
            sealed=SEALED_INCLUDE in include,
            messages=[system, *conversation] if system else conversation,
            tools=tools,
            tool_choice=_tool_choice(body.get("tool_choice"), tools),
            parallel_tool_calls=parallel is None or boolean(parallel, "parallel_tool_calls"),
            sampling=request_sampling(picked, session.sampling),
            json_schema=_text_format(body.get("text")),
            logprobs=logprobs,
            top_logprobs=top,
            stream=boolean(body.get("stream"), "stream"),
            conversation=conversation,
            store=store is None or boolean(store, "store"),
            session=session,
        )

    def reply(self, answer: TurnAnswer, turn: ChatTurn) -> dict[str, Any]:
        response = self._response(answer, turn)
        if isinstance(turn, ResponsesTurn):
            _store(answer, turn, response["id"])
        return response

    def prepared(self, turn: ChatTurn) -> Iterator[tuple[str | None, Any]]:
        """A `generate: false` request over WebSocket (Codex warms a new connection with one):
        nothing is sampled or recorded; its input becomes the connection's last response, which
        the next request continues. response.created, then response.completed, output empty."""
        answer = TurnAnswer(uuid.uuid4().hex, {"role": "assistant", "content": None}, "stop")
        final = {**self._response(answer, turn), "output": []}
        connection = CONNECTION.get()
        if connection is not None and isinstance(turn, ResponsesTurn):
            connection.clear()
            connection[final["id"]] = list(turn.conversation)
        started = {**final, "status": "in_progress", "usage": None, "completed_at": None}
        yield (
            "response.created",
            {"type": "response.created", "sequence_number": 0, "response": started},
        )
        yield (
            "response.completed",
            {"type": "response.completed", "sequence_number": 1, "response": final},
        )

    def events(self, answer: TurnAnswer, turn: ChatTurn) -> Iterator[tuple[str | None, Any]]:
        """response.created and .in_progress, each output item added, its content streamed
        (one delta each) and done, then response.completed or .incomplete."""
        final = self.reply(answer, turn)
        started = {**final, "status": "in_progress", "output": [], "usage": None}
        started["incomplete_details"] = started["completed_at"] = None
        seq = 0

        def event(kind: str, **data: Any) -> tuple[str, dict[str, Any]]:
            nonlocal seq
            seq += 1
            return kind, {"type": kind, "sequence_number": seq - 1, **data}

        yield event("response.created", response=started)
        yield event("response.in_progress", response=started)
        for index, item in enumerate(final["output"]):
            call = item["type"] == "function_call"
            at = {"item_id": item["id"], "output_index": index}
            empty = {"arguments": ""} if call else {"content": []}
            added = {**item, **empty, "status": "in_progress"}
            yield event("response.output_item.added", output_index=index, item=added)
            if call:
                yield event("response.function_call_arguments.delta", delta=item["arguments"], **at)
                done = {"arguments": item["arguments"], "name": item["name"]}
                yield event("response.function_call_arguments.done", **done, **at)
            else:
                for content_index, part in enumerate(item["content"]):
                    yield from _part_events(event, part, {**at, "content_index": content_index})
            yield event("response.output_item.done", output_index=index, item=item)
        yield event(f"response.{final['status']}", response=final)

    def _response(self, answer: TurnAnswer, turn: ChatTurn) -> dict[str, Any]:
        body = turn.body
        incomplete = answer.finish_reason == "length"
        now = int(time.time())
        fmt = (body.get("text") or {}).get("format") or {"type": "text"}
        prompt, completion = answer.prompt_tokens, answer.completion_tokens
        choice = turn.tool_choice
        named = {"type": "function", "name": choice.name}
        return {
            "id": f"resp_{answer.id}",
            "object": "response",
            "created_at": now,
            "completed_at": now,
            "status": "incomplete" if incomplete else "completed",
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "instructions": body.get("instructions"),
            "model": turn.model,
            "output": _output(answer, isinstance(turn, ResponsesTurn) and turn.sealed),
            "parallel_tool_calls": turn.parallel_tool_calls,
            "previous_response_id": body.get("previous_response_id"),
            "temperature": turn.sampling.get("temperature"),
            "top_p": turn.sampling.get("top_p"),
            "max_output_tokens": turn.sampling.get("max_tokens"),
            "tool_choice": named if choice.name else choice.mode,
            "tools": body.get("tools") or [],
            "text": {"format": fmt, "verbosity": "medium"},
            "top_logprobs": turn.top_logprobs,
            "truncation": "disabled",
            "background": False,
            "store": isinstance(turn, ResponsesTurn) and turn.store,
            "reasoning": {"effort": None, "summary": None},
            "service_tier": "default",
            "metadata": body.get("metadata") or {},
            "user": body.get("user"),
            "usage": {
                "input_tokens": prompt,
                "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                "output_tokens": completion,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": prompt + completion,
            },
        }


# -- the request ----------------------------------------------------------------------------------


def _continued(previous: Any, session: Session) -> list[dict[str, Any]]:
    """The stored conversation `previous_response_id` continues (a 400 if the session does not
    hold it), or none."""
    if previous is None:
        return []
    connection = CONNECTION.get()
    earlier = None
    if isinstance(previous, str):
        earlier = (connection or {}).get(previous) or session.responses.get(previous)
    if earlier is None:
        raise ValueError(
            f"previous_response_id {str(previous)[:80]!r} is not a stored response of this "
            f"session (it keeps its last {MAX_STORED_RESPONSES} responses made with store)"
        )
    return list(earlier)


def _check_modes(body: Mapping[str, Any], ignored: Ignored) -> None:
    """The fields that are honoured or ignored in one setting (the gateway's) and refused in the
    others."""
    if body.get("truncation") not in (None, "disabled"):
        raise ValueError("truncation must be 'disabled': the gateway never drops input items")
    if body.get("background") not in (None, False):
        raise ValueError("background is not supported: every turn is answered while it waits")
    reasoning = body.get("reasoning")
    if reasoning is not None and not isinstance(reasoning, Mapping):
        raise ValueError("reasoning must be an object")
    for name, value in (reasoning or {}).items():
        if value is None:
            continue
        if name == "effort":
            steering(value, "reasoning.effort", ignored)
        elif name in ("summary", "generate_summary"):
            ignored.add(f"reasoning.{name}", "how reasoning is shown: it comes back whole")
        else:
            raise ValueError(
                f"reasoning.{name} {value!r} is not supported: the policy's reasoning is not "
                "steered by the gateway, and its text comes back as is"
            )
    text = body.get("text")
    if isinstance(text, Mapping):
        steering(text.get("verbosity"), "text.verbosity", ignored)


def _text_format(text: Any) -> dict[str, Any] | None:
    if text is None:
        return None
    if not isinstance(text, Mapping):
        raise ValueError("text must be an object")
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, Mapping):
        raise ValueError("text.format must be an object")
    return json_schema_of(fmt.get("type"), fmt.get("schema"), "text.format")


def _tools(tools: Any, ignored: Ignored) -> list[dict[str, Any]] | None:
    """Responses function tools as chat tools (name, description, parameters); hosted tools
    dropped, and named (see the module docstring)."""
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise ValueError("tools must be a list")
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, Mapping) else None
        if not isinstance(kind, str):
            raise ValueError(f"tools[{i}] must be an object with a string type")
        if kind != "function":
            ignored.add(
                f"tools:{kind}", "a hosted tool: the gateway runs none, the model sees none"
            )
            continue
        if not isinstance(tool.get("name"), str):
            raise ValueError(f"tools[{i}] needs a string name")
        if tool.get("strict"):
            ignored.add("tools.strict", "tool inputs are not constrained while sampling")
        function = {"name": tool["name"]}
        for key in ("description", "parameters"):
            if tool.get(key) is not None:
                function[key] = tool[key]
        out.append({"type": "function", "function": function})
    return out or None


def _tool_choice(value: Any, tools: list[dict[str, Any]] | None) -> ToolChoice:
    mode = mode_choice(value, tools)
    if mode is not None:
        return mode
    if isinstance(value, Mapping) and value.get("type") == "function":
        return named_choice(value.get("name"), tools, "tool_choice")
    kind = value.get("type") if isinstance(value, Mapping) else value
    raise ValueError(
        f"tool_choice {kind!r} is not supported: use 'none', 'auto', 'required' or "
        "{'type': 'function', 'name': ...}"
    )


_ITEM_KEYS = {  # per item type, what the gateway reads, and the metadata it does not (id, status)
    "message": {"type", "role", "content", "id", "status"},
    "function_call": {"type", "call_id", "name", "arguments", "id", "status"},
    "function_call_output": {"type", "call_id", "output", "id", "status"},
    "reasoning": {"type", "id", "summary", "content", "encrypted_content", "status"},
}


def _messages(value: Any, ignored: Ignored) -> list[dict[str, Any]]:
    """`input` as OpenAI chat messages (see the module docstring); an item's keys the gateway
    does not read, besides its metadata, are named in the trace (`input.<key>`)."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise ValueError("input must be a string or a non-empty list of items")
    out: list[dict[str, Any]] = []
    assistant: dict[str, Any] | None = None  # the assistant message items are joining

    def open_assistant(reasoning: str | None = None) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": None}
        if reasoning:
            message["reasoning_content"] = reasoning
        out.append(message)
        return message

    for i, item in enumerate(value):
        where = f"input[{i}]"
        if type(item) is not dict and not isinstance(item, Mapping):  # JSON's: skip the ABC
            raise ValueError(f"{where} must be an object")
        kind = item.get("type")
        if kind is None and "role" in item:
            kind = "message"
        known = _ITEM_KEYS.get(kind)
        if known is not None and not known.issuperset(item):
            for key in sorted(set(item) - known):
                if item[key] is not None:
                    ignored.add(
                        f"input.{key}", "unknown to the gateway: it changes nothing rendered"
                    )
        if kind == "message":
            role = item.get("role")
            if role == "assistant":
                text = _text(item.get("content"), where, allow_refusal=True)
                if assistant is None or assistant["content"] or "tool_calls" in assistant:
                    assistant = open_assistant()
                assistant["content"] = text
                continue
            if role not in ("user", "system", "developer"):
                raise ValueError(f"{where}.role must be user, assistant, system or developer")
            out.append(
                {
                    "role": "system" if role == "developer" else role,
                    "content": _text(item.get("content"), where),
                }
            )
        elif kind == "function_call":
            call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
            if type(call_id) is not str or type(name) is not str or type(arguments) is not str:
                raise ValueError(f"{where}: a function_call needs string call_id, name, arguments")
            if assistant is None:
                assistant = open_assistant()
            function = {"name": name, "arguments": arguments}
            call = {"id": call_id, "type": "function", "function": function}
            assistant.setdefault("tool_calls", []).append(call)
            continue
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if type(call_id) is not str:
                raise ValueError(f"{where}: a function_call_output needs a string call_id")
            content = _text(item.get("output"), f"{where}.output")
            out.append({"role": "tool", "tool_call_id": call_id, "content": content})
        elif kind == "reasoning":
            assistant = open_assistant(_reasoning_text(item, where))
            continue
        elif kind == "item_reference":
            raise ValueError(
                f"{where}: item_reference is not supported: send the item itself, or "
                "previous_response_id"
            )
        else:
            raise ValueError(
                f"{where}: items of type {kind!r} are not supported: the gateway serves "
                "messages, function_call, function_call_output and reasoning items"
            )
        assistant = None
    return out


def _text(content: Any, where: str, *, allow_refusal: bool = False) -> str:
    """A message's (or a tool output's) text: a string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ValueError(f"{where}.content must be a string or a list of parts")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "refusal" and allow_refusal and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
        else:
            raise ValueError(
                f"{where}.content[{j}] of type {kind!r} is not supported: the gateway's renderer "
                "is text-only"
            )
    return "".join(texts)


def _reasoning_text(item: Mapping[str, Any], where: str) -> str:
    """A reasoning item's text: its reasoning_text content, else its summary, else the text
    its `encrypted_content` seals (what Codex sends back)."""
    for key, kind in (("content", "reasoning_text"), ("summary", "summary_text")):
        parts = item.get(key)
        if parts:
            if not isinstance(parts, list) or not all(
                isinstance(p, Mapping) and p.get("type") == kind and isinstance(p.get("text"), str)
                for p in parts
            ):
                raise ValueError(f"{where}.{key} must be a list of {kind} parts")
            return "\n\n".join(p["text"] for p in parts)
    sealed = item.get("encrypted_content")
    if sealed:
        text = unseal_reasoning(sealed)
        if text is None:
            raise ValueError(
                f"{where}: a reasoning item's encrypted_content was not sealed by this gateway"
            )
        return text
    return ""


# -- the reply ------------------------------------------------------------------------------------


def _output(answer: TurnAnswer, sealed: bool) -> list[dict[str, Any]]:
    """The answer's output items: reasoning (its text sealed too, if asked), the message, then
    one item per tool call."""
    rid = answer.id
    status = "incomplete" if answer.finish_reason == "length" else "completed"
    output: list[dict[str, Any]] = []
    if answer.reasoning:
        content = [{"type": "reasoning_text", "text": answer.reasoning}]
        item = {"id": f"rs_{rid}", "type": "reasoning", "summary": [], "content": content}
        if sealed:
            item["encrypted_content"] = seal_reasoning(answer.reasoning)
        output.append(item)
    calls = answer.tool_calls
    if answer.content or not calls:
        part = {"type": "output_text", "text": answer.content, "annotations": []}
        if answer.logprobs is not None:
            part["logprobs"] = answer.logprobs
        output.append(
            {
                "id": f"msg_{rid}",
                "type": "message",
                "role": "assistant",
                "status": status,
                "content": [part],
            }
        )
    for i, call in enumerate(calls):
        function = call["function"]
        output.append(
            {
                "id": f"fc_{rid}_{i}",
                "type": "function_call",
                "call_id": call["id"],
                "name": function["name"],
                "arguments": function["arguments"],
                "status": "completed",
            }
        )
    return output


def _store(answer: TurnAnswer, turn: ResponsesTurn, response_id: str) -> None:
    """Keep the response's conversation in its session (`store`), the newest few; and, over a
    WebSocket, as its connection's last response whatever `store` says."""
    conversation = [*turn.conversation, answer.chat_message()]
    connection = CONNECTION.get()
    if connection is not None:
        connection.clear()
        connection[response_id] = conversation
    session = turn.session
    if not turn.store or session is None:
        return
    stored = session.responses
    stored[response_id] = conversation
    while len(stored) > MAX_STORED_RESPONSES:
        del stored[next(iter(stored))]


def _part_events(event: Any, part: dict[str, Any], at: dict[str, Any]) -> Iterator[Any]:
    """A content part's events: added (empty), its text in one delta, its text done, done."""
    text = part["text"]
    if part["type"] == "reasoning_text":
        yield event("response.content_part.added", part={**part, "text": ""}, **at)
        if text:
            yield event("response.reasoning_text.delta", delta=text, **at)
        yield event("response.reasoning_text.done", text=text, **at)
    else:
        logprobs = part.get("logprobs") or []
        empty = {**part, "text": "", "logprobs": []}
        yield event("response.content_part.added", part=empty, **at)
        if text:
            yield event("response.output_text.delta", delta=text, logprobs=logprobs, **at)
        yield event("response.output_text.done", text=text, logprobs=logprobs, **at)
    yield event("response.content_part.done", part=part, **at)
