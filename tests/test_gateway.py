"""The token-capture gateway through real HTTP: OpenAI Python client -> gateway -> sglang-router
-> PolicyServer workers: the char toy's, SmolLM2-135M-Instruct's (the central exactness test runs
on both), or a scripted worker for the fixture Hugging Face tokenizer's cases.

The central claim is exactness: every sample's response tokens and log-probs are, token for token,
what a worker sampled (as the workers themselves recorded it), with the loss mask on exactly those
tokens. The rest: drift and forks start new samples instead of splicing, keys isolate sessions,
limits answer 429 / `length`, and streaming and tool calls round-trip through the OpenAI SDK.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest

from agentcore_rollout.gateway import (
    Gateway,
    GatewayAdmin,
    GatewayError,
    GatewaySession,
    OpenAIBackend,
    SGLangBackend,
    SGLangRouter,
)
from agentcore_rollout.local.policy import CharRenderer, PolicyServer

from .gateway_support import ADD_TOOL, ScriptedWorker, exactness_rollout, hf_renderer

pytestmark = pytest.mark.component

TOOLS = [ADD_TOOL]


# -- helpers -------------------------------------------------------------------------------------


def agent(gateway: Gateway, key: str, **kw: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key=key, **kw)


async def recorded(url: str) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/debug/samples") as response:
        return (await response.json())["samples"]


def check_sample_against_records(sample: dict[str, Any], by_rid: dict[str, Any], turns: list):
    """Each merged turn: the worker's input is a prefix of prompt + response, its output ids and
    log-probs sit right after it, and the mask is 1 on exactly the union of those spans."""
    full = sample["prompt_ids"] + sample["response_ids"]
    n_prompt = len(sample["prompt_ids"])
    response, mask, logprobs = sample["response_ids"], sample["loss_mask"], sample["logprobs"]
    assert len(response) == len(mask) == len(logprobs)
    sampled: set[int] = set()
    for turn_index in sample["turns"]:
        record = by_rid[turns[turn_index]["rid"]]
        inp, out = record["input_ids"], record["output_ids"]
        assert full[: len(inp)] == inp
        start = len(inp) - n_prompt
        assert response[start : start + len(out)] == out
        assert logprobs[start : start + len(out)] == record["output_logprobs"]
        sampled |= set(range(start, start + len(out)))
    assert {i for i, m in enumerate(mask) if m == 1} == sampled
    assert all((lp is None) == (m == 0) for lp, m in zip(logprobs, mask, strict=True))


@pytest.fixture
async def policy() -> AsyncIterator[PolicyServer]:
    async with PolicyServer(seed=3, record=True) as server:
        yield server


@pytest.fixture
async def char_gateway(policy: PolicyServer) -> AsyncIterator[Gateway]:
    async with Gateway(SGLangBackend(policy.url), CharRenderer(), model_name="tiny") as gateway:
        yield gateway


@pytest.fixture
async def admin(char_gateway: Gateway) -> AsyncIterator[GatewayAdmin]:
    async with GatewayAdmin(char_gateway.admin_url, char_gateway.admin_token) as client:
        yield client


async def scripted_gateway(worker: ScriptedWorker) -> Gateway:
    gateway = Gateway(SGLangBackend(worker.url), hf_renderer())
    await gateway.start()
    return gateway


# -- exactness through sglang-router -----------------------------------------------------------


def two_workers(model: str) -> tuple[PolicyServer, PolicyServer, Any]:
    """Two recording workers and the renderer of their model: the char toy, or SmolLM2 (a
    byte-level BPE tokenizer, ChatML with a tools section, HFPolicy's batched decode)."""
    if model == "char":
        return (
            PolicyServer(seed=0, record=True, worker_id="w0"),
            PolicyServer(seed=1, record=True, worker_id="w1"),
            CharRenderer(),
        )
    from agentcore_rollout.gateway import HFRenderer
    from agentcore_rollout.local.policy.hf import HFPolicy

    from .smollm2 import model_dir, smollm2

    path = model_dir()
    workers = [PolicyServer(HFPolicy(path), record=True, worker_id=f"w{i}") for i in (0, 1)]
    return workers[0], workers[1], HFRenderer(smollm2(), name=path.name)


@pytest.mark.e2e
@pytest.mark.parametrize("model", ["char", "smollm2"])
async def test_multi_turn_traces_equal_what_two_workers_sampled_through_the_router(
    model: str,
) -> None:
    first, second, renderer = two_workers(model)
    async with (
        first as w0,
        second as w1,
        SGLangRouter([w0.url, w1.url], policy="round_robin") as router,
        Gateway(SGLangBackend(router.url), renderer) as gateway,
        GatewayAdmin(gateway.admin_url, gateway.admin_token) as admin,
    ):
        traces = await asyncio.gather(*(exactness_rollout(gateway, admin, i) for i in range(6)))
        records = await recorded(w0.url) + await recorded(w1.url)

    by_rid = {r["rid"]: r for r in records}
    assert len(by_rid) == 18 == sum(t["num_turns"] for t in traces)
    # SmolLM2's template adds its default system prompt, which the sessions then share; the
    # char template has none, and its first turns begin at their first anchor: nothing to share.
    shared = sum(t["render"]["shared"] for t in traces)
    assert shared == 0 if model == "char" else shared >= 4
    assert {r["worker_id"] for r in records} == {"w0", "w1"}  # both workers served turns
    for trace in traces:
        assert trace["token_capture"] is True
        kinds = trace["render"]
        assert kinds["incremental"] == 2 and kinds["fallback"] == 0
        assert kinds["full"] + kinds["shared"] == 1  # the first turn
        samples = trace["samples"]
        assert [turn for s in samples for turn in s["turns"]] == [0, 1, 2]
        if model == "char":  # a char per token: the text re-renders as the ids sampled
            assert len(samples) == 1  # all turns merged
        for before, after in itertools.combinations(samples, 2):
            # At temperature 1 a BPE model's text sometimes re-renders as other ids than it
            # sampled (a non-canonical tokenization: 2 of about 800 rollouts here); the next
            # prompt, a full render, then extends no earlier sample, and only then does a new
            # sample start.
            full = before["prompt_ids"] + before["response_ids"]
            assert after["prompt_ids"][: len(full)] != full
        for sample in samples:
            check_sample_against_records(sample, by_rid, trace["turns"])
            turns = [trace["turns"][i] for i in sample["turns"]]
            truncated = any(by_rid[t["rid"]]["finish_reason"]["type"] == "length" for t in turns)
            assert sample["truncated"] is truncated
    assert json.loads(json.dumps(traces)) == traces  # JSON-serializable as is


# -- drift and forks -----------------------------------------------------------------------------


async def test_drift_keeps_the_sampled_ids_and_the_next_turn_starts_a_new_sample() -> None:
    tok = hf_renderer().tokenizer
    chars = [tok.convert_tokens_to_ids(c) for c in "hello"]
    canonical = tok.encode("hello", add_special_tokens=False)
    assert tok.decode(chars) == "hello" and canonical != chars  # re-tokenizing changes the ids
    async with ScriptedWorker([[*chars, tok.eos_token_id], [tok.eos_token_id]]) as worker:
        gateway = await scripted_gateway(worker)
        async with GatewayAdmin(gateway.admin_url, gateway.admin_token) as admin:
            session = await admin.create_session("drift")
            client = agent(gateway, session.api_key)
            messages = [{"role": "user", "content": "Say hello"}]
            first = await client.chat.completions.create(model="m", messages=messages)
            assert first.choices[0].message.content == "hello"
            messages += [
                {"role": "assistant", "content": "hello"},
                {"role": "user", "content": "!"},
            ]
            await client.chat.completions.create(model="m", messages=messages)
            trace = await admin.finish_session(session.session_id)
            await client.close()
        await gateway.stop()
    first_sample, second_sample = trace["samples"]
    assert first_sample["response_ids"] == [*chars, tok.eos_token_id]  # sampled, not re-encoded
    assert first_sample["loss_mask"] == [1] * 6
    assert first_sample["logprobs"] == worker.calls[0]["output_logprobs"]
    rerendered = worker.calls[1]["input_ids"]
    assert second_sample["prompt_ids"] == rerendered  # what the policy saw on turn 2
    assert (
        canonical[0] in rerendered
        and rerendered[: len(worker.calls[0]["input_ids"])] == (worker.calls[0]["input_ids"])
    )
    assert [s["turns"] for s in trace["samples"]] == [[0], [1]]


async def test_a_prompt_that_does_not_extend_starts_a_new_sample_and_later_turns_rejoin(
    char_gateway: Gateway, admin: GatewayAdmin, policy: PolicyServer
) -> None:
    session = await admin.create_session("fork", sampling={"max_tokens": 4})
    client = agent(char_gateway, session.api_key)
    main = [{"role": "user", "content": "What is 1 + 2?"}]

    async def ask(messages: list[dict[str, Any]]) -> str:
        reply = await client.chat.completions.create(model="m", messages=messages)
        return reply.choices[0].message.content or ""

    main.append({"role": "assistant", "content": await ask(main)})
    main.append({"role": "user", "content": "And 3 + 3?"})
    main.append({"role": "assistant", "content": await ask(main)})
    await ask([{"role": "user", "content": "Summary: 1 + 2 and 3 + 3."}])  # a fork (sub-agent)
    main.append({"role": "user", "content": "And 4 + 4?"})
    await ask(main)  # extends the first conversation again
    await ask(main[:1])  # a retry from the first prompt: extends nothing any more
    trace = await admin.finish_session(session.session_id)
    await client.close()
    assert [s["turns"] for s in trace["samples"]] == [[0, 1, 3], [2], [4]]
    by_rid = {r["rid"]: r for r in await recorded(policy.url)}
    for sample in trace["samples"]:
        check_sample_against_records(sample, by_rid, trace["turns"])


# -- tools and streaming -------------------------------------------------------------------------


async def test_streamed_tool_call_round_trips_and_merges_with_the_tool_result() -> None:
    r = hf_renderer()
    tok = r.tokenizer
    call_text = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    call_ids = [*tok.encode(call_text, add_special_tokens=False), tok.eos_token_id]
    answer_ids = [*tok.encode("The answer is 5.", add_special_tokens=False), tok.eos_token_id]
    async with ScriptedWorker([call_ids, answer_ids]) as worker:
        gateway = await scripted_gateway(worker)
        async with GatewayAdmin(gateway.admin_url, gateway.admin_token) as admin:
            session = await admin.create_session("tools", sampling={"temperature": 0.7})
            client = agent(gateway, session.api_key)
            messages: list[dict[str, Any]] = [
                {"role": "system", "content": "Use tools."},
                {"role": "user", "content": "What is 2 + 3?"},
            ]
            stream = await client.chat.completions.create(
                model="m",
                messages=messages,
                tools=TOOLS,
                stream=True,
                stream_options={"include_usage": True},
            )
            calls: dict[int, dict[str, Any]] = {}
            finish, usage = None, None
            async for chunk in stream:
                usage = chunk.usage or usage
                for choice in chunk.choices:
                    finish = choice.finish_reason or finish
                    for d in choice.delta.tool_calls or []:
                        call = calls.setdefault(d.index, {"id": d.id, "name": "", "arguments": ""})
                        call["name"] += d.function.name or ""
                        call["arguments"] += d.function.arguments or ""
            assert finish == "tool_calls" and usage is not None
            assert usage.completion_tokens == len(call_ids)
            (call,) = calls.values()
            assert call["name"] == "add" and json.loads(call["arguments"]) == {"a": 2, "b": 3}
            function = {"name": call["name"], "arguments": call["arguments"]}
            tool_call = {"id": call["id"], "type": "function", "function": function}
            messages.append({"role": "assistant", "content": None, "tool_calls": [tool_call]})
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": "5"})
            reply = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
            assert reply.choices[0].message.content == "The answer is 5."
            assert reply.choices[0].finish_reason == "stop"
            trace = await admin.finish_session(session.session_id)
            await client.close()
        await gateway.stop()
    (sample,) = trace["samples"]  # the re-rendered tool call equals the sampled ids: one sample
    assert sample["turns"] == [0, 1]
    assert worker.calls[0]["sampling_params"]["temperature"] == 0.7
    by_rid = {c["rid"]: c for c in worker.calls}
    check_sample_against_records(sample, by_rid, trace["turns"])
    assert [t["finish_reason"] for t in trace["turns"]] == ["tool_calls", "stop"]
    observation = sample["response_ids"][len(call_ids) : -len(answer_ids)]
    assert "<|im_start|>tool\n5<|im_end|>" in tok.decode(observation)


async def test_an_ill_formed_tool_call_is_returned_as_text_and_flagged() -> None:
    tok = hf_renderer().tokenizer
    bad = '<tool_call>{"name": add}</tool_call>'
    async with ScriptedWorker([[*tok.encode(bad, add_special_tokens=False)]]) as worker:
        gateway = await scripted_gateway(worker)
        async with GatewayAdmin(gateway.admin_url, gateway.admin_token) as admin:
            session = await admin.create_session("bad-tool")
            client = agent(gateway, session.api_key)
            reply = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "2 + 3?"}], tools=TOOLS
            )
            trace = await admin.finish_session(session.session_id)
            await client.close()
        await gateway.stop()
    assert reply.choices[0].message.content == bad and not reply.choices[0].message.tool_calls
    assert reply.choices[0].finish_reason == "length"  # no end-of-turn token was sampled
    (turn,) = trace["turns"]
    assert turn["ill_formed"] and "not valid JSON" in turn["error"]
    assert trace["samples"][0]["ill_formed"] and trace["samples"][0]["truncated"]


