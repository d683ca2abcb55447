"""The toy CPU policy: tokenizer, sampler (true log-probs), training hooks, and the HTTP server.

HTTP tests go through a real server on a free loopback port. Sampler tests recompute the
sampling distribution with an independent, deliberately naive reference implementation.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from agentcore_rollout.local.policy import CharTokenizer, PolicyServer, SamplingParams, TinyPolicy
from agentcore_rollout.local.policy.sampling import draw, sampling_logprobs
from agentcore_rollout.local.policy.tokenizer import IM_END_ID, IM_START_ID, VOCAB_SIZE, char_id

pytestmark = pytest.mark.component

REPO = Path(__file__).resolve().parents[1]
TOK = CharTokenizer()
Session = aiohttp.ClientSession
QUESTION = [{"role": "user", "content": "What is 3 + 4?"}]


# -- helpers ------------------------------------------------------------------------------------


def reference_distribution(
    logits: np.ndarray, temperature: float, top_p: float, top_k: int
) -> np.ndarray:
    """softmax(logits / T), keep the top_k, then the smallest prefix with mass >= top_p."""
    z = logits / temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    ranked = sorted(range(len(p)), key=lambda i: (-p[i], i))
    if top_k > 0:
        ranked = ranked[:top_k]
    mass = sum(p[i] for i in ranked)
    kept, acc = [], 0.0
    for i in ranked:
        if acc >= top_p:
            break
        kept.append(i)
        acc += p[i] / mass
    q = np.zeros_like(p)
    q[kept] = p[kept]
    return q / q.sum()


def scripted_policy(text: str) -> TinyPolicy:
    """A policy that (after a prompt ending in newline) writes `text` then <|im_end|>: a 30-logit
    margin per step makes any other token a ~1e-11 event. `text` must not repeat a character."""
    policy = TinyPolicy(0)
    for value in policy.params.values():
        value[:] = 0.0
    ids = [*TOK.encode("\n" + text), IM_END_ID]
    for prev, nxt in itertools.pairwise(ids):
        policy.params["bigram"][prev, nxt] = 30.0
    return policy


def chat_prompt(messages: list[dict[str, Any]] = QUESTION) -> list[int]:
    return TOK.apply_chat_template(messages)


@pytest.fixture
async def server() -> AsyncIterator[PolicyServer]:
    async with PolicyServer(seed=0, record=True) as s:
        yield s


@pytest.fixture
async def http() -> AsyncIterator[Session]:
    async with aiohttp.ClientSession() as session:
        yield session


async def call(
    http: Session, server: PolicyServer, path: str, body: Any = None, method: str = "POST"
) -> tuple[int, Any]:
    data = body if isinstance(body, str | bytes) else json.dumps(body)
    async with http.request(method, server.url + path, data=data) as r:
        text = await r.text()
        return r.status, (json.loads(text) if r.content_type == "application/json" else text)


# -- tokenizer ----------------------------------------------------------------------------------


def test_tokenizer_round_trips_and_keeps_specials_single() -> None:
    text = "<|im_start|>user\nWhat is 3 + 4?<|im_end|>\n"
    ids = TOK.encode(text)
    assert (
        ids[0] == IM_START_ID
        and ids[-2] == IM_END_ID
        and len(ids) == len("user\nWhat is 3 + 4?\n") + 2
    )
    assert TOK.decode(ids) == text
    assert TOK.decode(ids, skip_special_tokens=True) == "user\nWhat is 3 + 4?\n"
    assert TOK.vocab_size == VOCAB_SIZE == 100 and max(TOK.encode("~ \n")) < VOCAB_SIZE
    assert TOK.decode(TOK.encode("tab\tü")) == "tab??"  # lossy by design, never an error
    with pytest.raises(ValueError, match="not in the vocabulary"):
        TOK.decode([VOCAB_SIZE])


def test_chat_template_is_chatml_with_tool_calls_as_text() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "H"}, {"type": "text", "text": "i"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "1", "content": "7"},
    ]
    expected = (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        '<|im_start|>assistant\n\n<tool_call>{"name": "add", "arguments": "{}"}</tool_call>'
        "<|im_end|>\n"
        "<|im_start|>tool\n7<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert TOK.render_chat(messages) == expected
    assert TOK.apply_chat_template(messages) == TOK.encode(expected)
    assert TOK.decode(TOK.apply_chat_template(messages[:1], add_generation_prompt=False)) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
    )


# -- sampler ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("temperature", "top_p", "top_k"),
    [(1.0, 1.0, -1), (0.7, 0.8, -1), (1.3, 1.0, 5), (0.5, 0.6, 3), (2.0, 0.95, -1)],
)
def test_logprobs_are_log_probabilities_of_the_sampling_distribution(
    temperature: float, top_p: float, top_k: int
) -> None:
    policy = TinyPolicy(3)
    sp = SamplingParams(
        temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=12, ignore_eos=True
    )
    rng = np.random.default_rng(0)
    prompt = chat_prompt()
    for _ in range(5):
        gen = policy.generate(prompt, sp, rng)
        assert len(gen.output_ids) == len(gen.logprobs) == 12
        for t, (token, logprob) in enumerate(zip(gen.output_ids, gen.logprobs, strict=True)):
            q = reference_distribution(
                policy.logits(prompt, gen.output_ids[:t]), temperature, top_p, top_k
            )
            assert q[token] > 0, "sampled a token outside the distribution's support"
            assert logprob == pytest.approx(math.log(q[token]), abs=1e-9)


def test_greedy_is_argmax_deterministic_and_reports_raw_log_softmax() -> None:
    policy, prompt = TinyPolicy(1), chat_prompt()
    sp = SamplingParams(temperature=0.0, max_new_tokens=10, ignore_eos=True)
    a = policy.generate(prompt, sp, np.random.default_rng(1))
    b = policy.generate(prompt, sp, np.random.default_rng(2))
    assert a.output_ids == b.output_ids and a.logprobs == b.logprobs
    for t, token in enumerate(a.output_ids):
        logits = policy.logits(prompt, a.output_ids[:t])
        assert token == int(np.argmax(logits))
        expected = logits[token] - np.log(np.exp(logits).sum())
        assert a.logprobs[t] == pytest.approx(expected, abs=1e-9)


def test_lower_temperature_concentrates_mass() -> None:
    logits = TinyPolicy(0).logits(chat_prompt())
    entropies, top_mass = [], []
    for temperature in (2.0, 1.0, 0.5, 0.25):
        q = np.exp(sampling_logprobs(logits, SamplingParams(temperature=temperature)))
        entropies.append(float(-(q[q > 0] * np.log(q[q > 0])).sum()))
        top_mass.append(float(q.max()))
    assert entropies == sorted(entropies, reverse=True) and len(set(entropies)) == 4
    assert top_mass == sorted(top_mass) and top_mass[-1] > 0.5


def test_top_p_samples_only_from_the_nucleus_with_the_right_frequencies() -> None:
    logits = TinyPolicy(0).logits(chat_prompt())
    sp = SamplingParams(temperature=1.5, top_p=0.7)
    q = reference_distribution(logits, 1.5, 0.7, -1)
    nucleus = set(np.flatnonzero(q))
    assert 2 <= len(nucleus) < 20
    rng, logprobs = np.random.default_rng(0), sampling_logprobs(logits, sp)
    draws = np.array([draw(logprobs, sp, rng) for _ in range(4000)])
    assert set(draws.tolist()) <= nucleus
    assert set(draws.tolist()) == nucleus  # really sampling, not collapsing onto the top token
    freq = np.bincount(draws, minlength=VOCAB_SIZE) / len(draws)
    assert np.abs(freq - q).max() < 0.03


def test_max_new_tokens_is_honoured() -> None:
    policy = TinyPolicy(0)
    sp = SamplingParams(max_new_tokens=7, ignore_eos=True)
    gen = policy.generate(chat_prompt(), sp, np.random.default_rng(0))
    assert len(gen.output_ids) == 7 and gen.finish_reason == {"type": "length", "length": 7}
    empty = policy.generate(
        chat_prompt(), SamplingParams(max_new_tokens=0), np.random.default_rng()
    )
    assert empty.output_ids == [] and empty.finish_reason == {"type": "length", "length": 0}


@pytest.mark.parametrize(
    ("kwargs", "ids_text", "text", "finish"),
    [
        ({}, "12-3 x<|im_end|>", "12-3 x", {"type": "stop", "matched": IM_END_ID}),
        (
            {"skip_special_tokens": False, "no_stop_trim": True},
            "12-3 x<|im_end|>",
            "12-3 x<|im_end|>",
            {"type": "stop", "matched": IM_END_ID},
        ),
        ({"stop": ("-3",)}, "12-3", "12", {"type": "stop", "matched": "-3"}),
        ({"stop": ("3 x", "2-")}, "12-", "1", {"type": "stop", "matched": "2-"}),
        (
            {"stop": ("-3",), "no_stop_trim": True},
            "12-3",
            "12-3",
            {"type": "stop", "matched": "-3"},
        ),
        (
            {"stop_token_ids": (char_id("-"),)},
            "12-",
            "12",
            {"type": "stop", "matched": char_id("-")},
        ),
        ({"max_new_tokens": 3}, "12-", "12-", {"type": "length", "length": 3}),
    ],
)
def test_stop_strings_and_stop_token_ids(
    kwargs: dict[str, Any], ids_text: str, text: str, finish: dict[str, Any]
) -> None:
    policy = scripted_policy("12-3 x")
    gen = policy.generate(chat_prompt(), SamplingParams(**kwargs), np.random.default_rng(0))
    assert gen.finish_reason == finish
    assert gen.output_ids == TOK.encode(ids_text)  # stop tokens/strings stay in the ids...
    assert gen.text == text  # ...and are trimmed from the text unless no_stop_trim


def test_untrained_policy_sometimes_answers_single_digit_sums() -> None:
    policy, rng = TinyPolicy(0), np.random.default_rng(0)
    sp = SamplingParams(temperature=1.0, max_new_tokens=32)
    lengths, correct = [], 0
    for _ in range(400):
        a, b = rng.integers(0, 10, size=2)
        prompt = chat_prompt([{"role": "user", "content": f"What is {a} + {b}?"}])
        gen = policy.generate(prompt, sp, rng)
        correct += gen.text.strip() == str(a + b)
        lengths.append(len(gen.output_ids))
    assert 0.05 <= correct / 400 <= 0.30
    assert 1.5 <= np.mean(lengths) <= 6 and max(lengths) <= 32


# -- training hooks and persistence -------------------------------------------------------------


def test_training_logprobs_match_sampling_logprobs_without_truncation() -> None:
    policy, prompt = TinyPolicy(2), chat_prompt()
    for temperature in (1.0, 0.6):
        sp = SamplingParams(temperature=temperature, max_new_tokens=10)
        gen = policy.generate(prompt, sp, np.random.default_rng(5))
        logprobs, _ = policy.logprobs_and_grad(prompt, gen.output_ids, temperature=temperature)
        np.testing.assert_allclose(logprobs, gen.logprobs, atol=1e-12)


def test_a_generation_resumed_from_its_tokens_goes_on_as_one_would_have() -> None:
    """A resumed generation's prompt holds the open assistant message: its positions continue,
    so a turn sampled in two calls is scored like one (what the learner recomputes)."""
    policy = TinyPolicy(seed=3)
    policy.params["bias"][[IM_END_ID, IM_START_ID]] = -40.0  # the turn stays open
    prompt = policy.tokenizer.encode("<|im_start|>user\n3+4?<|im_end|>\n<|im_start|>assistant\n")
    params = SamplingParams(temperature=1.0, max_new_tokens=12, ignore_eos=True)
    whole = policy.generate(prompt, params, np.random.default_rng(0))
    head = whole.output_ids[:5]
    assert policy.written(prompt) == 0 and policy.written([*prompt, *head]) == 5
    tail, _ = policy.logprobs_and_grad([*prompt, *head], whole.output_ids[5:])
    full, _ = policy.logprobs_and_grad(prompt, whole.output_ids)
    assert np.allclose(tail, full[5:]) and np.allclose(full, whole.logprobs)
    closed = [*prompt, *head, IM_END_ID]
    assert policy.written(closed) == 0


def test_gradient_is_exact_and_a_step_up_increases_the_sequence_logprob() -> None:
    policy, prompt = TinyPolicy(0), chat_prompt()
    completion = [*TOK.encode("12"), IM_END_ID]
    before, grads = policy.logprobs_and_grad(prompt, completion)
    # Finite differences on a few entries that the sequence touches.
    for name, index in [
        ("bias", (char_id("2"),)),
        ("bigram", (char_id("1"), char_id("2"))),
        ("cue", (7, 1, IM_END_ID)),
        ("position", (2, char_id("5"))),
    ]:
        eps, original = 1e-6, policy.params[name][index]
        policy.params[name][index] = original + eps
        up = policy.logprobs_and_grad(prompt, completion)[0].sum()
        policy.params[name][index] = original - eps
        down = policy.logprobs_and_grad(prompt, completion)[0].sum()
        policy.params[name][index] = original
        assert grads[name][index] == pytest.approx((up - down) / (2 * eps), abs=1e-6)
    version = policy.version
    policy.apply_update(grads, lr=0.5)
    after, _ = policy.logprobs_and_grad(prompt, completion)
    assert after.sum() > before.sum() + 0.1
    assert policy.version == version + 1 and policy.weight_version == str(version + 1)
    _, negative = policy.logprobs_and_grad(prompt, completion, weights=[-1.0, -1.0, -1.0])
    policy.apply_update(negative, lr=0.5)
    assert policy.logprobs_and_grad(prompt, completion)[0].sum() < after.sum()


def test_apply_update_rejects_bad_updates_without_changing_anything() -> None:
    policy = TinyPolicy(0)
    snapshot = {name: value.copy() for name, value in policy.params.items()}
    for update in ({"nope": np.zeros(3)}, {"bias": np.zeros(3)}, {"bias": np.full(100, np.nan)}):
        with pytest.raises(ValueError, match="parameter"):
            policy.apply_update({"cue": np.ones((32, 8, 100)), **update}, lr=1.0)
    assert all(np.array_equal(snapshot[k], v) for k, v in policy.params.items())
    assert policy.version == 0


def test_initialisation_is_deterministic_in_the_seed() -> None:
    a, b, c = TinyPolicy(7).params, TinyPolicy(7).params, TinyPolicy(8).params
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["bigram"], c["bigram"])


def test_save_load_round_trip_gives_identical_outputs(tmp_path: Path) -> None:
    source = TinyPolicy(1)
    source.apply_update({"bigram": np.random.default_rng(0).normal(size=(100, 100))}, lr=0.3)
    source.save(tmp_path / "p.npz")
    target = TinyPolicy(2)
    target.load(tmp_path / "p.npz", weight_version="step-1")
    assert target.weight_version == "step-1" and target.version == 1
    sp = SamplingParams(temperature=1.0, max_new_tokens=20)
    for seed in range(5):
        a = source.generate(chat_prompt(), sp, np.random.default_rng(seed))
        b = target.generate(chat_prompt(), sp, np.random.default_rng(seed))
        assert (a.output_ids, a.logprobs, a.text) == (b.output_ids, b.logprobs, b.text)
    (tmp_path / "bad.npz").write_text("not a zip")
    np.savez(tmp_path / "shape.npz", bias=np.zeros(3))
    for bad in ("bad.npz", "shape.npz", "missing.npz"):
        with pytest.raises(ValueError):
            target.load(tmp_path / bad)
    assert target.version == 1


# -- HTTP: SGLang native ------------------------------------------------------------------------


async def test_server_binds_loopback_on_a_free_port(server: PolicyServer, http: Session) -> None:
    assert server.host == "127.0.0.1" and server.port > 0
    assert server.url == f"http://127.0.0.1:{server.port}"
    assert [address[0] for address in server._runner.addresses] == ["127.0.0.1"]
    status, info = await call(http, server, "/get_server_info", method="GET")
    assert status == 200 and info["worker_id"] == f"127.0.0.1:{server.port}"


async def test_generate_returns_sglang_shape_with_true_logprobs(
    server: PolicyServer, http: Session
) -> None:
    prompt = chat_prompt()
    body = {
        "input_ids": prompt,
        "sampling_params": {"temperature": 0.8, "top_p": 0.9, "sampling_seed": 11},
        "return_logprob": True,
        "top_logprobs_num": 3,
        "rid": "r-1",
        "some_router_field": {"ignored": True},
    }
    status, out = await call(http, server, "/generate", body)
    assert status == 200
    meta = out["meta_info"]
    assert meta["id"] == "r-1" and meta["prompt_tokens"] == len(prompt)
    assert meta["completion_tokens"] == len(out["output_ids"]) >= 1
    assert meta["finish_reason"]["type"] in ("stop", "length")
    assert meta["weight_version"] == "0"
    assert [e[1] for e in meta["output_token_logprobs"]] == out["output_ids"]
    assert all(e[2] is None for e in meta["output_token_logprobs"])
    assert out["text"] == TOK.decode(out["output_ids"], skip_special_tokens=True)
    for t, (logprob, token, _) in enumerate(meta["output_token_logprobs"]):
        logits = server.policy.logits(prompt, out["output_ids"][:t])
        assert logprob == pytest.approx(
            math.log(reference_distribution(logits, 0.8, 0.9, -1)[token])
        )
        top = [e[0] for e in meta["output_top_logprobs"][t]]
        assert len(top) == 3 and top == sorted(top, reverse=True) and top[0] >= logprob
    again = (await call(http, server, "/generate", body))[1]
    assert again["output_ids"] == out["output_ids"]
    assert again["meta_info"]["output_token_logprobs"] == meta["output_token_logprobs"]


async def test_generate_accepts_text_batches_and_streams(
    server: PolicyServer, http: Session
) -> None:
    status, out = await call(http, server, "/generate", {"text": "What is 1 + 1?"})
    assert status == 200 and out["meta_info"]["prompt_tokens"] == len("What is 1 + 1?")
    assert "output_token_logprobs" not in out["meta_info"]
    batch = {
        "input_ids": [chat_prompt(), [1, 2, 3]],
        "sampling_params": [{"max_new_tokens": 1, "ignore_eos": True}, {"max_new_tokens": 2}],
        "return_logprob": [True, False],
    }
    status, outs = await call(http, server, "/generate", batch)
    assert status == 200 and isinstance(outs, list) and len(outs) == 2
    assert len(outs[0]["output_ids"]) == 1 and "output_token_logprobs" in outs[0]["meta_info"]
    assert "output_token_logprobs" not in outs[1]["meta_info"]
    body = {"text": "hi", "stream": True, "sampling_params": {"sampling_seed": 1}}
    async with http.post(server.url + "/generate", json=body) as r:
        events = [line[6:] for line in (await r.text()).splitlines() if line.startswith("data: ")]
    assert r.content_type == "text/event-stream" and events[-1] == "[DONE]"
    streamed = json.loads(events[-2])
    body["stream"] = False
    assert streamed["output_ids"] == (await call(http, server, "/generate", body))[1]["output_ids"]


async def test_generate_reports_stop_and_length_like_sglang(http: Session) -> None:
    async with PolicyServer(scripted_policy("12-3 x")) as server:
        prompt = chat_prompt()
        cases = [
            ({}, {"type": "stop", "matched": IM_END_ID}, "12-3 x"),
            ({"stop": "-3"}, {"type": "stop", "matched": "-3"}, "12"),
            ({"stop_token_ids": [char_id("3")]}, {"type": "stop", "matched": char_id("3")}, "12-"),
            ({"max_new_tokens": 2}, {"type": "length", "length": 2}, "12"),
        ]
        for sampling, finish, text in cases:
            body = {"input_ids": prompt, "sampling_params": sampling}
            status, out = await call(http, server, "/generate", body)
            assert status == 200
            assert out["meta_info"]["finish_reason"] == finish and out["text"] == text
        chat = {"messages": QUESTION, "max_tokens": 2}
        status, out = await call(http, server, "/v1/chat/completions", chat)
        assert out["choices"][0]["finish_reason"] == "length"
        chat = {"messages": QUESTION, "stop": ["3 x"]}
        status, out = await call(http, server, "/v1/chat/completions", chat)
        choice = out["choices"][0]
        assert (choice["finish_reason"], choice["matched_stop"]) == ("stop", "3 x")
        assert choice["message"]["content"] == "12-"


# -- HTTP: OpenAI -------------------------------------------------------------------------------


async def test_chat_completions_matches_generate(server: PolicyServer, http: Session) -> None:
    chat = {
        "model": "whatever",
        "messages": QUESTION,
        "temperature": 0.9,
        "top_p": 0.95,
        "max_tokens": 16,
        "seed": 5,
        "logprobs": True,
        "top_logprobs": 2,
        "return_token_ids": True,
        "frequency_penalty": 0.0,
        "tools": [{"type": "function", "function": {"name": "add"}}],
    }
    status, out = await call(http, server, "/v1/chat/completions", chat)
    assert status == 200 and out["object"] == "chat.completion" and out["model"] == "whatever"
    choice = out["choices"][0]
    assert choice["message"]["role"] == "assistant" and out["prompt_token_ids"] == chat_prompt()
    generate = {
        "input_ids": chat_prompt(),
        "sampling_params": {"temperature": 0.9, "top_p": 0.95, "max_new_tokens": 16, "seed": 5},
        "return_logprob": True,
    }
    native = (await call(http, server, "/generate", generate))[1]
    assert choice["token_ids"] == native["output_ids"]
    assert choice["message"]["content"] == native["text"]
    content = choice["logprobs"]["content"]
    native_logprobs = [e[0] for e in native["meta_info"]["output_token_logprobs"]]
    assert [e["logprob"] for e in content] == native_logprobs
    assert [e["token"] for e in content] == [TOK.token_text(t) for t in native["output_ids"]]
    for entry in content:
        assert entry["bytes"] == list(entry["token"].encode()) and len(entry["top_logprobs"]) == 2
    assert choice["finish_reason"] == native["meta_info"]["finish_reason"]["type"]
    assert out["usage"] == {
        "prompt_tokens": len(chat_prompt()),
        "completion_tokens": len(native["output_ids"]),
        "total_tokens": len(chat_prompt()) + len(native["output_ids"]),
    }
    chat |= {"stream": True, "stream_options": {"include_usage": True}}
    async with http.post(server.url + "/v1/chat/completions", json=chat) as r:
        lines = [line[6:] for line in (await r.text()).splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(line) for line in lines[:-1]]
    deltas = [c["choices"][0] for c in chunks if c["choices"]]
    assert "".join(d["delta"].get("content", "") for d in deltas) == native["text"]
    streamed = [e for d in deltas if d["logprobs"] for e in d["logprobs"]["content"]]
    assert [e["logprob"] for e in streamed] == [e["logprob"] for e in content]
    assert deltas[-1]["finish_reason"] == choice["finish_reason"]
    assert chunks[-1]["usage"] == out["usage"]


async def test_completions_endpoint(server: PolicyServer, http: Session) -> None:
    body = {"prompt": "What is 2 + 2?", "max_tokens": 4, "logprobs": 1, "seed": 3}
    status, out = await call(http, server, "/v1/completions", body)
    assert status == 200 and out["object"] == "text_completion"
    lp = out["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["text_offset"])
    assert out["usage"]["completion_tokens"] == len(lp["tokens"])
    native = {"text": "What is 2 + 2?", "sampling_params": {"max_new_tokens": 4, "seed": 3}}
    assert out["choices"][0]["text"] == (await call(http, server, "/generate", native))[1]["text"]


# -- HTTP: errors, weights, recording, info -----------------------------------------------------

BAD_REQUESTS = [
    ("/generate", "{not json", "not valid JSON"),
    ("/generate", "[1, 2]", "JSON object"),
    ("/generate", {}, "exactly one of"),
    ("/generate", {"text": "a", "input_ids": [1]}, "exactly one of"),
    ("/generate", {"input_ids": [5, 100]}, "not in the vocabulary"),
    ("/generate", {"input_ids": [5, 1.5]}, "not in the vocabulary"),
    ("/generate", {"text": "a", "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
    ("/generate", {"text": "a", "sampling_params": {"max_new_tokens": "9"}}, "max_new_tokens"),
    ("/generate", {"text": "a", "sampling_params": {"temperature": -0.1}}, "temperature"),
    ("/generate", {"text": "a", "sampling_params": {"top_p": 0}}, "top_p"),
    ("/generate", {"text": "a", "sampling_params": {"top_p": 10**400}}, "top_p"),
    ("/generate", {"text": "a", "sampling_params": {"seed": -1}}, "seed"),
    ("/generate", {"text": "a", "sampling_params": {"top_k": -3}}, "top_k"),
    ("/generate", {"text": "a", "sampling_params": {"stop": [""]}}, "stop"),
    ("/generate", {"text": "a", "sampling_params": {"stop_token_ids": [999]}}, "stop_token_ids"),
    ("/generate", {"text": "a", "sampling_params": {"n": 2}}, "n=2"),
    ("/generate", {"text": "a", "sampling_params": {"regex": "[0-9]+"}}, "regex"),
    ("/generate", {"text": "a", "sampling_params": []}, "sampling_params"),
    ("/generate", {"text": "a", "return_logprob": "yes"}, "return_logprob"),
    ("/generate", {"text": "a", "top_logprobs_num": 99}, "top_logprobs_num"),
    ("/generate", {"text": "a", "rid": 7}, "rid"),
    ("/generate", {"text": ["a", "b"], "sampling_params": [{}]}, "fewer entries"),
    ("/generate", {"text": "x" * 40000}, "longer than the context length"),
    ("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 40000}}, "context length"),
    ("/v1/chat/completions", {"messages": []}, "messages"),
    ("/v1/chat/completions", {"messages": [{"content": "hi"}]}, "role"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, "content"),
    ("/v1/chat/completions", {"messages": QUESTION, "max_tokens": -5}, "max_new_tokens"),
    ("/v1/chat/completions", {"messages": QUESTION, "logprobs": 1}, "logprobs"),
    ("/v1/chat/completions", {"messages": QUESTION, "presence_penalty": 1.0}, "presence_penalty"),
    ("/v1/chat/completions", {"messages": QUESTION, "temperature": float("nan")}, "temperature"),
    (
        "/v1/chat/completions",
        {"messages": QUESTION, "response_format": {"type": "json_object"}},
        "response_format",
    ),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "assistant", "tool_calls": [{"function": 1}]}]},
        "tool call",
    ),
    ("/v1/completions", {"prompt": 12}, "prompt"),
    ("/v1/completions", {"prompt": "a", "echo": True}, "echo"),
    ("/update_weights_from_disk", {"model_path": 3}, "model_path"),
]


@pytest.mark.parametrize(("path", "body", "message"), BAD_REQUESTS)
async def test_bad_requests_get_a_one_line_400(
    server: PolicyServer, http: Session, path: str, body: Any, message: str
) -> None:
    async with http.post(
        server.url + path, data=body if isinstance(body, str) else json.dumps(body)
    ) as r:
        raw = await r.text()
    assert r.status == 400, raw
    assert "\n" not in raw.strip()
    error = json.loads(raw)["error"]
    assert error["type"] == "invalid_request_error" and message in error["message"]
    assert (await call(http, server, "/health", method="GET"))[0] == 200


async def test_unknown_routes_and_methods_get_json_errors(
    server: PolicyServer, http: Session
) -> None:
    assert (await call(http, server, "/nope", method="GET"))[0] == 404
    status, body = await call(http, server, "/generate", method="GET")
    assert status == 405 and body["error"]["code"] == 405


async def test_update_weights_from_disk_swaps_the_policy(
    server: PolicyServer, http: Session, tmp_path: Path
) -> None:
    trained = TinyPolicy(9)
    trained.save(tmp_path / "w.npz")
    body = {"model_path": str(tmp_path / "w.npz"), "weight_version": "step-3"}
    status, out = await call(http, server, "/update_weights_from_disk", body)
    assert status == 200 and out["success"] is True and out["num_paused_requests"] == 0
    assert (await call(http, server, "/params/version", method="GET"))[1] == {
        "weight_version": "step-3",
        "version": 1,
    }
    gen_body = {"input_ids": chat_prompt(), "sampling_params": {"seed": 4, "max_new_tokens": 20}}
    out = (await call(http, server, "/generate", gen_body))[1]
    local = trained.generate(
        chat_prompt(), SamplingParams(seed=4, max_new_tokens=20), np.random.default_rng(4)
    )
    assert out["output_ids"] == local.output_ids and out["meta_info"]["weight_version"] == "step-3"
    status, out = await call(
        http, server, "/update_weights_from_disk", {"model_path": str(tmp_path / "none.npz")}
    )
    assert status == 400 and out["success"] is False and "cannot load" in out["error"]["message"]
    assert (await call(http, server, "/get_weight_version", method="GET"))[1]["version"] == 1


async def test_recording_keeps_a_bounded_clearable_log(http: Session) -> None:
    async with PolicyServer(seed=0, record=True, record_limit=2, worker_id="w-7") as server:
        outputs = []
        for seed in range(3):
            body = {"input_ids": [1, 2, seed + 5], "sampling_params": {"seed": seed}}
            body |= {"return_logprob": True}
            outputs.append((await call(http, server, "/generate", body))[1])
        await call(http, server, "/v1/chat/completions", {"messages": QUESTION})
        log = (await call(http, server, "/debug/samples", method="GET"))[1]
        assert (log["total"], log["dropped"], log["recording"]) == (4, 2, True)
        first = log["samples"][0]
        assert first["worker_id"] == "w-7" and first["input_ids"] == [1, 2, 7]
        assert first["output_ids"] == outputs[2]["output_ids"]
        expected = [e[0] for e in outputs[2]["meta_info"]["output_token_logprobs"]]
        assert (
            first["output_logprobs"] == expected and first["rid"] == outputs[2]["meta_info"]["id"]
        )
        assert log["samples"][1]["endpoint"] == "/v1/chat/completions"
        assert (await call(http, server, "/debug/samples", method="DELETE"))[1] == {"cleared": 2}
        assert (await call(http, server, "/debug/samples", method="GET"))[1]["samples"] == []


async def test_info_and_health_endpoints(server: PolicyServer, http: Session) -> None:
    for path in ("/health", "/health_generate"):
        async with http.get(server.url + path) as r:
            assert r.status == 200
    models = (await call(http, server, "/v1/models", method="GET"))[1]
    assert models["data"][0]["id"] == "tiny-char-policy"
    info = (await call(http, server, "/get_model_info", method="GET"))[1]
    assert "model_path" not in info and "tokenizer_path" not in info and info["is_generation"]
    assert (await call(http, server, "/server_info", method="GET"))[1]["vocab_size"] == VOCAB_SIZE
    assert (await call(http, server, "/flush_cache", method="POST"))[0] == 200


ADMIN_ROUTES = [
    ("POST", "/update_weights_from_disk", {"model_path": "/etc/passwd", "weight_version": "evil"}),
    ("POST", "/abort_request", {"abort_all": True}),
    ("GET", "/flush_cache", None),
    ("POST", "/flush_cache", None),
    ("GET", "/debug/samples", None),
    ("DELETE", "/debug/samples", None),
]


async def test_admin_routes_need_the_admin_token_and_sampling_does_not(
    http: Session, tmp_path: Path
) -> None:
    """With a token (as the stack starts its workers), an agent that reaches the server may
    sample but not load a host path as weights, abort everyone or read the samples."""
    token = "t" * 32
    async with PolicyServer(seed=0, record=True, admin_token=token) as server:
        body = {"input_ids": [1, 2, 3], "sampling_params": {"seed": 1, "max_new_tokens": 3}}
        assert (await call(http, server, "/generate", body))[0] == 200
        assert (await call(http, server, "/v1/chat/completions", {"messages": QUESTION}))[0] == 200
        for path in ("/health", "/get_model_info", "/get_server_info", "/params/version"):
            assert (await call(http, server, path, method="GET"))[0] == 200, path
        for method, path, payload in ADMIN_ROUTES:
            for wrong in ({}, {"Authorization": "Bearer " + "x" * 32}, {"Authorization": token}):
                url, data = server.url + path, json.dumps(payload)
                async with http.request(method, url, data=data, headers=wrong) as r:
                    error = (await r.json())["error"]
                assert r.status == 401 and path in error["message"] and token not in str(error)
        assert server.policy.weight_version == "0" and server.worker.recorded == 2
        TinyPolicy(9).save(tmp_path / "w.npz")
        given = {"Authorization": f"Bearer {token}"}
        for method, path, payload in ADMIN_ROUTES:
            if path == "/update_weights_from_disk":
                payload = {"model_path": str(tmp_path / "w.npz"), "weight_version": "step-1"}
            url = server.url + path
            async with http.request(method, url, json=payload, headers=given) as r:
                assert r.status == 200, (path, await r.text())
        assert server.policy.weight_version == "step-1" and server.worker.recorded == 0


def test_module_entry_prints_its_url_and_serves() -> None:
    """It takes its admin token from the environment, never the command line."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentcore_rollout.local.policy", "--port", "0", "--seed", "3"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "AGENTCORE_POLICY_ADMIN_TOKEN": "s" * 32},
    )
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(url + "/health", timeout=5) as r:
            assert r.status == 200
        with pytest.raises(urllib.error.HTTPError, match="401"):
            urllib.request.urlopen(url + "/debug/samples", timeout=5)
        given = urllib.request.Request(
            url + "/debug/samples", headers={"Authorization": "Bearer " + "s" * 32}
        )
        with urllib.request.urlopen(given, timeout=5) as r:
            assert r.status == 200
    finally:
        proc.terminate()
        proc.wait(timeout=10)
