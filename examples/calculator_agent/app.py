"""Example agent with a tool: answers arithmetic questions with a calculator, over several turns.

Each turn the model either calls `calculator` (the agent evaluates the expression and sends the
result back as a tool message) or answers; the last integer of the answer is graded. Reward: 1
for a correct answer, 0 otherwise; the metrics count the tool calls. The policy is whatever
`_rollout.llm` points at, called through the OpenAI client with `tools`, so the gateway renders
the tool into the chat template and parses the model's tool calls back out of its tokens.

The conversation opens with a one-shot example as turns: a question and the assistant's call for
it. A small model follows turns more than instructions: SmolLM2-135M-Instruct (the local stack's
real model) wrote a Hermes tool call for 5 of 6 questions (greedy) with this example, and for
none with the example described in the system prompt, or with the example's call answered and
followed by an answer (it then copied the answer's style).

Serve it as an AgentCore container like the math agent (`python -m agentcore_rollout.agent.serve
examples.calculator_agent.app:app`).
"""

from __future__ import annotations

import ast
import json
import operator
import re
from collections.abc import Callable
from typing import Any

from openai import AsyncOpenAI

from agentcore_rollout.agent import RolloutApp, RolloutContext, RolloutOutput
from agentcore_rollout.contract import NamedRewards

SYSTEM = (
    "You are a math assistant. You use the calculator tool for every arithmetic question, "
    "then answer with the number."
)
CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression and return the result.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
ONE_SHOT: list[dict[str, Any]] = [  # how a call looks, as turns (see the module's docstring)
    {"role": "user", "content": "What is 12 * 7?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_example",
                "type": "function",
                "function": {"name": "calculator", "arguments": '{"expression": "12 * 7"}'},
            }
        ],
    },
]
_OPERATORS: dict[type, Callable[..., Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
_INTEGER = re.compile(r"-?\d+")

app = RolloutApp()


def calculate(expression: str) -> str:
    """The calculator: + - * / // % and parentheses on numbers, nothing else (no names, no
    calls, no powers: a model's expression is untrusted). Errors are the tool's answer."""

    def value(node: ast.AST) -> Any:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.operand))
        raise ValueError(f"unsupported: {ast.unparse(node)[:40]}")

    try:
        result = value(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, TypeError) as exc:
        return f"error: {exc}"
    return str(int(result)) if isinstance(result, float) and result.is_integer() else str(result)


def call_tool(name: str, arguments: str) -> str:
    """One tool call's result, as the tool message's content (a bad call is told so)."""
    if name != "calculator":
        return f"error: no tool named {name!r}"
    try:
        args = json.loads(arguments)
        return calculate(str(args["expression"]))
    except (ValueError, KeyError, TypeError):
        return 'error: arguments must be {"expression": "..."}'


def grade(text: str, answer: int) -> bool:
    """The last integer of the answer must equal the answer ("23 * 47 = 1081" is right)."""
    numbers = _INTEGER.findall(text)
    return bool(numbers) and int(numbers[-1]) == answer


@app.rollout_entrypoint
async def rollout(payload: dict[str, Any], ctx: RolloutContext) -> RolloutOutput:
    if ctx.llm is None:
        raise ValueError("this agent needs _rollout.llm (the policy endpoint)")
    question, answer = payload["question"], int(payload["answer"])
    max_turns = int(payload.get("max_turns", 3))
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        *ONE_SHOT,
        {"role": "user", "content": question},
    ]
    sampling = {"temperature": 1.0, "max_tokens": 64, **ctx.llm.sampling}
    text, turns, calls = "", 0, 0
    async with AsyncOpenAI(  # its trace headers join its turns to the rollout's trace
        base_url=ctx.llm.base_url,
        api_key=ctx.llm.api_key,
        max_retries=2,
        default_headers=ctx.trace_headers(),
    ) as client:
        while turns < max_turns:
            turns += 1
            reply = await client.chat.completions.create(
                model=ctx.llm.model, messages=messages, tools=[CALCULATOR], **sampling
            )
            message = reply.choices[0].message
            text = message.content or ""
            if not message.tool_calls:
                messages.append({"role": "assistant", "content": text})
                break
            messages.append(message.model_dump(include={"role", "content", "tool_calls"}))
            for call in message.tool_calls:
                calls += 1
                result = call_tool(call.function.name, call.function.arguments)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
            text = ""  # a turn that only called tools answers nothing
    correct = grade(text, answer)
    return RolloutOutput(
        rewards=NamedRewards(
            components={"reward": float(correct), "tool_calls": float(calls)}, scalar="reward"
        ),
        trajectory={"messages": messages},
        metrics={"turns": float(turns), "tool_calls": float(calls), "correct": float(correct)},
        stop_reason="answered" if text else "max_turns",
    )
