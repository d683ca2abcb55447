"""The OpenAI Responses API (`POST /v1/responses`) through the real wire: the openai SDK's
`client.responses` and the OpenAI Agents SDK's default model -> gateway -> a scripted SGLang
worker with the fixture tokenizer (Hermes `<tool_call>` template).

What must hold: replies and every stream event validate against the SDK's own types and the
SDK's stream helper assembles the same object as the plain reply; a two-turn tool round trip
(with `previous_response_id` or sending the items back) leaves ONE exact sample; every refused
field is a one-line 400 the SDK raises without retrying; limits end a turn as `incomplete`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import httpx
import openai
import pytest
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from agentcore_rollout.gateway import Gateway, GatewayAdmin, SGLangBackend
from agentcore_rollout.gateway.responses import MAX_STORED_RESPONSES, ResponsesDialect
from agentcore_rollout.gateway.sessions import Session
from agentcore_rollout.gateway.turns import TurnAnswer

from .gateway_support import ADD_TOOL_RESPONSES, ScriptedWorker, hf_renderer
from .test_gateway import check_sample_against_records

pytestmark = pytest.mark.component

TOOLS: list[Any] = [ADD_TOOL_RESPONSES]
CALL_TEXT = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
EVENTS = TypeAdapter(ResponseStreamEvent)


def ids(text: str, *, end: bool = True) -> list[int]:
    tok = hf_renderer().tokenizer
    return [*tok.encode(text, add_special_tokens=False), *([tok.eos_token_id] if end else [])]


@dataclass
class Stack:
    worker: ScriptedWorker
    gateway: Gateway
    admin: GatewayAdmin
    session_id: str
    key: str
    client: openai.AsyncOpenAI
    requests: list[httpx.Request]  # every HTTP request the client sent (retries show here)

    async def trace(self) -> dict[str, Any]:
        return await self.admin.finish_session(self.session_id)


@asynccontextmanager
async def stack(scripts: list[list[int]], **session: Any) -> AsyncIterator[Stack]:
    async with ScriptedWorker(scripts) as worker:
        gateway = Gateway(SGLangBackend(worker.url), hf_renderer())
        await gateway.start()
        try:
            async with GatewayAdmin(gateway.admin_url, gateway.admin_token) as admin:
                opened = await admin.create_session("responses", **session)
                sent: list[httpx.Request] = []

                async def record(request: httpx.Request) -> None:
                    sent.append(request)

                http = httpx.AsyncClient(event_hooks={"request": [record]})
                client = openai.AsyncOpenAI(
                    base_url=f"{gateway.url}/v1",
                    api_key=opened.api_key,
                    http_client=http,
                    max_retries=3,
                )
                yield Stack(worker, gateway, admin, opened.session_id, opened.api_key, client, sent)
                await client.close()
        finally:
            await gateway.stop()


def check_exact_single_sample(trace: dict[str, Any], worker: ScriptedWorker) -> dict[str, Any]:
    (sample,) = trace["samples"]
    assert sample["turns"] == list(range(trace["num_turns"]))
    check_sample_against_records(sample, {c["rid"]: c for c in worker.calls}, trace["turns"])
    return sample


def same_but_ids(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Two responses equal but for their ids, times and log-prob values (made by different
    turns: the scripted worker's log-probs differ from call to call)."""

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            gone = {"id", "call_id", "created_at", "completed_at", "logprob"}
            return {k: strip(v) for k, v in value.items() if k not in gone}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    assert strip(a) == strip(b)


# -- replies and streams -------------------------------------------------------------------------


async def test_a_plain_reply_is_the_sdks_response_and_renders_instructions_first() -> None:
    async with stack([ids("Hello there."), ids("Hi.")]) as s:
        reply = await s.client.responses.create(
            model="m", instructions="Be brief.", input="Say hello", temperature=0.5
        )
        async with aiohttp.ClientSession() as http:
            headers = {"Authorization": f"Bearer {s.key}"}
            body = {"model": "m", "input": [{"role": "user", "content": "Again"}]}
            async with http.post(f"{s.gateway.url}/v1/responses", json=body, headers=headers) as r:
                raw = await r.json()
        await s.trace()
    assert reply.status == "completed" and reply.output_text == "Hello there."
    assert reply.incomplete_details is None and reply.temperature == 0.5
    assert reply.usage is not None
    first = s.worker.calls[0]
    assert reply.usage.input_tokens == len(first["input_ids"])
    assert reply.usage.output_tokens == len(first["output_ids"])
    assert reply.usage.total_tokens == reply.usage.input_tokens + reply.usage.output_tokens
    expected = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Say hello"},
    ]
    assert first["input_ids"] == hf_renderer().render(expected, None)
    assert first["sampling_params"]["temperature"] == 0.5
    validated = Response.model_validate(raw)  # the raw JSON, as the SDK's own pydantic type
    assert validated.output_text == "Hi." and validated.object == "response"
    assert raw["output"][0]["content"][0] == {
        "type": "output_text",
        "text": "Hi.",
        "annotations": [],
    }


