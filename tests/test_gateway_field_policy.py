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
BILLING = "system:x-anthropic-billing-header"  # left out of the prompt, named
IGNORED = {
    "claude-code-2.1.197": {"metadata", "context_management", "output_config.effort", BILLING},
    "claude-code-2.1.332": {  # its default model: a system message in `messages` with effort
        "metadata",
        "context_management",
        "output_config.effort=medium",
        "messages.output_config.effort=medium",
        BILLING,
    },
    "claude-agent-sdk-0.2.189": {
        "metadata",
        "context_management",
        "output_config.effort",
        "thinking.display",
        BILLING,
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


# -- messages mid-conversation: system turns and keys beyond role and content ---------------------

SYSTEM_MID = "Environment: the working directory is /work."


async def _one_turn(path: str, body: dict[str, Any], renderer: HFRenderer | None = None) -> Any:
    """`body` posted once: its status, text, the turn's trace entry and the prompt sampled."""
    renderer = renderer or hf_renderer()
    async with stack([ids(renderer, "Done.")], renderer) as (worker, gw, admin, session):
        status, text = await _post(f"{gw.url}{path}", session.api_key, body)
        trace = await admin.finish_session(session.session_id)
    prompt = renderer.tokenizer.decode(worker.calls[0]["input_ids"]) if worker.calls else None
    return status, text, (trace["turns"] or [None])[0], prompt


async def test_a_system_message_mid_conversation_is_rendered_where_it_stands_in_each_api() -> None:
    """Anthropic's `system` message in `messages`, OpenAI chat's system message, a Responses
    `developer` item: each a system turn at its place, which the trace's prompt shows."""
    asks = {
        "/v1/messages": {
            "model": "claude-opus-5-5",  # any name: the session's policy serves it
            "max_tokens": 16,
            "messages": [
                {"role": "user", "content": "Hi."},
                {"role": "system", "content": [{"type": "text", "text": SYSTEM_MID}]},
            ],
        },
        "/v1/chat/completions": {
            "model": "policy",
            "messages": [
                {"role": "user", "content": "Hi."},
                {"role": "system", "content": SYSTEM_MID},
            ],
        },
        "/v1/responses": {
            "model": "policy",
            "input": [
                {"role": "user", "content": "Hi."},
                {"type": "message", "role": "developer", "content": SYSTEM_MID},
            ],
        },
    }
    for path, body in asks.items():
        status, text, turn, prompt = await _one_turn(path, body)
        assert status == 200, (path, text)
        assert f"<|im_start|>user\nHi.<|im_end|>\n<|im_start|>system\n{SYSTEM_MID}" in prompt
        assert turn["ignored"] == [], path


async def test_keys_beyond_role_and_content_are_read_ignored_or_refused_by_name() -> None:
    """Claude Code 2.1.332's `output_config` on a system message: its effort steers a hosted
    model (ignored, named with its value); a key the gateway does not know is named too; in
    OpenAI chat such a key is also kept from the template; a format on one message is refused
    in one line."""
    system = {"role": "system", "content": SYSTEM_MID, "output_config": {"effort": "medium"}}
    user = {"role": "user", "content": "Hi.", "x_client_note": "n1"}
    body = {"model": "m", "max_tokens": 16, "messages": [user, system]}
    status, text, turn, _ = await _one_turn("/v1/messages", body)
    assert status == 200, text
    assert set(turn["ignored"]) == {
        "messages.x_client_note",
        "messages.output_config.effort=medium",
    }

    chat = {"model": "m", "messages": [{**user, "cache_control": {"type": "ephemeral"}}]}
    status, text, turn, prompt = await _one_turn("/v1/chat/completions", chat)
    assert status == 200, text
    assert set(turn["ignored"]) == {"messages.cache_control", "messages.x_client_note"}
    assert "n1" not in prompt and "ephemeral" not in prompt

    responses = {"model": "m", "input": [{"role": "user", "content": "Hi.", "phase": "x"}]}
    status, text, turn, _ = await _one_turn("/v1/responses", responses)
    assert status == 200, text
    assert turn["ignored"] == ["input.phase"]

    system["output_config"] = {"format": {"type": "json_schema", "schema": {}}}
    status, text, turn, _ = await _one_turn("/v1/messages", body)
    assert status == 400 and turn is None
    message = json.loads(text)["error"]["message"]
    assert message.startswith("messages[1].output_config.format is not supported"), message
    assert "\n" not in message

    bad = {"model": "m", "max_tokens": 16, "messages": [{"role": "tool", "content": "x"}]}
    status, text, _, _ = await _one_turn("/v1/messages", bad)
    assert status == 400 and "'user' | 'assistant' | 'system'" in text


async def test_a_template_without_system_turns_mid_conversation_gets_the_text_in_a_user_turn() -> (
    None
):
    """Mistral's template renders no system message past the first: the text joins the user
    turn before it, the prompt shows it there, and the trace names the move."""
    mistral = family_renderer("mistral")
    body = {
        "model": "m",
        "max_tokens": 16,
        "messages": [
            {"role": "user", "content": "Hi."},
            {"role": "system", "content": SYSTEM_MID},
        ],
    }
    status, text, turn, prompt = await _one_turn("/v1/messages", body, mistral)
    assert status == 200, text
    assert f"[INST]Hi.\n\n{SYSTEM_MID}[/INST]" in prompt
    assert turn["ignored"] == ["messages:system-in-user-turn"]


async def test_claude_codes_billing_header_is_left_out_so_sessions_share_their_prefix() -> None:
    """The `x-anthropic-billing-header` block differs per task; left out of the prompt (and
    named), two sessions with different tasks share the system prompt's render."""
    system = "You are a coding agent. " * 200
    scripts = [ids(hf_renderer(), "Done."), ids(hf_renderer(), "Done.")]
    async with stack(scripts) as (worker, gw, admin, first):
        turns = []
        for n, session in enumerate([first, await admin.create_session("second")]):
            header = f"x-anthropic-billing-header: cc_version=2.1.332.{n}ab; cc_entrypoint=cli;"
            body = {
                "model": "m",
                "max_tokens": 16,
                "system": [{"type": "text", "text": header}, {"type": "text", "text": system}],
                "messages": [{"role": "user", "content": f"Task {n}."}],
            }
            status, text = await _post(f"{gw.url}/v1/messages", session.api_key, body)
            assert status == 200, text
            turns += (await admin.finish_session(session.session_id))["turns"]
    prompt = hf_renderer().tokenizer.decode(worker.calls[1]["input_ids"])
    assert "billing" not in prompt and prompt.startswith("<|im_start|>system\nYou are")
    assert [t["render"] for t in turns] == ["full", "shared"]
    assert turns[1]["reused_prompt_tokens"] > 0.9 * turns[1]["prompt_tokens"]
    assert all(t["ignored"] == ["system:x-anthropic-billing-header"] for t in turns)
