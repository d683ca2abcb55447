"""Example agent: solves small arithmetic questions in a multi-turn loop.

The model answers; the environment checks the number and, if it is wrong, says so and asks
again, up to `max_turns` turns. Reward: 1 for a correct answer, minus `turn_penalty` per
extra turn; 0 if never correct; plus `format_weight` (default 0) times the `format` component,
the fraction of its replies that lead with an integer as the system prompt asks (a shaping
reward a small model can learn before it can add: `configs/train-smollm2.yaml`). The policy is
whatever `_rollout.llm` points at (the gateway, SGLang, vLLM, or the small local policy),
called through the OpenAI client.

Serve it as an AgentCore container with `python -m agentcore_rollout.agent.serve
examples.math_agent.app:app --host 0.0.0.0 --port 8080` (see the Dockerfile).
"""

from __future__ import annotations

import re
from typing import Any

from openai import AsyncOpenAI

from agentcore_rollout.agent import RolloutApp, RolloutContext, RolloutOutput
from agentcore_rollout.contract import NamedRewards

SYSTEM = "Answer with a single integer."
_NUMBER = re.compile(r"-?\d+")

app = RolloutApp()


def grade(text: str, answer: int) -> bool:
    """The first integer in the reply must equal the answer."""
    match = _NUMBER.search(text)
    return match is not None and int(match.group()) == answer


def leads_with_number(text: str) -> bool:
    """The reply starts with an integer, as the system prompt asks (what `format` counts)."""
    return _NUMBER.match(text.lstrip()) is not None


def reward_for(correct: bool, turns: int, turn_penalty: float) -> float:
    return max(0.0, 1.0 - turn_penalty * (turns - 1)) if correct else 0.0


@app.rollout_entrypoint
async def rollout(payload: dict[str, Any], ctx: RolloutContext) -> RolloutOutput:
    if ctx.llm is None:
        raise ValueError("this agent needs _rollout.llm (the policy endpoint)")
    question, answer = payload["question"], int(payload["answer"])
    max_turns = int(payload.get("max_turns", 3))
    turn_penalty = float(payload.get("turn_penalty", 0.25))
    format_weight = float(payload.get("format_weight", 0.0))
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": question},
    ]
    sampling = {"temperature": 1.0, "max_tokens": 16, **ctx.llm.sampling}
    correct, turns, formatted = False, 0, 0
    async with AsyncOpenAI(  # its trace headers join its turns to the rollout's trace
        base_url=ctx.llm.base_url,
        api_key=ctx.llm.api_key,
        max_retries=2,
        default_headers=ctx.trace_headers(),
    ) as client:
        while turns < max_turns and not correct:
            turns += 1
            reply = await client.chat.completions.create(
                model=ctx.llm.model, messages=messages, **sampling
            )
            text = reply.choices[0].message.content or ""
            messages.append({"role": "assistant", "content": text})
            formatted += leads_with_number(text)
            correct = grade(text, answer)
            if not correct and turns < max_turns:
                messages.append({"role": "user", "content": f"Incorrect. Try again: {question}"})
    format_score = formatted / turns
    reward = reward_for(correct, turns, turn_penalty) + format_weight * format_score
    return RolloutOutput(
        rewards=NamedRewards(
            components={
                "reward": reward,
                "correct": float(correct),
                "turns": float(turns),
                "format": format_score,
            },
            scalar="reward",
        ),
        trajectory={"messages": messages},
        metrics={"turns": float(turns), "correct": float(correct), "format": format_score},
        stop_reason="solved" if correct else "max_turns",
    )