async def test_the_stream_is_the_sdks_event_sequence_and_assembles_the_plain_reply() -> None:
    text = ids("Hello there.")
    async with stack([text, text]) as s:
        ask = {"model": "m", "input": "Say hello", "include": ["message.output_text.logprobs"]}
        plain = await s.client.responses.create(**ask)
        seen = []
        async with s.client.responses.stream(**ask) as stream:
            async for event in stream:
                seen.append(event)
            streamed = await stream.get_final_response()
        await s.trace()
    kinds = [e.type for e in seen]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in seen] == list(range(len(seen)))
    same_but_ids(
        streamed.model_dump(exclude={"output": {0: {"parsed"}}}, exclude_none=True),
        plain.model_dump(exclude_none=True),
    )
    (delta,) = [e for e in seen if e.type == "response.output_text.delta"]
    assert delta.delta == "Hello there."
    assert [lp.logprob for lp in delta.logprobs] == s.worker.calls[1]["output_logprobs"]
    logprobs = plain.output[0].content[0].logprobs  # type: ignore[union-attr]
    assert [lp.logprob for lp in logprobs] == s.worker.calls[0]["output_logprobs"]


async def test_a_streamed_function_call_gives_argument_events_and_the_call_item() -> None:
    async with stack([ids(CALL_TEXT)]) as s:
        stream = await s.client.responses.create(
            model="m", input="2 + 3?", tools=TOOLS, stream=True
        )
        seen = [event async for event in stream]
        await s.trace()
    assert [e.type for e in seen] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    call = seen[-1].response.output[0]  # type: ignore[union-attr]
    assert call.type == "function_call" and call.name == "add"
    assert json.loads(call.arguments) == {"a": 2, "b": 3}
    assert seen[3].delta == call.arguments and seen[2].item.call_id == call.call_id  # type: ignore[union-attr]


# -- tool round trips: one exact sample ----------------------------------------------------------


async def test_a_function_call_round_trip_with_previous_response_id_is_one_exact_sample() -> None:
    async with stack([ids(CALL_TEXT), ids("The answer is 5.")]) as s:
        first = await s.client.responses.create(
            model="m", instructions="Use tools.", input="What is 2 + 3?", tools=TOOLS
        )
        (call,) = first.output
        assert call.type == "function_call" and call.call_id.startswith("call_")
        assert json.loads(call.arguments) == {"a": 2, "b": 3}
        second = await s.client.responses.create(
            model="m",
            instructions="Use tools.",
            tools=TOOLS,
            previous_response_id=first.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "5"}],
        )
        assert second.output_text == "The answer is 5." and second.status == "completed"
        assert second.previous_response_id == first.id
        trace = await s.trace()
    sample = check_exact_single_sample(trace, s.worker)
    assert [t["finish_reason"] for t in trace["turns"]] == ["tool_calls", "stop"]
    observation = sample["response_ids"][len(ids(CALL_TEXT)) : -len(ids("The answer is 5."))]
    assert "<|im_start|>tool\n5<|im_end|>" in hf_renderer().tokenizer.decode(observation)


async def test_a_function_call_round_trip_sending_the_items_back_is_one_exact_sample() -> None:
    async with stack([ids(CALL_TEXT), ids("The answer is 5.")]) as s:
        items: list[Any] = [{"role": "user", "content": "What is 2 + 3?"}]
        first = await s.client.responses.create(
            model="m", input=items, tools=TOOLS, store=False, tool_choice="required"
        )
        call = first.output[0]
        assert call.type == "function_call"
        items += [item.model_dump(exclude_none=True) for item in first.output]
        items.append({"type": "function_call_output", "call_id": call.call_id, "output": "5"})
        second = await s.client.responses.create(model="m", input=items, tools=TOOLS, store=False)
        assert second.output_text == "The answer is 5."
        with pytest.raises(openai.BadRequestError, match="previous_response_id"):
            await s.client.responses.create(
                model="m", input="more", previous_response_id=first.id
            )  # store: false kept nothing
        trace = await s.trace()
    check_exact_single_sample(trace, s.worker)


