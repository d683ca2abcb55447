"""A raw ASGI agent, no framework: the AgentCore container contract by hand. `/invocations`
answers with every header it received, as sent, and the body; `{"stream": tag}` streams
server-sent events held after the first until `{"release": tag}` arrives on the session."""

from __future__ import annotations

import json
import time
from typing import Any

from . import gate

Scope = dict[str, Any]


async def app(scope: Scope, receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if scope["method"] == "GET" and scope["path"] == "/ping":
        await _reply(send, 200, {"status": "Healthy", "time_of_last_update": int(time.time())})
    elif scope["method"] == "POST" and scope["path"] == "/invocations":
        await _invocation(scope, body, send)
    else:
        await _reply(send, 404, {"error": "not found"})


async def _invocation(scope: Scope, body: bytes, send: Any) -> None:
    headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
    try:
        payload = json.loads(body)
    except ValueError:
        payload = None
    if isinstance(payload, dict) and "release" in payload:
        gate.release(payload["release"])
        await _reply(send, 200, {"released": payload["release"]})
    elif isinstance(payload, dict) and "stream" in payload:
        await _stream(send, payload["stream"], int(payload.get("events", 4)))
    elif isinstance(payload, dict) and "status" in payload:
        await _reply(send, int(payload["status"]), {"error": "as asked"})
    else:
        await _reply(send, 200, {"headers": headers, "body": body.decode("utf-8", "replace")})


async def _stream(send: Any, tag: str, events: int) -> None:
    start = {"type": "http.response.start", "status": 200}
    await send({**start, "headers": [(b"content-type", b"text/event-stream")]})
    chunk = {"type": "http.response.body", "more_body": True}
    await send({**chunk, "body": b'data: {"event": 1}\n\n'})
    released = await gate.wait(tag, timeout=60)
    for i in range(2, events + 1) if released else ():
        await send({**chunk, "body": f'data: {{"event": {i}}}\n\n'.encode()})
    await send({"type": "http.response.body", "body": b""})


async def _reply(send: Any, status: int, data: Any) -> None:
    body = json.dumps(data).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
