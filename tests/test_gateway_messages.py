"""The Anthropic Messages API (`POST /v1/messages`) through the real wire: the anthropic SDK ->
gateway -> a scripted SGLang worker, with the fixture tokenizer's Hermes template.

What must hold: the SDK parses every reply (and the SDK's own pydantic types validate the raw
JSON); streamed events come in the order its stream helper needs and assemble the same Message
as the non-streamed reply; a tool_use / tool_result round trip leaves ONE exact sample (ids and
log-probs what the worker sampled, nothing under mask 0 with a log-prob); refused fields are a
400 the SDK raises as BadRequestError without retrying; errors have Anthropic's shape; the turn
limit is stop_reason `max_tokens`. The SDK joins `/v1/messages` to its base URL, so both the
gateway's root URL and the agents' base URL (gateway + /v1) must work.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import anthropic
import httpx2
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from pydantic import TypeAdapter

from agentcore_rollout.gateway import Gateway, GatewayAdmin, SGLangBackend
from agentcore_rollout.gateway.messages import MessagesDialect
from agentcore_rollout.gateway.sessions import Session
from agentcore_rollout.gateway.turns import ChatTurn, TurnAnswer, unseal_reasoning

from .gateway_support import ADD_TOOL_ANTHROPIC, ScriptedWorker, hf_renderer
from .test_gateway import check_sample_against_records

pytestmark = pytest.mark.component

TOOLS = [ADD_TOOL_ANTHROPIC]
CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
QUESTION = [{"role": "user", "content": "What is 2 + 3?"}]


def ids(text: str, *, end: bool = True) -> list[int]:
    tok = hf_renderer().tokenizer
    return [*tok.encode(text, add_special_tokens=False), *([tok.eos_token_id] if end else [])]


@asynccontextmanager
async def stack(scripts: list[list[int]]) -> AsyncIterator[tuple[ScriptedWorker, Gateway, Any]]:
    async with ScriptedWorker(scripts) as worker:
        gateway = Gateway(SGLangBackend(worker.url), hf_renderer(), model_name="policy")
        await gateway.start()
        try:
            async with GatewayAdmin(gateway.admin_url, gateway.admin_token) as admin:
                yield worker, gateway, admin
        finally:
            await gateway.stop()


def client(base_url: str, key: str, sent: list[str] | None = None, **kw: Any) -> Any:
    """The SDK as an agent builds it; `sent` collects the URL of every HTTP request it makes."""
    hooks = {"request": [_record(sent)]} if sent is not None else {}
    http = httpx2.AsyncClient(event_hooks=hooks)
    return anthropic.AsyncAnthropic(base_url=base_url, api_key=key, http_client=http, **kw)


def _record(sent: list[str]) -> Any:
    async def hook(request: Any) -> None:
        sent.append(str(request.url))

    return hook


def check_exact(sample: dict[str, Any], worker: ScriptedWorker, trace: dict[str, Any]) -> None:
    """The sample is exactly what the worker sampled (see `check_sample_against_records`)."""
    check_sample_against_records(sample, {c["rid"]: c for c in worker.calls}, trace["turns"])


# -- replies --------------------------------------------------------------------------------------


async def test_a_plain_reply_from_the_agents_base_url_and_the_root_url() -> None:
    async with stack([ids("Five."), ids("Five.")]) as (worker, gateway, admin):
        session = await admin.create_session("plain", sampling={"temperature": 0.5})
        sent: list[str] = []
        agent = client(f"{gateway.url}/v1", session.api_key, sent)  # ctx.llm.base_url
        message = await agent.messages.create(
            model="policy",
            max_tokens=64,
            system=[{"type": "text", "text": "Be brief."}],
            messages=QUESTION,
            stop_sequences=["END"],
            metadata={"user_id": "u1"},
            extra_body={"temperature": 0.2, "top_k": 5},  # older SDKs' and Claude Code's fields
        )
        headers = {"x-api-key": session.api_key, "anthropic-version": "2023-06-01"}
        body = {"model": "policy", "max_tokens": 64, "messages": QUESTION}
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{gateway.url}/v1/messages", json=body, headers=headers) as response,
        ):
            assert response.status == 200
            raw = await response.json()
        await agent.close()
    assert sent == [f"{gateway.url}/v1/v1/messages"]
    assert message.type == "message" and message.role == "assistant" and message.model == "policy"
    assert [(b.type, b.text) for b in message.content] == [("text", "Five.")]
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    assert message.usage.output_tokens == len(ids("Five."))
    assert message.usage.input_tokens == len(worker.calls[0]["input_ids"])
    assert message.id.startswith("msg_")
    params = worker.calls[0]["sampling_params"]
    assert params["temperature"] == 0.2 and params["top_k"] == 5 and params["stop"] == ["END"]
    assert params["max_new_tokens"] == 64
    prompt = hf_renderer().tokenizer.decode(worker.calls[0]["input_ids"])
    assert prompt == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert worker.calls[1]["sampling_params"]["temperature"] == 0.5  # the session's default
    assert anthropic.types.Message.model_validate(raw).content[0].text == "Five."
    assert set(raw) == {"id", "type", "role", "model", "content", "stop_reason"} | {
        "stop_sequence",
        "usage",
    }


async def test_the_stream_helper_assembles_the_non_streamed_message() -> None:
    script = ids(f"Let me add.\n{CALL}")
    async with stack([script, script]) as (_, gateway, admin):
        session = await admin.create_session("stream")
        agent = client(gateway.url, session.api_key)
        kw: dict[str, Any] = {"model": "policy", "max_tokens": 64, "messages": QUESTION}
        plain = await agent.messages.create(**kw, tools=TOOLS)
        async with agent.messages.stream(**kw, tools=TOOLS) as stream:
            texts = [t async for t in stream.text_stream]
            streamed = await stream.get_final_message()
        await agent.close()
    assert texts == ["Let me add."]
    assert [b.type for b in plain.content] == ["text", "tool_use"]
    assert plain.content[1].name == "add" and plain.content[1].input == {"a": 2, "b": 3}
    assert plain.stop_reason == "tool_use"
    exclude = {"id": True, "content": {1: {"id"}}}
    assert streamed.model_dump(exclude=exclude) == plain.model_dump(exclude=exclude)


async def test_raw_stream_events_arrive_in_the_order_the_sdk_expects() -> None:
    async with stack([ids(f"Adding.\n{CALL}")]) as (_, gateway, admin):
        session = await admin.create_session("raw")
        agent = client(f"{gateway.url}/v1", session.api_key)
        events = await agent.messages.create(
            model="policy", max_tokens=64, messages=QUESTION, tools=TOOLS, stream=True
        )
        got = [event async for event in events]
        await agent.close()
    kinds = [(e.type, getattr(e, "index", None)) for e in got]
    block = [("content_block_start",), ("content_block_delta",), ("content_block_stop",)]
    assert kinds == [
        ("message_start", None),
        *[(k[0], 0) for k in block],
        *[(k[0], 1) for k in block],
        ("message_delta", None),
        ("message_stop", None),
    ]
    assert got[0].message.content == [] and got[0].message.stop_reason is None
    assert got[1].content_block.type == "text" and got[2].delta.text == "Adding."
    assert got[4].content_block.type == "tool_use" and got[4].content_block.input == {}
    assert json.loads(got[5].delta.partial_json) == {"a": 2, "b": 3}
    assert got[7].delta.stop_reason == "tool_use" and got[7].usage.output_tokens > 0


# -- the tool round trip --------------------------------------------------------------------------


async def test_a_tool_use_round_trip_leaves_one_exact_sample() -> None:
    call, answer = ids(CALL), ids("The answer is 5.")
    async with stack([call, answer]) as (worker, gateway, admin):
        session = await admin.create_session("tools")
        agent = client(f"{gateway.url}/v1", session.api_key)
        messages: list[dict[str, Any]] = [*QUESTION]
        first = await agent.messages.create(
            model="policy", max_tokens=64, system="Use tools.", messages=messages, tools=TOOLS
        )
        assert first.stop_reason == "tool_use"
        (use,) = first.content
        assert use.type == "tool_use" and use.input == {"a": 2, "b": 3}
        messages.append({"role": "assistant", "content": [b.model_dump() for b in first.content]})
        result = {"type": "tool_result", "tool_use_id": use.id, "content": "5"}
        messages.append({"role": "user", "content": [result]})
        second = await agent.messages.create(
            model="policy", max_tokens=64, system="Use tools.", messages=messages, tools=TOOLS
        )
        trace = await admin.finish_session(session.session_id)
        await agent.close()
    assert second.content[0].text == "The answer is 5." and second.stop_reason == "end_turn"
    (sample,) = trace["samples"]  # the re-rendered tool_use equals the sampled ids
    assert sample["turns"] == [0, 1]
    check_exact(sample, worker, trace)
    assert [t["finish_reason"] for t in trace["turns"]] == ["tool_calls", "stop"]
    observation = sample["response_ids"][len(call) : -len(answer)]
    assert "<|im_start|>tool\n5<|im_end|>" in hf_renderer().tokenizer.decode(observation)


async def test_tool_results_become_tool_messages_before_the_users_text() -> None:
    async with stack([ids("Done.")]) as (worker, gateway, admin):
        session = await admin.create_session("results")
        agent = client(gateway.url, session.api_key)
        uses = [
            {"type": "tool_use", "id": f"t{i}", "name": "add", "input": {"a": i, "b": 1}}
            for i in range(2)
        ]
        results = [
            {"type": "text", "text": "Both done?"},
            {
                "type": "tool_result",
                "tool_use_id": "t0",
                "content": [{"type": "text", "text": "1"}],
            },
            {"type": "tool_result", "tool_use_id": "t1", "content": "no", "is_error": True},
        ]
        await agent.messages.create(
            model="policy",
            max_tokens=8,
            tools=TOOLS,
            messages=[
                *QUESTION,
                {"role": "assistant", "content": uses},
                {"role": "user", "content": results},
            ],
        )
        await agent.close()
    prompt = hf_renderer().tokenizer.decode(worker.calls[0]["input_ids"])
    tail = prompt[prompt.index('"arguments": {"a": 1, "b": 1}}') :]
    assert tail.index("tool\n1") < tail.index("tool\nError: no") < tail.index("user\nBoth done?")


async def test_tool_choice_none_and_disabled_parallel_use_are_held() -> None:
    two = f"{CALL}\n{CALL}"
    async with stack([ids(CALL), ids(two)]) as (_, gateway, admin):
        session = await admin.create_session("choice")
        agent = client(gateway.url, session.api_key)
        kw: dict[str, Any] = {"model": "policy", "max_tokens": 64, "messages": QUESTION}
        none = await agent.messages.create(**kw, tools=TOOLS, tool_choice={"type": "none"})
        single = await agent.messages.create(
            **kw, tools=TOOLS, tool_choice={"type": "auto", "disable_parallel_tool_use": True}
        )
        trace = await admin.finish_session(session.session_id)
        await agent.close()
    assert [b.type for b in none.content] == ["text"] and none.content[0].text == CALL
    assert none.stop_reason == "end_turn"
    assert [b.type for b in single.content] == ["text"] and single.stop_reason == "end_turn"
    assert "parallel_tool_calls is false" in trace["turns"][1]["error"]


# -- refusals, errors, limits ---------------------------------------------------------------------


REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"thinking": {"type": "enabled", "budget_tokens": 2048}}, "thinking type 'enabled'"),
    ({"container": "c1"}, "container is not supported"),
    (
        {"extra_body": {"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}}},
        "edits[0] of type 'clear_tool_uses_20250919'",
    ),
    ({"tools": [{**TOOLS[0], "input_examples": [{"a": 1, "b": 2}]}]}, "tools[0].input_examples"),
    (
        {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
        "image blocks are not supported",
    ),
    (
        {"messages": [*QUESTION, {"role": "assistant", "content": "The answer is ("}]},
        "prefill",
    ),
    (
        {
            "messages": [
                *QUESTION,
                {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "x"}]},
                {"role": "user", "content": "Go on."},
            ]
        },
        "redacted_thinking",
    ),
    ({"tool_choice": {"type": "tool", "name": "mul"}}, "'mul', which is not one of"),
    (
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Look:"},
                        {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image"}]},
                    ],
                }
            ]
        },
        "messages[0].content[1].content[0]: image blocks are not supported",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "x": 1}]}]},
        "messages[0].content[0]: unknown field 'x' in a text block",
    ),
    ({"system": [{"type": "document"}]}, "system[0]: document blocks are not supported"),
]


@pytest.mark.parametrize(("fields", "why"), REFUSED)
async def test_refused_fields_are_a_400_the_sdk_does_not_retry(
    fields: dict[str, Any], why: str
) -> None:
    async with stack([]) as (worker, gateway, admin):
        session = await admin.create_session("refused")
        sent: list[str] = []
        agent = client(gateway.url, session.api_key, sent, max_retries=3)
        kw = {"model": "policy", "max_tokens": 16, "messages": QUESTION, "tools": TOOLS, **fields}
        with pytest.raises(anthropic.BadRequestError) as caught:
            await agent.messages.create(**kw)
        await agent.close()
    assert len(sent) == 1 and worker.calls == []
    assert why in caught.value.message and "\n" not in caught.value.message
    body = caught.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert caught.value.response.headers["x-should-retry"] == "false"


async def test_max_tokens_is_required_and_errors_have_anthropics_shape() -> None:
    async with stack([]) as (_, gateway, admin):
        session = await admin.create_session("shape")
        async with aiohttp.ClientSession() as http:
            headers = {"Authorization": f"Bearer {session.api_key}"}
            body = {"model": "policy", "messages": QUESTION}
            async with http.post(f"{gateway.url}/v1/messages", json=body, headers=headers) as r:
                assert r.status == 400
                error = await r.json()
    assert error == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": error["error"]["message"]},
    }
    assert "max_tokens is required" in error["error"]["message"]
    assert anthropic.types.ErrorResponse.model_validate(error).error.type == "invalid_request_error"


async def test_a_bad_key_is_an_authentication_error_and_bearer_works_too() -> None:
    async with stack([ids("Hi.")]) as (_, gateway, admin):
        session = await admin.create_session("auth")
        sent: list[str] = []
        bad = client(f"{gateway.url}/v1", "sk-wrong", sent)
        with pytest.raises(anthropic.AuthenticationError) as caught:
            await bad.messages.create(model="policy", max_tokens=8, messages=QUESTION)
        await bad.close()
        bearer = anthropic.AsyncAnthropic(base_url=gateway.url, auth_token=session.api_key)
        reply = await bearer.messages.create(model="policy", max_tokens=8, messages=QUESTION)
        await bearer.close()
    assert len(sent) == 1
    assert caught.value.body["error"]["type"] == "authentication_error"
    assert reply.content[0].text == "Hi."


async def test_the_turn_limit_is_stop_reason_max_tokens() -> None:
    async with stack([ids("One.")]) as (worker, gateway, admin):
        session = await admin.create_session("limited", max_turns=1)
        agent = client(gateway.url, session.api_key)
        kw: dict[str, Any] = {"model": "policy", "max_tokens": 64, "messages": QUESTION}
        await agent.messages.create(**kw)
        over = await agent.messages.create(**kw)
        async with agent.messages.stream(**kw) as stream:
            streamed = await stream.get_final_message()
        trace = await admin.finish_session(session.session_id)
        await agent.close()
    for message in (over, streamed):
        assert message.stop_reason == "max_tokens" and message.content == []
        assert message.usage.output_tokens == 0
    assert len(worker.calls) == 1 and trace["limits"]["rejected_turns"] == 2


async def test_a_short_max_tokens_ends_with_max_tokens() -> None:
    async with stack([ids("One two three four five six.")]) as (_, gateway, admin):
        session = await admin.create_session("short")
        agent = client(gateway.url, session.api_key)
        message = await agent.messages.create(model="policy", max_tokens=2, messages=QUESTION)
        await agent.close()
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 2


# -- the dialect alone: what the scripted worker cannot produce -----------------------------------


def _turn(**body: Any) -> ChatTurn:
    body = {"model": "m", "max_tokens": 8, "messages": QUESTION, **body}
    return MessagesDialect().turn(body, Session("s", "r", {}, None, None), "policy")


def test_reasoning_and_a_matched_stop_sequence_in_the_reply_and_the_stream() -> None:
    """Thinking blocks (with their signature) and `stop_sequence`: the reply validates as the
    SDK's Message and the SDK's own accumulator rebuilds it from the events."""
    dialect = MessagesDialect()
    turn = _turn(stop_sequences=["END"], thinking={"type": "adaptive"})
    message = {"role": "assistant", "content": "Five", "reasoning_content": "2 + 3 = 5"}
    answer = TurnAnswer("abc", message, "stop", 7, 4, stop_sequence="END")
    reply = dialect.reply(answer, turn)
    parsed = anthropic.types.Message.model_validate(reply)
    assert [b.type for b in parsed.content] == ["thinking", "text"]
    assert parsed.content[0].thinking == "2 + 3 = 5"
    assert unseal_reasoning(parsed.content[0].signature) == "2 + 3 = 5"
    assert parsed.stop_reason == "stop_sequence" and parsed.stop_sequence == "END"
    adapter = TypeAdapter(anthropic.types.RawMessageStreamEvent)
    snapshot, json_bufs = None, {}
    for name, data in dialect.events(answer, turn):
        event = adapter.validate_python(data)
        assert event.type == name
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=json_bufs)
    assert snapshot is not None and snapshot.model_dump() == parsed.model_dump()
    other = TurnAnswer("abc", {"role": "assistant", "content": "x"}, "stop", stop_sequence="</a>")
    assert dialect.reply(other, turn)["stop_reason"] == "end_turn"  # not a requested sequence


def test_the_request_becomes_openai_chat_messages() -> None:
    thought = {"type": "thinking", "thinking": "hmm", "signature": ""}
    use = {"type": "tool_use", "id": "t1", "name": "add", "input": {"a": 2, "b": 3}}
    turn = _turn(
        system=[{"type": "text", "text": "A"}, {"type": "text", "text": "B", "cache_control": {}}],
        tools=TOOLS,
        tool_choice={"type": "any"},
        output_config={"format": {"type": "json_schema", "schema": {"type": "object"}}},
        messages=[
            *QUESTION,
            {"role": "assistant", "content": [thought, {"type": "text", "text": "Adding."}, use]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]},
        ],
    )
    assert turn.messages == [
        {"role": "system", "content": "A\nB"},
        *QUESTION,
        {
            "role": "assistant",
            "content": "Adding.",
            "reasoning_content": "hmm",
            "tool_calls": [
                {
                    "id": "t1",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": ""},
    ]
    assert turn.tools == [
        {
            "type": "function",
            "function": {
                "name": "add",
                "parameters": TOOLS[0]["input_schema"],
                "description": "Add two integers.",
            },
        }
    ]
    assert turn.tool_choice.mode == "required" and turn.json_schema == {"type": "object"}
    assert turn.sampling == {"max_tokens": 8}


@pytest.mark.parametrize(
    ("status", "kind", "exception"),
    [
        (400, "invalid_request_error", "BadRequestError"),
        (401, "authentication_error", "AuthenticationError"),
        (404, "not_found_error", "NotFoundError"),
        (413, "request_too_large", "APIStatusError"),
        (429, "rate_limit_error", "RateLimitError"),
        (502, "api_error", "InternalServerError"),
    ],
)
def test_error_types_match_the_status(status: int, kind: str, exception: str) -> None:
    error = MessagesDialect().error(status, "why", None)
    assert error == {"type": "error", "error": {"type": kind, "message": "why"}}
    assert hasattr(anthropic, exception)


# -- litellm's anthropic provider -----------------------------------------------------------------


async def test_litellm_anthropic_provider_tool_round_trip_is_exact() -> None:
    """litellm's anthropic provider appends /v1/messages to `api_base` as the SDK does, so the
    agents' base URL works as is; it needs only `model="anthropic/<any name>"` and the key."""
    import litellm

    openai_tools = [{"type": "function", "function": {"name": "add", **_openai(TOOLS[0])}}]
    call, answer = ids(CALL), ids("The answer is 5.")
    async with stack([call, answer]) as (worker, gateway, admin):
        session = await admin.create_session("litellm")
        kw: dict[str, Any] = {
            "model": "anthropic/policy",
            "api_base": f"{gateway.url}/v1",  # ctx.llm.base_url
            "api_key": session.api_key,
            "max_tokens": 64,
            "tools": openai_tools,
        }
        messages: list[dict[str, Any]] = [*QUESTION]
        first = await litellm.acompletion(messages=messages, **kw)
        (tool_call,) = first.choices[0].message.tool_calls
        assert json.loads(tool_call.function.arguments) == {"a": 2, "b": 3}
        assert first.choices[0].finish_reason == "tool_calls"
        messages.append(first.choices[0].message.model_dump())
        messages.append({"role": "tool", "tool_call_id": tool_call.id, "content": "5"})
        second = await litellm.acompletion(messages=messages, **kw)
        trace = await admin.finish_session(session.session_id)
    assert second.choices[0].message.content == "The answer is 5."
    (sample,) = trace["samples"]
    check_exact(sample, worker, trace)