# -- limits and options --------------------------------------------------------------------------


async def test_max_output_tokens_and_the_turn_limit_end_the_turn_as_incomplete() -> None:
    async with stack([ids("One two three four")], max_turns=1) as s:
        cut = await s.client.responses.create(model="m", input="Count", max_output_tokens=2)
        assert cut.status == "incomplete" and cut.incomplete_details is not None
        assert cut.incomplete_details.reason == "max_output_tokens"
        assert cut.output[0].status == "incomplete" and cut.usage.output_tokens == 2  # type: ignore[union-attr]
        assert s.worker.calls[0]["sampling_params"]["max_new_tokens"] == 2
        stream = await s.client.responses.create(model="m", input="Count", stream=True)
        events = [e async for e in stream]  # past max_turns: no backend call, no 429
        trace = await s.trace()
    assert events[-1].type == "response.incomplete"
    over = events[-1].response  # type: ignore[union-attr]
    assert over.incomplete_details.reason == "max_output_tokens" and over.output_text == ""
    assert over.usage.output_tokens == 0 and len(s.worker.calls) == 1
    assert trace["limits"]["rejected_turns"] == 1


async def test_tool_choice_none_text_format_and_json_schema_are_honoured() -> None:
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}}
    async with stack([ids(CALL_TEXT), ids('{"x": 1}')]) as s:
        plain = await s.client.responses.create(
            model="m", input="2 + 3?", tools=TOOLS, tool_choice="none"
        )
        assert plain.output_text == CALL_TEXT and plain.output[0].type == "message"
        fmt = {"type": "json_schema", "name": "x", "schema": schema, "strict": True}
        shaped = await s.client.responses.create(model="m", input="x?", text={"format": fmt})
        assert shaped.output_text == '{"x": 1}' and shaped.text.format.type == "json_schema"  # type: ignore[union-attr]
        trace = await s.trace()
    assert json.loads(s.worker.calls[1]["sampling_params"]["json_schema"]) == schema
    assert trace["turns"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize(
    ("extra", "names"),
    [
        ({"conversation": "conv_1"}, "conversation"),
        ({"background": True}, "background"),
        ({"truncation": "auto"}, "truncation"),
        ({"reasoning": {"context": "x"}}, "reasoning.context 'x'"),
        ({"include": "all"}, "include must be a list"),
        ({"tool_choice": {"type": "file_search"}}, "tool_choice"),
        ({"tool_choice": {"type": "function", "name": "nope"}}, "'nope'"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"previous_response_id": "resp_unknown"}, "resp_unknown"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0] of type 'input_image'",
        ),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "item_reference"),
        ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "'web_search_call'"),
    ],
)
async def test_refused_fields_are_one_line_400s_the_sdk_does_not_retry(
    extra: dict[str, Any], names: str
) -> None:
    async with stack([]) as s:
        ask = {"model": "m", "input": "hi", **extra}
        with pytest.raises(openai.BadRequestError) as caught:
            await s.client.responses.create(**ask)
        await s.trace()
    assert len(s.requests) == 1  # x-should-retry: false, obeyed
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "invalid_request_error"
    assert names in body["message"] and "\n" not in body["message"]
    assert s.worker.calls == []


async def test_an_unknown_route_names_the_responses_route() -> None:
    async with stack([]) as s:
        with pytest.raises(openai.NotFoundError, match="POST /v1/responses"):
            await s.client.post("/nothing", cast_to=dict, body={})
        await s.trace()


async def test_the_store_keeps_the_last_responses_of_its_session_only() -> None:
    n = MAX_STORED_RESPONSES + 1
    async with stack([ids(f"r{i}") for i in range(n)]) as s:
        made = [await s.client.responses.create(model="m", input=f"q{i}") for i in range(n)]
        (session,) = s.gateway.sessions._by_id.values()
        assert list(session.responses) == [r.id for r in made[1:]]
        assert session.responses[made[-1].id][-1] == {"role": "assistant", "content": f"r{n - 1}"}
        with pytest.raises(openai.BadRequestError, match=made[0].id):
            await s.client.responses.create(model="m", input="x", previous_response_id=made[0].id)
        other = await s.admin.create_session("other")
        async with openai.AsyncOpenAI(
            base_url=f"{s.gateway.url}/v1", api_key=other.api_key, max_retries=0
        ) as stranger:
            with pytest.raises(openai.BadRequestError, match=made[-1].id):  # not its session's
                await stranger.responses.create(
                    model="m", input="x", previous_response_id=made[-1].id
                )
        await s.admin.drop_session(other.session_id)
        await s.trace()
    assert len(s.gateway.sessions) == 0  # the store went with its session