async def test_streaming_plain_text_and_logprobs_with_the_char_policy(
    char_gateway: Gateway, admin: GatewayAdmin, policy: PolicyServer
) -> None:
    session = await admin.create_session("stream")
    client = agent(char_gateway, session.api_key)
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    stream = await client.chat.completions.create(
        model="m", messages=messages, stream=True, logprobs=True
    )
    text, logprobs = "", []
    async for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            logprobs += [e.logprob for e in (choice.logprobs.content if choice.logprobs else [])]
    trace = await admin.finish_session(session.session_id)
    await client.close()
    (record,) = await recorded(policy.url)
    assert (
        text == CharRenderer().parse(record["output_ids"], tools_enabled=False).message["content"]
    )
    assert logprobs == record["output_logprobs"] == trace["samples"][0]["logprobs"]


# -- security ------------------------------------------------------------------------------------


async def test_keys_isolate_sessions_and_placeholders_are_rejected(
    char_gateway: Gateway, admin: GatewayAdmin, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    a = await admin.create_session("req-a")
    b = await admin.create_session("req-b")
    assert a.api_key != b.api_key and a.api_key not in repr(a)
    question = [{"role": "user", "content": "What is 1 + 1?"}]

    async def status_of(key: str | None) -> tuple[int, dict[str, Any]]:
        headers = {} if key is None else {"Authorization": f"Bearer {key}"}
        body = {"model": "m", "messages": question}
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{char_gateway.url}/v1/chat/completions", json=body, headers=headers) as r,
        ):
            return r.status, await r.json()

    for key in (None, "", "EMPTY", "sk-wrong", char_gateway.admin_token, a.api_key + "x"):
        status, body = await status_of(key)
        assert status == 401, key
        assert body["error"]["code"] == "invalid_api_key" and "\n" not in body["error"]["message"]
    with pytest.raises(openai.AuthenticationError):
        await agent(char_gateway, "EMPTY").chat.completions.create(model="m", messages=question)

    for _ in range(2):
        assert (await status_of(a.api_key))[0] == 200
    assert (await status_of(b.api_key))[0] == 200
    trace_b = await admin.finish_session(b.session_id)
    trace_a = await admin.finish_session(a.session_id)
    assert (trace_a["request_id"], trace_a["num_turns"]) == ("req-a", 2)
    assert (trace_b["request_id"], trace_b["num_turns"]) == ("req-b", 1)
    assert not {t["rid"] for t in trace_a["turns"]} & {t["rid"] for t in trace_b["turns"]}
    # Finished sessions: keys dead, traces gone (only ever readable once, by the admin).
    assert (await status_of(a.api_key))[0] == 401
    with pytest.raises(GatewayError) as missing:
        await admin.finish_session(a.session_id)
    assert missing.value.status == 404

    c = await admin.create_session("req-c")
    no_turns = {"prompt_tokens": 0, "completion_tokens": 0, "reused_prompt_tokens": 0}
    assert await admin.drop_session(c.session_id) == no_turns  # what it spent: nothing
    assert await admin.drop_session(c.session_id) is None  # gone
    assert (await status_of(c.api_key))[0] == 401
    for key in (a.api_key, b.api_key, c.api_key):
        assert key not in caplog.text
    assert "session finished" in caplog.text


