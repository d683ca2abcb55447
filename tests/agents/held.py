"""A test agent that calls the policy once, then holds for `payload["hold"]` seconds before it
reports: it stays running while a test moves the trainer on. Its reward is its sample index
modulo 2, so the members of a group differ; the members listed in `payload["fail"]` raise."""

from __future__ import annotations

import asyncio
from typing import Any

from openai import AsyncOpenAI

from agentcore_rollout.agent import RolloutApp, RolloutContext, RolloutOutput

app = RolloutApp()


@app.rollout_entrypoint
async def rollout(payload: dict[str, Any], ctx: RolloutContext) -> RolloutOutput:
    assert ctx.llm is not None
    llm, headers = ctx.llm, ctx.trace_headers()  # the headers join its turns to its trace
    async with AsyncOpenAI(
        base_url=llm.base_url, api_key=llm.api_key, default_headers=headers
    ) as client:
        await client.chat.completions.create(
            model=ctx.llm.model,
            messages=[{"role": "user", "content": payload["question"]}],
            temperature=1.0,
            max_tokens=8,
        )
    await asyncio.sleep(payload.get("hold", 0))
    if ctx.sample_index in payload.get("fail", []):
        raise RuntimeError(f"member {ctx.sample_index} fails, as asked")
    return RolloutOutput(rewards=float(ctx.sample_index % 2))
