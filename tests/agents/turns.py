"""A test agent of `payload["turns"]` turns of up to `payload["max_tokens"]` tokens each: with
the endless toy (its end of turn all but impossible) and `local.token_delay`, each turn is in
flight for about max_tokens x token_delay seconds. Its reward is its sample index modulo 2, so
a group's members differ."""

from __future__ import annotations

from typing import Any

from openai import AsyncOpenAI

from agentcore_rollout.agent import RolloutApp, RolloutContext, RolloutOutput

app = RolloutApp()


@app.rollout_entrypoint
async def rollout(payload: dict[str, Any], ctx: RolloutContext) -> RolloutOutput:
    assert ctx.llm is not None
    messages: list[dict[str, Any]] = [{"role": "user", "content": payload["question"]}]
    llm, headers = ctx.llm, ctx.trace_headers()  # the headers join its turns to its trace
    async with AsyncOpenAI(
        base_url=llm.base_url, api_key=llm.api_key, default_headers=headers
    ) as client:
        for _ in range(int(payload.get("turns", 2))):
            reply = await client.chat.completions.create(
                model=ctx.llm.model,
                messages=messages,
                temperature=1.0,
                max_tokens=int(payload["max_tokens"]),
            )
            text = reply.choices[0].message.content or ""
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "1?"}]
    return RolloutOutput(rewards=float(ctx.sample_index % 2))
