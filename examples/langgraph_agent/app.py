"""Example agent on LangGraph, wrapped as a RolloutApp.

The agent is built as in any LangGraph program: `create_react_agent` over a `ChatOpenAI` model
and a tool. The only change for training is where the model points: at the policy this rollout
was given (`ctx.llm`: the token-capture gateway's base URL, this session's key, the model name).
Nothing else in the agent knows it is being trained.

It answers "What is a + b?" and may call `add`. Reward: 1 if the first integer of its final
answer is right, else 0. A turn cut at `max_tokens` comes back as a (wrong) answer, and a
policy that keeps calling tools is stopped by LangGraph's recursion limit; either way the
rollout ends with a reward, which is what the policy should learn from.

Run on the local stack: `agentcore-rollout run --config configs/langgraph_agent.yaml`.
"""

from __future__ import annotations

import re
from typing import Any

from langchain_core.messages import messages_to_dict
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError
from langgraph.prebuilt import create_react_agent

from agentcore_rollout.agent import RolloutApp, RolloutContext, RolloutOutput
from agentcore_rollout.contract import NamedRewards

SYSTEM = "Use the add tool, then answer with a single integer."
MAX_STEPS = 8  # LangGraph's recursion limit: model and tool steps together
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
    model = ChatOpenAI(
        base_url=ctx.llm.base_url,
        api_key=ctx.llm.api_key,
        model=ctx.llm.model,
        default_headers=ctx.trace_headers(),  # its turns join the rollout's trace
        **{"max_tokens": 64, **ctx.llm.sampling},
    )
    agent = create_react_agent(model, [add], prompt=SYSTEM)
    question = {"messages": [("user", payload["question"])]}
    try:
        messages = (await agent.ainvoke(question, {"recursion_limit": MAX_STEPS}))["messages"]
        text, stop = messages[-1].text, "answered"
    except GraphRecursionError:
        messages, text, stop = [], "", "max_steps"
    correct = grade(text, int(payload["answer"]))
    tool_calls = sum(len(getattr(m, "tool_calls", None) or []) for m in messages)
    return RolloutOutput(
        rewards=NamedRewards(
            components={"reward": float(correct), "tool_calls": float(tool_calls)},
            scalar="reward",
        ),
        trajectory={"messages": messages_to_dict(messages)},
        metrics={"correct": float(correct), "tool_calls": float(tool_calls)},
        stop_reason=stop,
    )
