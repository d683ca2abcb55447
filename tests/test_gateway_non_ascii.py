"""A tool call whose arguments hold text outside ASCII, through each API the gateway speaks: the
client sends the model's call back, and the next prompt holds it as the model wrote it (not
`\\u2192`-escaped), so the two turns stay one exact sample."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any

import anthropic
import openai
import pytest

from agentcore_rollout.gateway import Gateway, GatewayAdmin, SGLangBackend

from .gateway_support import ScriptedWorker, hf_renderer
from .test_gateway import check_sample_against_records

pytestmark = pytest.mark.component

COMMAND = 'echo "2+3 → 5 ✓ naïve"'
CALL = '<tool_call>{"name": "shell", "arguments": {"command": "' + COMMAND.replace('"', '\\"')
CALL += '"}}</tool_call>'
ANSWER = "Done: 5."
_SHELL = {
    "name": "shell",
    "description": "Run a shell command.",
    "parameters": {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
}


def ids(text: str) -> list[int]:
    tok = hf_renderer().tokenizer
    return [*tok.encode(text, add_special_tokens=False), tok.eos_token_id]


@asynccontextmanager
async def stack() -> Any:
    async with ScriptedWorker([ids(CALL), ids(ANSWER)]) as worker:
        gateway = Gateway(SGLangBackend(worker.url), hf_renderer(), model_name="policy")
        async with gateway, GatewayAdmin(gateway.admin_url, gateway.admin_token) as admin:
            session = await admin.create_session("non-ascii")
            yield worker, gateway, admin, session


async def _chat(url: str, key: str) -> str:
    tools = [{"type": "function", "function": _SHELL}]
    async with openai.AsyncOpenAI(base_url=url, api_key=key) as client:
        messages: list[Any] = [{"role": "user", "content": "Check the sum."}]
        first = await client.chat.completions.create(model="policy", messages=messages, tools=tools)
        (call,) = first.choices[0].message.tool_calls or []
        messages.append(first.choices[0].message.model_dump(exclude_none=True))
        messages.append({"role": "tool", "tool_call_id": call.id, "content": "2+3 → 5 ✓"})
        second = await client.chat.completions.create(
            model="policy", messages=messages, tools=tools
        )
        return second.choices[0].message.content or ""


async def _responses(url: str, key: str) -> str:
    tools = [{"type": "function", **_SHELL}]
    async with openai.AsyncOpenAI(base_url=url, api_key=key) as client:
        items: list[Any] = [{"role": "user", "content": "Check the sum."}]
        first = await client.responses.create(model="policy", input=items, tools=tools)
        call = first.output[0]
        assert call.type == "function_call"
        items += [item.model_dump(exclude_none=True) for item in first.output]
        items.append({"type": "function_call_output", "call_id": call.call_id, "output": "✓"})
        second = await client.responses.create(model="policy", input=items, tools=tools)
        return second.output_text


async def _messages(url: str, key: str) -> str:
    tools = [
        {
            "name": "shell",
            "description": _SHELL["description"],
            "input_schema": _SHELL["parameters"],
        }
    ]
    async with anthropic.AsyncAnthropic(base_url=url, api_key=key) as client:
        messages: list[Any] = [{"role": "user", "content": "Check the sum."}]
        first = await client.messages.create(
            model="policy", max_tokens=128, messages=messages, tools=tools
        )
        (use,) = first.content
        assert use.type == "tool_use"
        messages.append({"role": "assistant", "content": [b.model_dump() for b in first.content]})
        result = {"type": "tool_result", "tool_use_id": use.id, "content": "✓"}
        messages.append({"role": "user", "content": [result]})
        second = await client.messages.create(
            model="policy", max_tokens=128, messages=messages, tools=tools
        )
        return second.content[0].text  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("api", "base"),
    [(_chat, "/v1"), (_responses, "/v1"), (_messages, "")],
    ids=lambda x: getattr(x, "__name__", x),
)
async def test_a_non_ascii_argument_is_sent_back_as_the_model_wrote_it(api, base) -> None:
    async with stack() as (worker, gateway, admin, session):
        assert await api(f"{gateway.url}{base}", session.api_key) == ANSWER
        trace = await admin.finish_session(session.session_id)
    (sample,) = trace["samples"]  # the second prompt extends the first turn's sampled ids
    assert sample["turns"] == [0, 1]
    check_sample_against_records(sample, {c["rid"]: c for c in worker.calls}, trace["turns"])
    second_prompt = hf_renderer().tokenizer.decode(worker.calls[1]["input_ids"])
    assert COMMAND.replace('"', '\\"') in second_prompt and "\\u2192" not in second_prompt
