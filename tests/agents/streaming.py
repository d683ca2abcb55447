"""A streaming bedrock-agentcore agent written the synchronous way: the entrypoint returns a
plain generator, which the SDK iterates in a thread and sends as server-sent events. Event 1
comes at once; the rest wait for `{"release": tag}` on the same session."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from bedrock_agentcore.runtime import BedrockAgentCoreApp

from . import gate

app = BedrockAgentCoreApp()


@app.entrypoint
def invoke(payload: dict[str, Any]) -> Any:
    if "release" in payload:
        gate.release(payload["release"])
        return {"released": payload["release"]}
    return _events(payload["stream"], int(payload.get("events", 4)))


def _events(tag: str, events: int) -> Iterator[dict[str, Any]]:
    yield {"event": 1}
    if not gate.wait_blocking(tag, timeout=60):
        yield {"error": "never released"}
        return
    for i in range(2, events + 1):
        yield {"event": i}
