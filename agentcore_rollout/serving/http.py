"""Request and response helpers shared by the project's aiohttp servers (the policy server
and the gateway): the same JSON-object bodies, flags and OpenAI-style SSE streams."""

from __future__ import annotations

import itertools
import json
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]  # what a middleware wraps


async def read_json_object(
    request: web.Request, loads: Callable[[bytes], Any] = json.loads
) -> dict[str, Any]:
    """The request body as a JSON object; ValueError (a 400 to the servers) otherwise. `loads`
    must raise ValueError on bad JSON (the gateway passes orjson's)."""
    return json_object(await request.read(), loads)


def json_object(raw: bytes, loads: Callable[[bytes], Any] = json.loads) -> dict[str, Any]:
    """`raw` parsed as a JSON object; ValueError (a 400 to the servers) otherwise."""
    try:
        body = loads(raw)
    except ValueError as exc:
        raise ValueError(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ValueError("request body must be a JSON object")
    return body


def boolean(value: Any, name: str) -> bool:
    """A boolean request field (absent: false); anything else is a ValueError (a 400)."""
    if value is None or isinstance(value, bool):
        return bool(value)
    raise ValueError(f"{name} must be a boolean")


def dumps(data: Any) -> str:
    """Compact JSON; NaN and infinities are refused (they are not JSON)."""
    return json.dumps(data, separators=(",", ":"), allow_nan=False)


def openai_usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}
    return usage | {"total_tokens": prompt_tokens + completion_tokens}


def chat_chunks(
    head: Mapping[str, Any],
    deltas: Iterable[tuple[dict[str, Any], Any]],
    finish: Mapping[str, Any],
    usage: Mapping[str, int],
    options: Any,
) -> Iterator[dict[str, Any]]:
    """A finished chat completion as OpenAI streams it: `head` (id, created, model) on every
    chunk; the role, each `(delta, logprobs)`, the `finish` fields, then `usage` if
    `options` (the request's `stream_options`) asks for it."""
    head = {**head, "object": "chat.completion.chunk"}

    def chunk(delta: dict[str, Any], logprobs: Any = None, **end: Any) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": None}
        return {**head, "choices": [{**choice, **end}]}

    yield chunk({"role": "assistant", "content": ""})
    for delta, logprobs in deltas:
        yield chunk(delta, logprobs)
    yield chunk({}, **finish)
    if isinstance(options, Mapping) and options.get("include_usage"):
        yield {**head, "choices": [], "usage": usage}


async def sse_response(
    request: web.Request, events: Iterable[dict[str, Any]]
) -> web.StreamResponse:
    """Stream `events` as `data:` lines, closed by `data: [DONE]`, as OpenAI streams are."""
    return await sse_events(request, ((None, e) for e in itertools.chain(events, ["[DONE]"])))


async def sse_events(
    request: web.Request,
    events: Iterable[tuple[str | None, Any]],
    encode: Callable[[Any], bytes] = lambda data: dumps(data).encode(),
) -> web.StreamResponse:
    """Stream `(name, data)` events: an `event:` line when named (Anthropic's and the Responses
    API's streams), then `data:`, JSON by `encode` unless it is a string (OpenAI's closing
    `[DONE]`). Every event is encoded before the headers are sent, so a reply that cannot be
    encoded is an error response, never a stream cut short without its terminal event."""
    chunks = []
    for name, data in events:
        head = f"event: {name}\n" if name else ""
        line = data.encode() if isinstance(data, str) else encode(data)
        chunks.append(b"%sdata: %s\n\n" % (head.encode(), line))
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    await response.write(b"".join(chunks))
    await response.write_eof()
    return response


async def sent(request: web.Request, response: web.Response) -> web.Response:
    """`response`, written before the handler returns rather than after: a client that went
    away is then a ConnectionResetError the handler sees (and can say the reply was lost)."""
    await response.prepare(request)
    await response.write_eof()
    return response