async def test_admin_routes_need_the_admin_token(char_gateway: Gateway) -> None:
    session_key = None
    async with GatewayAdmin(char_gateway.admin_url, char_gateway.admin_token) as good:
        session_key = (await good.create_session("ok")).api_key
    for token in ("wrong-token", "", session_key):
        async with GatewayAdmin(char_gateway.admin_url, token) as bad:
            with pytest.raises(GatewayError) as denied:
                await bad.create_session("nope")
            assert denied.value.status == 401
    async with aiohttp.ClientSession() as http:
        for method, path in (("POST", "/admin/sessions"), ("DELETE", "/admin/sessions/x")):
            async with http.request(method, char_gateway.admin_url + path, json={}) as response:
                assert response.status == 401
    assert len(char_gateway.sessions) == 1


async def test_bad_session_parameters_are_400(admin: GatewayAdmin) -> None:
    for kwargs in ({"sampling": {"temprature": 1.0}}, {"max_turns": 0}, {"max_context": "8k"}):
        with pytest.raises(GatewayError) as bad:
            await admin.create_session("x", **kwargs)
        assert bad.value.status == 400
    with pytest.raises(GatewayError):
        await admin.create_session("")


# -- limits --------------------------------------------------------------------------------------


async def test_past_the_turn_limit_a_turn_ends_at_once_with_length(
    char_gateway: Gateway, admin: GatewayAdmin
) -> None:
    """Not a 429, which SDKs retry for minutes of the rollout's deadline: an empty `length`
    turn, which agent loops stop on, costing no sample and no backend call."""
    session = await admin.create_session("limited", max_turns=2)
    client = agent(char_gateway, session.api_key)
    messages = [{"role": "user", "content": "What is 5 + 5?"}]
    for _ in range(2):
        await client.chat.completions.create(model="m", messages=messages)
    over = await client.chat.completions.create(model="m", messages=messages)
    assert over.choices[0].finish_reason == "length"
    assert over.choices[0].message.content == "" and not over.choices[0].message.tool_calls
    assert over.usage.completion_tokens == 0
    trace = await admin.finish_session(session.session_id)
    await client.close()
    assert trace["num_turns"] == 2 and trace["limits"]["rejected_turns"] == 1


