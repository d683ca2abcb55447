"""The field policy real clients meet (`gateway.turns`): a field that changes nothing sampled is
accepted and named in the turn's trace and the gateway's counter; a field whose meaning the
gateway can carry out is honoured (thinking cleared, a deferred tool left out, reasoning sealed
and sent back); a strict gateway refuses the ignored ones.

The captured bodies in tests/fixtures/clients are what each released client sent on its second
request (the model's tool call and its result sent back), every field as sent, ids zeroed."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import openai
import pytest

from agentcore_rollout.gateway import Gateway, GatewayAdmin, SGLangBackend
from agentcore_rollout.gateway.render import HFRenderer

from .gateway_support import ScriptedWorker, hf_renderer
from .smollm2 import family_renderer
from .test_gateway import check_sample_against_records

pytestmark = pytest.mark.component

CLIENTS = Path(__file__).resolve().parent / "fixtures" / "clients"
# What the gateway ignores of each client's request; everything else it honours.
IGNORED = {
    "claude-code-2.1.197": {"metadata", "context_management", "output_config.effort"},
    "claude-agent-sdk-0.2.189": {
        "metadata",
        "context_management",
        "output_config.effort",
        "thinking.display",
    },
    "codex-0.171.0": {
        "client_metadata",
        "prompt_cache_key",
        "reasoning.summary",
        "tools:namespace",
        "tools:web_search",
    },
    "mini-swe-agent-2.4.6": set(),
    "openhands-sdk-1.58.2": {"prompt_cache_key", "reasoning_effort=high"},
}
THOUGHT = "Two numbers: add them."
QWEN3_CALL = (
    f"<think>\n{THOUGHT}\n</think>\n\nOn it.\n<tool_call>\n"
    '{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
)
ADD_SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
}
ADD_ANTHROPIC = {"name": "add", "description": "Add two integers.", "input_schema": ADD_SCHEMA}


def ids(renderer: HFRenderer, text: str) -> list[int]:
    tok = renderer.tokenizer
    return [*tok.encode(text, add_special_tokens=False), tok.eos_token_id]


@asynccontextmanager
async def stack(
    scripts: list[list[int]], renderer: HFRenderer | None = None, **gateway: Any
) -> AsyncIterator[tuple[ScriptedWorker, Gateway, Any, Any]]:
    async with ScriptedWorker(scripts) as worker:
        gw = Gateway(SGLangBackend(worker.url), renderer or hf_renderer(), **gateway)
        async with gw, GatewayAdmin(gw.admin_url, gw.admin_token) as admin:
            session = await admin.create_session("fields")
            yield worker, gw, admin, session


async def _post(url: str, key: str, body: dict[str, Any]) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {key}", "x-api-key": key}
    async with aiohttp.ClientSession() as http, http.post(url, json=body, headers=headers) as r:
        return r.status, await r.text()


@pytest.mark.parametrize("client", sorted(IGNORED))
async def test_a_request_a_released_client_sent_is_answered_and_its_ignored_fields_named(
    client: str,
) -> None:
    captured = json.loads((CLIENTS / f"{client}.json").read_text())
    async with stack([ids(hf_renderer(), "Done.")]) as (_, gw, admin, session):
        status, text = await _post(f"{gw.url}{captured['path']}", session.api_key, captured["body"])
        stats = await admin.stats()
        trace = await admin.finish_session(session.session_id)
    assert status == 200, text[:500]
    assert "Done." in text  # streamed or not, the answer is in the reply
    (turn,) = trace["turns"]
    assert set(turn["ignored"]) == IGNORED[client]
    assert stats["ignored_fields"] == dict.fromkeys(IGNORED[client], 1)


async def test_a_strict_gateway_refuses_what_it_would_ignore() -> None:
    captured = json.loads((CLIENTS / "claude-code-2.1.197.json").read_text())
    async with stack([], strict_fields=True) as (worker, gw, _, session):
        status, text = await _post(f"{gw.url}/v1/messages", session.api_key, captured["body"])
    assert status == 400 and worker.calls == []
    message = json.loads(text)["error"]["message"]
    assert message.startswith("metadata is not honoured") and "strict" in message


async def test_omitted_thinking_comes_back_through_its_signature_as_one_sample() -> None:
    """`display: omitted`: the reply's thinking is empty, its text sealed in the signature; the
    block sent back as the client got it renders the thinking the model wrote."""
    qwen3 = family_renderer("qwen3")
    scripts = [ids(qwen3, QWEN3_CALL), ids(qwen3, "It is 5.")]
    async with stack(scripts, qwen3) as (worker, gw, admin, session):
        async with anthropic.AsyncAnthropic(base_url=gw.url, api_key=session.api_key) as agent:
            ask: dict[str, Any] = {"model": "policy", "max_tokens": 256, "tools": [ADD_ANTHROPIC]}
            ask["thinking"] = {"type": "adaptive", "display": "omitted"}
            messages: list[Any] = [{"role": "user", "content": "What is 2 + 3?"}]
            first = await agent.messages.create(messages=messages, **ask)
            thinking, _, use = first.content
            assert thinking.type == "thinking" and thinking.thinking == ""  # type: ignore[union-attr]
            messages.append(
                {"role": "assistant", "content": [b.model_dump() for b in first.content]}
            )
            result = {"type": "tool_result", "tool_use_id": use.id, "content": "5"}  # type: ignore[union-attr]
            messages.append({"role": "user", "content": [result]})
            await agent.messages.create(messages=messages, **ask)
        trace = await admin.finish_session(session.session_id)
    (sample,) = trace["samples"]
    check_sample_against_records(sample, {c["rid"]: c for c in worker.calls}, trace["turns"])
    assert trace["turns"][0]["ignored"] == []  # display: omitted is honoured, not ignored


async def test_codex_style_sealed_reasoning_comes_back_as_one_sample() -> None:
    """`include: ["reasoning.encrypted_content"]` with `store: false`, the reasoning item sent
    back with its `encrypted_content` only, as Codex keeps it."""
    qwen3 = family_renderer("qwen3")
    scripts = [ids(qwen3, QWEN3_CALL), ids(qwen3, "It is 5.")]
    tools = [{"type": "function", "name": "add", "parameters": ADD_SCHEMA}]
    ask: dict[str, Any] = {"model": "policy", "tools": tools, "store": False}
    ask["include"] = ["reasoning.encrypted_content"]
    async with stack(scripts, qwen3) as (worker, gw, admin, session):
        async with openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=session.api_key) as agent:
            items: list[Any] = [{"role": "user", "content": "What is 2 + 3?"}]
            first = await agent.responses.create(input=items, **ask)
            reasoning = first.output[0]
            assert reasoning.type == "reasoning" and reasoning.encrypted_content
            items.append(
                {
                    "type": "reasoning",
                    "summary": [],
                    "encrypted_content": reasoning.encrypted_content,
                }
            )
            items += [item.model_dump(exclude_none=True) for item in first.output[1:]]
            call = first.output[-1]
            items.append({"type": "function_call_output", "call_id": call.call_id, "output": "5"})  # type: ignore[union-attr]
            second = await agent.responses.create(input=items, **ask)
        trace = await admin.finish_session(session.session_id)
    assert second.output_text == "It is 5."
    (sample,) = trace["samples"]
    check_sample_against_records(sample, {c["rid"]: c for c in worker.calls}, trace["turns"])


async def test_clearing_thinking_and_deferred_tools_change_the_prompt_the_trace_shows() -> None:
    """A `clear_thinking_20251015` edit keeping one turn leaves the older thinking out of the
    prompt; a deferred tool is not in it; both are honoured, so neither is named as ignored."""
    qwen3 = family_renderer("qwen3")
    async with stack([ids(qwen3, "It is 9.")], qwen3) as (worker, gw, admin, session):
        call = {"type": "tool_use", "name": "add", "input": {"a": 2, "b": 3}}
        turns: list[Any] = [{"role": "user", "content": "What is 2 + 3 + 4?"}]
        for n, thought in enumerate(["First thought.", "Second thought."]):
            thinking = {"type": "thinking", "thinking": thought, "signature": ""}
            turns.append({"role": "assistant", "content": [thinking, {**call, "id": f"t{n}"}]})
            result = {"type": "tool_result", "tool_use_id": f"t{n}", "content": "5"}
            turns.append({"role": "user", "content": [result]})
        deferred = {**ADD_ANTHROPIC, "name": "multiply", "defer_loading": True}
        body = {
            "model": "policy",
            "max_tokens": 64,
            "messages": turns,
            "tools": [ADD_ANTHROPIC, deferred],
            "context_management": {
                "edits": [
                    {
                        "type": "clear_thinking_20251015",
                        "keep": {"type": "thinking_turns", "value": 1},
                    }
                ]
            },
        }
        status, text = await _post(f"{gw.url}/v1/messages", session.api_key, body)
        trace = await admin.finish_session(session.session_id)
    assert status == 200, text
    prompt = qwen3.tokenizer.decode(worker.calls[0]["input_ids"])
    assert "Second thought." in prompt and "First thought." not in prompt
    assert '"add"' in prompt and "multiply" not in prompt
    assert trace["turns"][0]["ignored"] == []
