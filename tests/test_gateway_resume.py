"""Turns the backend aborts are resumed by the gateway (gateway.resume), over the real wire.

OpenAI SDK -> Gateway -> SGLangBackend -> PolicyServer. The toy is paced (`token_delay`) so its
generations are in flight to abort, and made to never end a turn on its own (<|im_end|> all but
impossible), so every turn runs to max_tokens and is aborted mid-way. The worker records every
/generate call; a resumed turn's tokens and log-probs must be exactly those calls' outputs, in
order, each call's input the prompt plus the tokens before it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiohttp import web

from agentcore_rollout.gateway import Gateway, GatewayAdmin, ResumePolicy, SGLangBackend
from agentcore_rollout.gateway.resume import continuation_seed
from agentcore_rollout.local.policy import CharRenderer, PolicyServer, TinyPolicy
from agentcore_rollout.local.policy.tokenizer import IM_END_ID, CharTokenizer
from agentcore_rollout.serving.server import Server

from .test_gateway import agent, recorded

pytestmark = pytest.mark.component

TURN = {"temperature": 1.0, "max_tokens": 80}


def endless_policy(seed: int) -> TinyPolicy:
    """The toy with <|im_end|> all but impossible: its turns end only at max_tokens."""
    policy = TinyPolicy(seed)
    policy.params["bias"][IM_END_ID] = -40.0
    return policy


@pytest.fixture
async def paced() -> AsyncIterator[PolicyServer]:
    async with PolicyServer(endless_policy(0), record=True, token_delay=0.003) as server:
        yield server


@pytest.fixture
async def gateway(paced: PolicyServer) -> AsyncIterator[tuple[Gateway, GatewayAdmin]]:
    async with (
        Gateway(SGLangBackend(paced.url), CharRenderer()) as gateway,
        GatewayAdmin(gateway.admin_url, gateway.admin_token) as admin,
    ):
        yield gateway, admin


async def post(url: str, body: dict[str, Any]) -> None:
    async with aiohttp.ClientSession() as http, http.post(url, json=body) as response:
        assert response.status == 200, await response.text()


async def in_flight(server: PolicyServer, tokens: int = 8) -> str:
    """The rid of a paced generation in flight, once it has had time for a few tokens."""
    for _ in range(2000):
        if server.worker._paced:
            await asyncio.sleep(tokens * server.worker.token_delay)
            return server.worker._paced[0].rid
        await asyncio.sleep(0.002)
    raise AssertionError("no generation went in flight")


def calls_of(turn: dict[str, Any], records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The worker's /generate calls for one turn: its rid, then `<rid>.1`, `<rid>.2`, ..."""
    rid = turn["rid"]
    calls = [r for r in records if r["rid"] == rid or r["rid"].startswith(f"{rid}.")]
    return sorted(calls, key=lambda r: int(r["rid"][len(rid) + 1 :] or 0))


def check_turns_against_calls(trace: dict[str, Any], records: list[dict[str, Any]]) -> None:
    """Each turn's tokens, log-probs and per-token versions in its sample are its calls',
    concatenated; each call's input is the turn's prompt plus the tokens sampled before it."""
    for sample in trace["samples"]:
        full = sample["prompt_ids"] + sample["response_ids"]
        n_prompt = len(sample["prompt_ids"])
        versions = [v for v, n in sample["version_runs"] for _ in range(n)]
        assert len(versions) == len(sample["response_ids"])
        for index in sample["turns"]:
            turn = trace["turns"][index]
            calls = calls_of(turn, records)
            assert len(calls) == turn["resumed"] + 1
            prompt = calls[0]["input_ids"]
            assert full[: len(prompt)] == prompt
            sampled: list[int] = []
            for call in calls:
                assert call["input_ids"] == prompt + sampled
                start = len(call["input_ids"]) - n_prompt
                end = start + len(call["output_ids"])
                assert sample["response_ids"][start:end] == call["output_ids"]
                assert sample["logprobs"][start:end] == call["output_logprobs"]
                assert versions[start:end] == [call["weight_version"]] * len(call["output_ids"])
                sampled += call["output_ids"]
            assert turn["completion_tokens"] == len(sampled)