# -- reasoning, through the dialect (the fixture template has no reasoning syntax) --------------


def _session() -> Session:
    return Session("s", "r", sampling={}, max_context=None, max_turns=None)


def test_reasoning_items_become_the_next_assistant_messages_reasoning_content() -> None:
    dialect = ResponsesDialect()
    turn = dialect.turn(
        {
            "model": "m",
            "input": [
                {"type": "message", "role": "developer", "content": "Rules."},
                {"role": "user", "content": [{"type": "input_text", "text": "2 + 3?"}]},
                {
                    "type": "reasoning",
                    "id": "rs_1",
                    "summary": [],
                    "content": [{"type": "reasoning_text", "text": "Add them."}],
                },
                {
                    "type": "message",
                    "role": "assistant",
                    "id": "msg_1",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": "Calling.", "annotations": []}],
                },
                {"type": "function_call", "call_id": "c1", "name": "add", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "5"},
            ],
        },
        _session(),
        "policy",
    )
    assert turn.messages == [
        {"role": "system", "content": "Rules."},
        {"role": "user", "content": "2 + 3?"},
        {
            "role": "assistant",
            "content": "Calling.",
            "reasoning_content": "Add them.",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
    ]


def test_reasoning_text_and_calls_stream_as_sdk_events_that_assemble_the_reply() -> None:
    dialect = ResponsesDialect()
    turn = dialect.turn({"model": "m", "input": "2 + 3?", "tools": TOOLS}, _session(), "policy")
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}
    message = {
        "role": "assistant",
        "content": "Adding.",
        "reasoning_content": "Think.",
        "tool_calls": [call],
    }
    answer = TurnAnswer("abc", message, "tool_calls", prompt_tokens=5, completion_tokens=7)
    reply = dialect.reply(answer, turn)
    assert [i["type"] for i in reply["output"]] == ["reasoning", "message", "function_call"]
    assert Response.model_validate(reply).output[0].content[0].text == "Think."  # type: ignore[union-attr]
    state = ResponseStreamState(input_tools=TOOLS, text_format=openai.omit)
    kinds = []
    for name, data in dialect.events(answer, turn):
        assert name == data["type"]
        kinds.append(name)
        state.handle_event(EVENTS.validate_python(data))
    assert kinds[2:8] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    final = state._completed_response
    assert final is not None
    same_but_ids(  # events() made its own reply: another time
        final.model_dump(exclude_none=True, exclude={"output": {2: {"parsed_arguments"}}}),
        Response.model_validate(reply).model_dump(exclude_none=True),
    )


# -- the OpenAI Agents SDK, its default model ----------------------------------------------------


@pytest.mark.parametrize(("streamed", "chained"), [(False, False), (True, False), (False, True)])
async def test_the_openai_agents_sdk_default_model_runs_a_tool_round_trip_exactly(
    streamed: bool, chained: bool
) -> None:
    """Unmodified: only the client (base URL, key) and the model name are set."""
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    async with stack([ids(CALL_TEXT), ids("The answer is 5.")]) as s:
        agents.set_default_openai_client(s.client, use_for_tracing=False)
        agents.set_default_openai_api("responses")  # its default; other tests may switch it

        @agents.function_tool
        def add(a: int, b: int) -> int:
            """Add two integers."""
            return a + b

        agent = agents.Agent(name="calc", instructions="Use tools.", model="policy", tools=[add])
        model = agents.RunConfig().model_provider.get_model("policy")
        assert isinstance(model, agents.OpenAIResponsesModel)
        if streamed:
            run = agents.Runner.run_streamed(agent, "What is 2 + 3?")
            async for _ in run.stream_events():
                pass
            final = run.final_output
        else:
            run = agents.Runner.run(agent, "What is 2 + 3?", auto_previous_response_id=chained)
            final = (await run).final_output
        assert final == "The answer is 5."
        trace = await s.trace()
    sent = [json.loads(r.content) for r in s.requests]
    assert [r.url.path for r in s.requests] == ["/v1/responses"] * 2
    if chained:  # only the new item, the rest from the gateway's store
        assert [i.get("type") for i in sent[1]["input"]] == ["function_call_output"]
        assert sent[1]["previous_response_id"].startswith("resp_")
    else:
        kinds = [i.get("type") for i in sent[1]["input"]]
        assert kinds == [None, "function_call", "function_call_output"]
    assert all(body.get("stream", False) is streamed for body in sent)
    check_exact_single_sample(trace, s.worker)
    assert [t["finish_reason"] for t in trace["turns"]] == ["tool_calls", "stop"]
    second_prompt = hf_renderer().tokenizer.decode(s.worker.calls[1]["input_ids"])
    assert "<|im_start|>tool\n5<|im_end|>" in second_prompt