async def test_context_limit_caps_max_tokens_and_a_full_context_finishes_with_length() -> None:
    r = hf_renderer()
    messages = [{"role": "user", "content": "Count to ten."}]
    n_prompt = len(r.render(messages, None))
    script = r.tokenizer.encode("1 2 3 4 5", add_special_tokens=False)
    async with ScriptedWorker([script]) as worker:
        gateway = await scripted_gateway(worker)
        async with GatewayAdmin(gateway.admin_url, gateway.admin_token) as admin:
            capped = await admin.create_session("cap", max_context=n_prompt + 2)
            full = await admin.create_session("full", max_context=n_prompt)
            client = agent(gateway, capped.api_key)
            reply = await client.chat.completions.create(model="m", messages=messages)
            assert reply.choices[0].finish_reason == "length"
            assert reply.usage.completion_tokens == 2
            client_full = agent(gateway, full.api_key)
            reply = await client_full.chat.completions.create(model="m", messages=messages)
            assert reply.choices[0].finish_reason == "length"
            assert reply.choices[0].message.content == "" and reply.usage.completion_tokens == 0
            capped_trace = await admin.finish_session(capped.session_id)
            full_trace = await admin.finish_session(full.session_id)
            await client.close()
            await client_full.close()
        await gateway.stop()
    assert len(worker.calls) == 1  # the full-context turn never reached the backend
    assert worker.calls[0]["sampling_params"]["max_new_tokens"] == 2
    assert capped_trace["samples"][0]["truncated"] is True
    assert full_trace["turns"][0]["context_limited"] and full_trace["samples"] == []
    assert full_trace["limits"]["context_limited_turns"] == 1