def _openai(tool: dict[str, Any]) -> dict[str, Any]:
    return {"description": tool["description"], "parameters": tool["input_schema"]}


async def test_the_beta_route_claude_code_calls() -> None:
    """Claude Code and the Claude Agent SDK call the beta Messages API: the same path (the
    TypeScript SDK adds `?beta=true`) and `anthropic-beta` headers, which name features, not
    request fields."""
    async with stack([ids("Hi.")]) as (_, gateway, admin):
        session = await admin.create_session("beta")
        sent: list[str] = []
        agent = client(f"{gateway.url}/v1", session.api_key, sent)
        reply = await agent.beta.messages.create(
            model="policy",
            max_tokens=8,
            messages=QUESTION,
            betas=["interleaved-thinking-2025-05-14"],
            extra_query={"beta": "true"},  # what the TypeScript SDK, Claude Code's, adds
        )
        await agent.close()
    assert sent == [f"{gateway.url}/v1/v1/messages?beta=true"]
    assert isinstance(reply, anthropic.types.beta.BetaMessage) and reply.content[0].text == "Hi."


async def test_count_tokens_counts_the_prompt_the_request_renders_to() -> None:
    async with stack([ids("Five.")]) as (worker, gateway, admin):
        session = await admin.create_session("count")
        agent = client(f"{gateway.url}/v1", session.api_key)
        counted = await agent.messages.count_tokens(
            model="policy", system="Be brief.", messages=QUESTION
        )
        with pytest.raises(anthropic.BadRequestError) as refused:
            await agent.messages.count_tokens(
                model="policy",
                messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}],
            )
        await agent.messages.create(
            model="policy", max_tokens=8, system="Be brief.", messages=QUESTION
        )
        await agent.close()
    assert counted.input_tokens == len(worker.calls[0]["input_ids"])
    assert "image blocks are not supported" in str(refused.value)
    assert refused.value.body["type"] == "error"  # Anthropic's shape on this route too