# -- over WebSocket --------------------------------------------------------------------------------


async def _events_until_done(ws: aiohttp.ClientWebSocketResponse) -> list[dict[str, Any]]:
    events = []
    while True:
        message = await ws.receive(timeout=30)
        assert message.type == aiohttp.WSMsgType.TEXT, message
        events.append(json.loads(message.data))
        if events[-1]["type"] in ("response.completed", "response.incomplete", "error"):
            return events


async def test_the_responses_api_over_websocket_as_codex_calls_it() -> None:
    """`GET /v1/responses` upgraded: a `generate: false` warm-up, then `response.create`
    messages that continue the connection's last response by `previous_response_id` with only
    the new items, `store: false`, as Codex sends them. The events are the SSE stream's, each
    parsed by the openai SDK's own types; the trace is one exact sample. A failed request is an
    `error` event with its status, and the connection goes on."""
    async with stack([ids(CALL_TEXT), ids("It is 5.")]) as s:
        headers = {"Authorization": f"Bearer {s.key}"}
        ask = {"type": "response.create", "model": "policy", "tools": TOOLS, "store": False}
        user = {"type": "message", "role": "user", "content": "What is 2 + 3?"}
        async with (
            aiohttp.ClientSession() as http,
            http.ws_connect(f"{s.gateway.url}/v1/responses", headers=headers) as ws,
        ):
            await ws.send_str(json.dumps({**ask, "input": [user], "generate": False}))
            warm = await _events_until_done(ws)
            assert [e["type"] for e in warm] == ["response.created", "response.completed"]
            assert warm[-1]["response"]["output"] == [] and s.worker.calls == []

            await ws.send_str(json.dumps({**ask, "input": [], "previous_response_id": "resp_x"}))
            (error,) = await _events_until_done(ws)
            assert error["status"] == 400 and "resp_x" in error["error"]["message"]

            warmed = warm[-1]["response"]["id"]  # continued with no new item, as Codex may
            await ws.send_str(json.dumps({**ask, "input": [], "previous_response_id": warmed}))
            first = await _events_until_done(ws)
            assert [e["type"] for e in first][:2] == ["response.created", "response.in_progress"]
            for event in first:
                EVENTS.validate_python(event)
            call = first[-1]["response"]["output"][-1]
            assert call["type"] == "function_call"
            await ws.send_str(json.dumps({"type": "response.processed", "response_id": "x"}))
            result = {"type": "function_call_output", "call_id": call["call_id"], "output": "5"}
            previous = first[-1]["response"]["id"]
            await ws.send_str(
                json.dumps({**ask, "input": [result], "previous_response_id": previous})
            )
            second = await _events_until_done(ws)
            assert second[-1]["response"]["output"][-1]["content"][0]["text"] == "It is 5."
            trace = await s.trace()  # the session ends: the open connection serves no more
            await ws.send_str(json.dumps({**ask, "input": [user]}))
            (closed,) = await _events_until_done(ws)
            assert closed["status"] == 401 and closed["error"]["code"] == "invalid_api_key"
        assert s.gateway.websocket_requests == 4
    check_exact_single_sample(trace, s.worker)


async def test_a_get_without_upgrade_is_told_to_upgrade_or_post() -> None:
    async with stack([]) as s, aiohttp.ClientSession() as http:
        headers = {"Authorization": f"Bearer {s.key}"}
        async with http.get(f"{s.gateway.url}/v1/responses", headers=headers) as r:
            assert r.status == 426 and "POST /v1/responses" in (await r.json())["error"]["message"]
        async with http.get(f"{s.gateway.url}/v1/responses") as r:
            assert r.status == 401
