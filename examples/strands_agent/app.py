"""Example agent on Strands Agents, wrapped as a RolloutApp.

The agent is built as in any Strands program: a model, a tool, a system prompt. The only change
for training is where its model points: at the policy this rollout was given (`ctx.llm`: the
token-capture gateway's base URL, this session's key, the model name), through Strands' OpenAI
provider. Nothing else in the agent knows it is being trained.

It answers "What is a + b?" and may call `add`. Reward: 1 if the first integer of its final
answer is right, else 0. A turn cut at `max_tokens` is a wrong answer, not a crash: Strands
raises MaxTokensReachedException for it, and the rollout still ends with reward 0, which is
what the policy should learn from.

Run on the local stack: `agentcore-rollout run --config configs/strands_agent.yaml`.
"""

from __future__ import annotations

import re
from typing import Any

from strands import Agent, tool
from strands.models.openai import OpenAIModel
from strands.types.exceptions import MaxTokensReachedException

from agentcore_rollout.agent import RolloutApp, RolloutContext, RolloutOutput
from agentcore_rollout.contract import NamedRewards

SYSTEM = "Use the add tool, then answer with a single integer."
_NUMBER = re.compile(r"-?\d+")

app = RolloutApp()


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def grade(text: str, answer: int) -> bool:
    """The first integer in the reply must equal the answer."""
    match = _NUMBER.search(text)
    return match is not None and int(match.group()) == answer


@app.rollout_entrypoint
async def rollout(payload: dict[str, Any], ctx: RolloutContext) -> RolloutOutput:
    if ctx.llm is None:
        raise ValueError("this agent needs _rollout.llm (the policy endpoint)")
    model = OpenAIModel(
        client_args={"base_url": ctx.llm.base_url, "api_key": ctx.llm.api_key},
        model_id=ctx.llm.model,
        params={"max_tokens": 64, **ctx.llm.sampling},
    )
    agent = Agent(model=model, tools=[add], system_prompt=SYSTEM, callback_handler=None)
    try:
        text, stop = str(await agent.invoke_async(payload["question"])), "answered"
    except MaxTokensReachedException:
        text, stop = "", "max_tokens"
    correct = grade(text, int(payload["answer"]))
    tool_calls = sum(
        "toolUse" in block for message in agent.messages for block in message["content"]
    )
    return RolloutOutput(
        rewards=NamedRewards(
            components={"reward": float(correct), "tool_calls": float(tool_calls)},
            scalar="reward",
        ),
        trajectory={"messages": agent.messages},
        metrics={"correct": float(correct), "tool_calls": float(tool_calls)},
        stop_reason=stop,
    )