# -- backends ------------------------------------------------------------------------------------


async def test_openai_pass_through_has_no_token_capture_and_never_forwards_agent_keys() -> None:
    async with ScriptedWorker() as upstream:
        backend = OpenAIBackend(f"{upstream.url}/v1", api_key="upstream-key", model="ref-model")
        assert "upstream-key" not in repr(backend)
        async with (
            Gateway(backend) as gateway,
            GatewayAdmin(gateway.admin_url, gateway.admin_token) as admin,
        ):
            session = await admin.create_session("eval", sampling={"temperature": 0.2})
            client = agent(gateway, session.api_key)
            reply = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], tools=TOOLS
            )
            assert reply.choices[0].message.content == "upstream says hi"
            trace = await admin.finish_session(session.session_id)
            await client.close()
    assert trace["token_capture"] is False and trace["samples"] == []
    assert trace["num_turns"] == 1 and trace["usage"]["completion_tokens"] == 3
    assert upstream.openai_auth == ["Bearer upstream-key"]
    sent = upstream.calls[0]["openai"]
    assert sent["model"] == "ref-model" and sent["temperature"] == 0.2 and sent["tools"] == TOOLS


async def test_an_unreachable_backend_is_a_one_line_502() -> None:
    async with ScriptedWorker() as dead:
        url = dead.url
    async with (
        Gateway(SGLangBackend(url), CharRenderer()) as gateway,
        GatewayAdmin(gateway.admin_url, gateway.admin_token) as admin,
    ):
        session: GatewaySession = await admin.create_session("down")
        client = agent(gateway, session.api_key, max_retries=0)
        with pytest.raises(openai.InternalServerError) as failed:
            await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}]
            )
        await client.close()
    assert failed.value.status_code == 502 and "unreachable" in str(failed.value)