async def test_aborted_and_updated_turns_resume_and_equal_what_the_worker_sampled(
    paced: PolicyServer, gateway: tuple[Gateway, GatewayAdmin], tmp_path: Path
) -> None:
    gw, admin = gateway
    new_weights = endless_policy(1)
    new_weights.save(tmp_path / "v1.npz")
    update = {
        "model_path": str(tmp_path / "v1.npz"),
        "weight_version": "1",
        "abort_all_requests": True,
    }
    session = await admin.create_session("resume", sampling={**TURN, "seed": 11})
    client = agent(gw, session.api_key)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 3 + 4?"}]

    async def abort_one() -> None:
        await post(f"{paced.url}/abort_request", {"rid": await in_flight(paced)})

    async def update_weights() -> None:
        await in_flight(paced)
        await post(f"{paced.url}/update_weights_from_disk", update)

    for interrupt in (abort_one, None, update_weights, abort_one):
        driver = asyncio.create_task(interrupt()) if interrupt else None
        reply = await client.chat.completions.create(model="policy", messages=messages)
        if driver:
            await driver
        assert reply.choices[0].finish_reason == "length"
        assert reply.usage.completion_tokens == TURN["max_tokens"]
        content = reply.choices[0].message.content or ""
        messages += [{"role": "assistant", "content": content}, {"role": "user", "content": "2?"}]
    await client.close()
    trace = await admin.finish_session(session.session_id)
    records = await recorded(paced.url)

    assert [t["resumed"] for t in trace["turns"]] == [1, 0, 1, 1]
    assert [t["finish_reason"] for t in trace["turns"]] == ["length"] * 4
    check_turns_against_calls(trace, records)
    updated = trace["turns"][2]
    (old, n_old), (new, n_new) = updated["version_runs"]
    assert (old, new, n_old + n_new) == ("0", "1", 80) and n_old > 0 and n_new > 0
    assert (updated["min_weight_version"], updated["max_weight_version"]) == ("0", "1")
    assert updated["weight_version"] == "1"  # the last call's, as before
    assert trace["turns"][3]["version_runs"] == [["1", 80]]
    (sample,) = trace["samples"]  # the turns merged: one sample, both versions
    assert (sample["min_weight_version"], sample["max_weight_version"]) == ("0", "1")
    assert sample["resumed"] == 3 and sample["weight_versions"] == ["0", "0", "1", "1"]
    # A continuation's seed is derived from the turn's, not the same draws again.
    first, second = calls_of(trace["turns"][0], records)
    assert first["sampling_params"]["seed"] == 11
    n = len(first["output_ids"])
    assert second["sampling_params"]["seed"] == continuation_seed(11, n) != 11
    assert second["sampling_params"]["max_new_tokens"] == 80 - n


async def test_a_streamed_turn_keeps_going_across_an_abort(
    paced: PolicyServer, gateway: tuple[Gateway, GatewayAdmin]
) -> None:
    gw, admin = gateway
    session = await admin.create_session("stream", sampling=TURN)
    client = agent(gw, session.api_key)
    messages = [{"role": "user", "content": "What is 2 + 2?"}]

    async def abort_soon() -> None:
        await post(f"{paced.url}/abort_request", {"rid": await in_flight(paced)})

    driver = asyncio.create_task(abort_soon())
    stream = await client.chat.completions.create(
        model="m", messages=messages, stream=True, logprobs=True
    )
    text, logprobs, finish = "", [], None
    async for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            logprobs += [e.logprob for e in (choice.logprobs.content if choice.logprobs else [])]
            finish = choice.finish_reason or finish
    await driver
    await client.close()
    trace = await admin.finish_session(session.session_id)
    check_turns_against_calls(trace, await recorded(paced.url))
    assert trace["turns"][0]["resumed"] == 1
    assert finish == "length" and len(logprobs) == 80
    assert logprobs == trace["samples"][0]["logprobs"]
    assert text == CharTokenizer().decode(trace["samples"][0]["response_ids"])


# -- waits, give-ups and stop strings, against a worker answering from a script ------------------


class CannedWorker(Server):
    """SGLang's /generate answering each call with the next canned answer: (finish type, text)
    in the char vocabulary, or an HTTP status to fail with; every call's body is kept."""

    def __init__(self, answers: list[tuple[str, str] | int]) -> None:
        super().__init__()
        self.answers = answers
        self.calls: list[dict[str, Any]] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.add_routes([web.post("/generate", self._generate)])
        return app

    async def _generate(self, request: web.Request) -> web.Response:
        body = json.loads(await request.text())
        self.calls.append(body)
        answer = self.answers[min(len(self.calls), len(self.answers)) - 1]
        if isinstance(answer, int):
            return web.json_response({"error": {"message": "updating weights"}}, status=answer)
        kind, text = answer
        ids = CharTokenizer().encode(text)
        meta = {
            "finish_reason": {"type": kind},
            "weight_version": str(len(self.calls)),
            "output_token_logprobs": [[-0.5, t, None] for t in ids],
        }
        return web.json_response({"output_ids": ids, "meta_info": meta})


async def one_turn(
    worker: CannedWorker, sampling: dict[str, Any], policy: ResumePolicy | None = None
) -> tuple[int, dict[str, Any], dict[str, Any]]:
    """One chat turn through a gateway on `worker`: status, answer body, trace."""
    async with (
        Gateway(SGLangBackend(worker.url), CharRenderer(), resume=policy) as gw,
        GatewayAdmin(gw.admin_url, gw.admin_token) as admin,
    ):
        session = await admin.create_session("canned", sampling=sampling)
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        headers = {"Authorization": f"Bearer {session.api_key}"}
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{gw.url}/v1/chat/completions", json=body, headers=headers) as response,
        ):
            answer = await response.json()
            status = response.status
        return status, answer, await admin.finish_session(session.session_id)


