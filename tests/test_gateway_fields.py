"""Chat completions' fields honoured or refused, through the real wire (OpenAI SDK -> gateway ->
a scripted SGLang worker or the local policy server); the fields that change nothing sampled,
accepted and named in the trace, are in test_gateway_field_policy.py."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest

from agentcore_rollout.gateway import Gateway, GatewayAdmin, SGLangBackend
from agentcore_rollout.local.policy import CharRenderer, PolicyServer

from .gateway_support import ScriptedWorker, hf_renderer

pytestmark = pytest.mark.component


def _tool(name: str) -> dict[str, Any]:
    params = {"type": "object", "properties": {"a": {"type": "integer"}}}
    return {"type": "function", "function": {"name": name, "parameters": params}}


TOOLS = [_tool("add"), _tool("mul")]
ASK = [{"role": "user", "content": "What is 2 + 3?"}]


def ids(text: str, *, end: bool = True) -> list[int]:
    tok = hf_renderer().tokenizer
    return [*tok.encode(text, add_special_tokens=False), *([tok.eos_token_id] if end else [])]


def call(name: str, a: int = 2) -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {{"a": {a}}}}}</tool_call>'


class Turns:
    """A scripted worker behind a gateway: `await turns.ask(script, **request)` -> (reply, turn
    as traced, the worker's record of the call)."""

    def __init__(self, worker: ScriptedWorker, gateway: Gateway, admin: GatewayAdmin) -> None:
        self.worker, self.gateway, self.admin = worker, gateway, admin

    async def ask(self, script: list[int], **request: Any) -> tuple[Any, dict, dict]:
        self.worker.scripts.append(script)
        session = await self.admin.create_session("fields")
        async with openai.AsyncOpenAI(
            base_url=f"{self.gateway.url}/v1", api_key=session.api_key
        ) as client:
            reply = await client.chat.completions.create(model="m", messages=ASK, **request)
        trace = await self.admin.finish_session(session.session_id)
        return reply, trace["turns"][0], self.worker.calls[-1]


@pytest.fixture
async def turns() -> AsyncIterator[Turns]:
    async with (
        ScriptedWorker() as worker,
        Gateway(SGLangBackend(worker.url), hf_renderer()) as gateway,
        GatewayAdmin(gateway.admin_url, gateway.admin_token) as admin,
    ):
        yield Turns(worker, gateway, admin)


# -- tool_choice and parallel_tool_calls: held when parsing --------------------------------------


async def test_tool_choice_none_parses_no_call(turns: Turns) -> None:
    reply, turn, _ = await turns.ask(ids(call("add")), tools=TOOLS, tool_choice="none")
    message = reply.choices[0].message
    assert message.content == call("add") and not message.tool_calls
    assert reply.choices[0].finish_reason == "stop" and not turn["ill_formed"]


@pytest.mark.parametrize(
    ("choice", "script", "error"),
    [
        ("required", "It is 5.", "tool_choice required asked for a tool call; the model wrote"),
        ({"type": "function", "function": {"name": "mul"}}, call("add"), "allows only that tool"),
    ],
    ids=["required_without_a_call", "named_but_another_called"],
)
async def test_a_turn_that_breaks_tool_choice_is_the_models_text_and_ill_formed(
    turns: Turns, choice: Any, script: str, error: str
) -> None:
    reply, turn, _ = await turns.ask(ids(script), tools=TOOLS, tool_choice=choice)
    assert reply.choices[0].message.content == script and not reply.choices[0].message.tool_calls
    assert turn["ill_formed"] and error in turn["error"]


async def test_a_named_tool_choice_that_is_obeyed_is_a_call(turns: Turns) -> None:
    choice = {"type": "function", "function": {"name": "mul"}}
    reply, turn, _ = await turns.ask(ids(call("mul", 4)), tools=TOOLS, tool_choice=choice)
    (made,) = reply.choices[0].message.tool_calls
    assert made.function.name == "mul" and json.loads(made.function.arguments) == {"a": 4}
    assert reply.choices[0].finish_reason == "tool_calls" and not turn["ill_formed"]


async def test_parallel_tool_calls_false_refuses_two_calls_and_true_returns_both(
    turns: Turns,
) -> None:
    two = call("add") + "\n" + call("mul", 3)
    reply, turn, _ = await turns.ask(ids(two), tools=TOOLS, parallel_tool_calls=False)
    assert reply.choices[0].message.content == two and turn["ill_formed"]
    assert "parallel_tool_calls is false; the model made 2 calls" in turn["error"]
    reply, turn, _ = await turns.ask(ids(two), tools=TOOLS, parallel_tool_calls=True)
    assert [c.function.name for c in reply.choices[0].message.tool_calls] == ["add", "mul"]


# -- response_format: constrained by the backend or refused ----------------------------------------


@pytest.mark.parametrize(
    ("response_format", "schema"),
    [
        ({"type": "json_object"}, {"type": "object"}),
        (
            {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "integer"}}},
            {"type": "integer"},
        ),
    ],
    ids=["json_object", "json_schema"],
)
async def test_response_format_goes_to_sglang_as_a_json_schema(
    turns: Turns, response_format: dict, schema: dict
) -> None:
    _, _, record = await turns.ask(ids("{}"), response_format=response_format)
    assert json.loads(record["sampling_params"]["json_schema"]) == schema