async def test_models_and_health(char_gateway: Gateway, admin: GatewayAdmin) -> None:
    session = await admin.create_session("models")
    client = agent(char_gateway, session.api_key)
    assert [m.id for m in (await client.models.list()).data] == ["tiny"]
    await client.close()
    async with aiohttp.ClientSession() as http, http.get(f"{char_gateway.url}/health") as r:
        assert await r.json() == {
            "status": "ok",
            "sessions": 1,
            "backend": "sglang",
            "token_capture": True,
        }


@pytest.mark.parametrize(
    ("usage", "taken"),
    [
        ({"prompt_tokens": 12, "completion_tokens": 3}, True),
        ({"prompt_tokens": "12"}, False),  # not counts: unknown, never a cost computed from it
        (None, False),  # a gateway that predates the usage in its answer
    ],
)
async def test_a_dropped_sessions_usage_is_taken_only_as_counts(usage, taken):
    """What a dropped session spent counts only as whole numbers; else its tokens are unknown."""
    from aiohttp import web

    async def drop(request: web.Request) -> web.Response:
        answer = {"session_id": request.match_info["sid"], "dropped": True}
        return web.json_response(answer | ({"usage": usage} if usage is not None else {}))

    app = web.Application()
    app.router.add_delete("/admin/sessions/{sid}", drop)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with GatewayAdmin(f"http://127.0.0.1:{port}", "t") as admin:
            assert await admin.drop_session("s1") == (usage if taken else None)
    finally:
        await runner.cleanup()


async def test_an_agent_gone_mid_request_is_one_line_not_a_traceback(
    char_gateway: Gateway, admin: GatewayAdmin, caplog: pytest.LogCaptureFixture
) -> None:
    """A session's agent stopped while it sent a turn (its body cut short): the gateway logs
    one line and serves the next request as before."""
    session = await admin.create_session("gone")
    host, port = char_gateway.url.removeprefix("http://").split(":")
    _reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {session.api_key}\r\nContent-Length: 1000\r\n\r\n".encode()
        + b'{"model": "m", "messa'
    )
    await writer.drain()
    await asyncio.sleep(0.2)  # the gateway is reading the body
    writer.transport.abort()  # a reset, as a killed agent's socket sends
    await asyncio.sleep(0.2)
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]
    assert (await admin.stats())["sessions"] == 1
