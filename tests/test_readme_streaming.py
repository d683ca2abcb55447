"""The docs' streaming example (docs/local-stack.md), its reading loop taken from the page as
written, against the emulator: a streaming agent's first event reaches the reader before the
agent has produced its last one (botocore's default `iter_lines()` holds it until 1 KiB has
come)."""

from __future__ import annotations

import ast
import asyncio
import json
import re
import threading
import uuid
from types import CodeType

import boto3
import pytest

from .agents import gate
from .conftest import REGION, ROOT, RUNTIME_ARN

pytestmark = pytest.mark.component

GUARD = 30.0  # against a hang, never a timing assertion
PAGE = "docs/local-stack.md"  # "Run your own AgentCore agent locally"


def _readme_reading_loop() -> CodeType:
    """The iterable of the page's `for line in ...` over an InvokeAgentRuntime response."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / PAGE).read_text(), re.S)
    block = next(b for b in blocks if "invoke_agent_runtime(" in b)
    loop = next(
        node
        for node in ast.walk(ast.parse(block))
        if isinstance(node, ast.For)
        and "resp" in {n.id for n in ast.walk(node.iter) if isinstance(n, ast.Name)}
    )
    return compile(ast.Expression(loop.iter), PAGE, "eval")


async def test_the_readme_streaming_example_reads_events_as_they_arrive(emulator):
    lines_of = _readme_reading_loop()
    emu = await emulator(app="tests.agents.streaming:app")
    client = boto3.client("bedrock-agentcore", region_name=REGION, endpoint_url=emu.url)
    tag, events = uuid.uuid4().hex, 4
    seen: list[bytes] = []
    first = threading.Event()

    def read() -> None:  # the page's code; boto3 blocks, so in a thread
        resp = client.invoke_agent_runtime(
            agentRuntimeArn=RUNTIME_ARN,
            runtimeSessionId=f"readme-{uuid.uuid4().hex}",
            payload=json.dumps({"stream": tag, "events": events}).encode(),
        )
        for line in eval(lines_of, {"resp": resp}):  # the page's own expression
            if line.strip():
                seen.append(line)
                first.set()

    reader = asyncio.create_task(asyncio.to_thread(read))
    early = await asyncio.to_thread(first.wait, GUARD)
    gate.release(tag)  # only now does the agent produce events 2 to 4
    await asyncio.wait_for(reader, GUARD)
    assert early, "event 1 reached the reader only after the agent was released: buffered"
    assert [json.loads(line.removeprefix(b"data: ")) for line in seen] == [
        {"event": i} for i in range(1, events + 1)
    ]
