"""A plain bedrock-agentcore agent (no RolloutApp): answers at once with what it was given and
what the SDK's context saw, or streams events (payload `stream`), holding after the first until
released by another invocation on its session (`release`), so a test can tell a stream that
is passed through from one that is buffered."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from bedrock_agentcore.runtime import BedrockAgentCoreApp, RequestContext

from . import gate

app = BedrockAgentCoreApp()


@app.entrypoint
async def invoke(payload: dict[str, Any], context: RequestContext) -> Any:
    if "release" in payload:
        gate.release(payload["release"])
        return {"released": payload["release"]}
    if "sleep" in payload:
        await asyncio.sleep(payload["sleep"])
    if "stream" in payload:
        return _stream(payload["stream"], int(payload.get("events", 4)))
    return {
        "echo": payload,
        "session_id": context.session_id,
        "request_headers": dict(context.request_headers or {}),
    }


async def _stream(tag: str, events: int) -> AsyncIterator[dict[str, Any]]:
    yield {"event": 1}
    if not await gate.wait(tag, timeout=60):
        yield {"error": "never released"}
        return
    for i in range(2, events + 1):
        yield {"event": i}