async def test_a_resume_waits_out_an_updating_backend_and_finds_a_stop_string_across_the_seam():
    # "12" aborted, the backend away twice (503, then 502), then "34|56": stop "23" straddles.
    answers: list[tuple[str, str] | int] = [("abort", "12"), 503, 502, ("stop", "3456")]
    async with CannedWorker(answers) as worker:
        quick = ResumePolicy(first_backoff=0.01)
        status, answer, trace = await one_turn(worker, {"stop": ["23"], "seed": 5}, quick)
    assert status == 200, answer
    choice = answer["choices"][0]
    # Cut after the token completing "23"; the content keeps the stop string, as the gateway's
    # content does for one the backend matched (it parses the sampled ids).
    assert choice["finish_reason"] == "stop" and choice["message"]["content"] == "123"
    (turn,) = trace["turns"]
    assert turn["resumed"] == 1 and turn["completion_tokens"] == 3  # "123": tokens after go
    assert turn["version_runs"] == [["1", 2], ["4", 1]]
    assert trace["samples"][0]["response_ids"] == CharTokenizer().encode("123")
    assert [c["rid"] for c in worker.calls[1:]] == [f"{turn['rid']}.1"] * 3
    assert worker.calls[3]["input_ids"] == worker.calls[0]["input_ids"] + CharTokenizer().encode(
        "12"
    )


async def test_a_turn_aborted_again_and_again_without_a_token_is_a_one_line_503() -> None:
    async with CannedWorker([("abort", "7"), ("abort", "")]) as worker:
        policy = ResumePolicy(max_idle_aborts=2, first_backoff=0.01)
        status, answer, trace = await one_turn(worker, {"max_tokens": 10}, policy)
    assert status == 503
    message = answer["error"]["message"]
    assert "aborted this turn 3 times in a row without a new token" in message
    assert "\n" not in message
    assert len(worker.calls) == 4  # the first call, then three aborts with nothing new
    assert trace["num_turns"] == 0


async def test_a_backend_that_stays_away_ends_the_resume_within_its_wait() -> None:
    async with CannedWorker([("abort", "7"), 503]) as worker:
        policy = ResumePolicy(max_wait=0.3, first_backoff=0.02, max_backoff=0.05)
        status, answer, _ = await one_turn(worker, {"max_tokens": 10}, policy)
    assert status == 503
    assert "could not be resumed within 0.3s" in answer["error"]["message"]
    assert 4 <= len(worker.calls) <= 20


# -- a Hugging Face model: the resumed tokens' log-probs, recomputed -----------------------------


async def test_resumed_hf_tokens_match_a_recomputation_under_the_version_that_sampled_each(
    tmp_path: Path,
) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from agentcore_rollout.local.policy import SamplingParams
    from agentcore_rollout.local.policy.hf import HFPolicy, load_causal_lm
    from agentcore_rollout.local.policy.sampling import sampling_logprobs

    from .gateway_support import hf_renderer
    from .test_hf_policy import build_model, wait_for_tokens

    dirs = {"0": build_model(tmp_path / "a", 0), "1": build_model(tmp_path / "b", 1)}
    sampling = {"temperature": 1.0, "top_p": 0.95, "max_tokens": 300, "seed": 0}  # runs 300
    update = {"model_path": str(dirs["1"]), "weight_version": "1", "abort_all_requests": True}
    async with (
        PolicyServer(HFPolicy(dirs["0"]), record=True) as server,
        Gateway(SGLangBackend(server.url), hf_renderer()) as gw,
        GatewayAdmin(gw.admin_url, gw.admin_token) as admin,
    ):
        assert isinstance(server.policy, HFPolicy)
        session = await admin.create_session("hf", sampling=sampling)
        client = agent(gw, session.api_key)

        async def update_weights() -> None:
            await wait_for_tokens(server.policy, 20)
            await post(f"{server.url}/update_weights_from_disk", update)

        driver = asyncio.create_task(update_weights())
        messages = [{"role": "user", "content": "Tell me a long story."}]
        reply = await client.chat.completions.create(model="policy", messages=messages)
        await driver
        await client.close()
        trace = await admin.finish_session(session.session_id)
        records = await recorded(server.url)
    check_turns_against_calls(trace, records)
    (turn,) = trace["turns"]
    assert turn["resumed"] == 1, turn["version_runs"]
    assert reply.choices[0].finish_reason in ("stop", "length")
    (sample,) = trace["samples"]
    versions = [v for v, n in sample["version_runs"] for _ in range(n)]
    assert {"0", "1"} <= set(versions)
    full, n_prompt = sample["prompt_ids"] + sample["response_ids"], len(sample["prompt_ids"])
    sp = SamplingParams(temperature=1.0, top_p=0.95)
    for version, path in dirs.items():
        with torch.inference_mode():
            logits = load_causal_lm(path)[1](input_ids=torch.tensor([full[:-1]])).logits[0]
        rows = logits.double().numpy()
        positions = [t for t, v in enumerate(versions) if v == version]
        expected = [
            sampling_logprobs(rows[n_prompt + t - 1], sp)[full[n_prompt + t]] for t in positions
        ]
        captured = [sample["logprobs"][t] for t in positions]
        np.testing.assert_allclose(captured, expected, atol=1e-4, rtol=0)