async def test_a_text_response_format_constrains_nothing(turns: Turns) -> None:
    _, _, record = await turns.ask(ids("5"), response_format={"type": "text"})
    assert "json_schema" not in record["sampling_params"]


@pytest.fixture
async def char_gateway() -> AsyncIterator[tuple[Gateway, str]]:
    async with (
        PolicyServer(seed=1) as policy,
        Gateway(SGLangBackend(policy.url), CharRenderer()) as gateway,
        GatewayAdmin(gateway.admin_url, gateway.admin_token) as admin,
    ):
        session = await admin.create_session("char")
        yield gateway, session.api_key


async def test_a_backend_that_cannot_constrain_refuses_response_format_once(
    char_gateway: tuple[Gateway, str],
) -> None:
    gateway, key = char_gateway
    body = {"model": "m", "messages": ASK, "response_format": {"type": "json_object"}}
    headers = {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession() as http:
        url = f"{gateway.url}/v1/chat/completions"
        async with http.post(url, json=body, headers=headers) as response:
            error = (await response.json())["error"]
            assert response.status == 400 and response.headers["x-should-retry"] == "false"
    assert "json_schema is not supported by this server" in error["message"]


async def test_top_logprobs_are_filled_per_token(char_gateway: tuple[Gateway, str]) -> None:
    gateway, key = char_gateway
    async with openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key=key) as client:
        reply = await client.chat.completions.create(
            model="m", messages=ASK, logprobs=True, top_logprobs=3, max_tokens=6
        )
    entries = reply.choices[0].logprobs.content
    assert len(entries) == reply.usage.completion_tokens > 0
    for entry in entries:
        alternatives = [t.logprob for t in entry.top_logprobs]
        assert len(alternatives) == 3 and alternatives == sorted(alternatives, reverse=True)
        assert entry.logprob <= alternatives[0] + 1e-9


# -- refused outright ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"logit_bias": {"5": 10}}, "logit_bias is not supported"),
        ({"web_search_options": {}}, "web_search_options is not supported"),
        ({"tool_choice": "required"}, "tool_choice 'required' needs tools"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "x"}}}, "'x'"),
        ({"top_logprobs": 2}, "top_logprobs needs logprobs: true"),
        ({"modalities": ["text", "audio"]}, "text-only"),
    ],
    ids=[
        "logit_bias",
        "web_search",
        "required_without_tools",
        "unknown_tool",
        "top_alone",
        "audio",
    ],
)
async def test_fields_the_gateway_cannot_honour_are_a_400_naming_them(
    turns: Turns, extra: dict, message: str
) -> None:
    session = await turns.admin.create_session("refused")
    client = openai.AsyncOpenAI(base_url=f"{turns.gateway.url}/v1", api_key=session.api_key)
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(model="m", messages=ASK, **extra)
    await client.close()
    assert message in str(refused.value)
    trace = await turns.admin.finish_session(session.session_id)
    assert trace["num_turns"] == 0 and trace["limits"]["rejected_turns"] == 0


async def test_an_unknown_route_is_a_404_naming_the_routes(turns: Turns) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{turns.gateway.url}/v1/completions", json={}) as response,
    ):
        error = (await response.json())["error"]
    assert response.status == 404
    assert error["message"].startswith("no route POST /v1/completions: this listener serves")
    assert "POST /v1/chat/completions" in error["message"]
