"""PolicyServer serving a Hugging Face causal LM (local.policy.hf.HFPolicy), over real HTTP.

The model is a tiny random Llama built here (2 layers, hidden 64) over the fixture BPE tokenizer,
so the gateway can render for it; its weights are drawn wide (initializer_range 0.2) so its
next-token distributions are far from uniform and a wrong log-prob cannot hide in the noise.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from agentcore_rollout.gateway import Gateway, GatewayAdmin, SGLangBackend  # noqa: E402
from agentcore_rollout.local.policy import PolicyServer, SamplingParams  # noqa: E402
from agentcore_rollout.local.policy.hf import HFPolicy  # noqa: E402
from agentcore_rollout.local.policy.sampling import sampling_logprobs  # noqa: E402

from .gateway_support import TOKENIZER_DIR, exactness_rollout, hf_renderer  # noqa: E402
from .test_gateway import check_sample_against_records, recorded  # noqa: E402

pytestmark = pytest.mark.component

VOCAB = 702  # the fixture tokenizer: 700 BPE entries and <tool_call>, </tool_call>
IM_END = 2
PROMPTS = [[5, 17, 300, 41], [9, 8, 7], [100, 200, 300, 400, 500, 600, 650], [1, 44], [77] * 12]


def build_model(path: Path, seed: int, eos: list[int] | None = None) -> Path:
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        initializer_range=0.2,
        eos_token_id=IM_END,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    transformers.GenerationConfig(eos_token_id=eos or [IM_END]).save_pretrained(path)
    for file in TOKENIZER_DIR.iterdir():
        shutil.copy(file, path / file.name)
    return path


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    return {"a": build_model(root / "a", 0), "b": build_model(root / "b", 1)}


@pytest.fixture
async def server(model_dirs: dict[str, Path]) -> AsyncIterator[PolicyServer]:
    async with PolicyServer(HFPolicy(model_dirs["a"]), record=True) as server:
        yield server


async def generate(url: str, prompt: list[int], **sampling: Any) -> dict[str, Any]:
    body = {
        "input_ids": prompt,
        "sampling_params": sampling,
        "return_logprob": True,
        "top_logprobs_num": sampling.pop("top_n", 0),
    }
    if "rid" in sampling:
        body["rid"] = sampling.pop("rid")
    async with aiohttp.ClientSession() as http, http.post(f"{url}/generate", json=body) as r:
        assert r.status == 200, await r.text()
        return await r.json()


def ids_and_logprobs(answer: dict[str, Any]) -> tuple[list[int], list[float]]:
    entries = answer["meta_info"]["output_token_logprobs"]
    assert [e[1] for e in entries] == answer["output_ids"]
    return answer["output_ids"], [e[0] for e in entries]


def teacher_forced(policy: HFPolicy, prompt: list[int], out: list[int], sp: SamplingParams):
    """Each output token's log-prob under the sampling transform, from one full forward pass."""
    with torch.inference_mode():
        logits = policy.model(input_ids=torch.tensor([prompt + out[:-1]])).logits[0]
    rows = logits[len(prompt) - 1 :].double().numpy()
    return [float(sampling_logprobs(row, sp)[t]) for row, t in zip(rows, out, strict=True)]


# -- exactness ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sampling",
    [
        {"temperature": 1.0},
        {"temperature": 0.7, "top_p": 0.9, "top_k": 50},
        {"temperature": 1.3, "min_p": 0.05},
        {"temperature": 0.0},
    ],
)
async def test_each_logprob_equals_a_teacher_forced_recomputation(
    server: PolicyServer, sampling: dict[str, Any]
) -> None:
    policy = server.policy
    assert isinstance(policy, HFPolicy)
    for i, prompt in enumerate(PROMPTS[:3]):
        sp = {**sampling, "max_new_tokens": 24, "ignore_eos": True, "seed": i}
        answer = await generate(server.url, prompt, **sp, top_n=3)
        out, logprobs = ids_and_logprobs(answer)
        assert len(out) == 24 and answer["meta_info"]["finish_reason"]["type"] == "length"
        expected = teacher_forced(policy, prompt, out, SamplingParams(**sp))
        np.testing.assert_allclose(logprobs, expected, atol=1e-4, rtol=0)
        assert max(logprobs) - min(logprobs) > 0.5  # not a uniform distribution in disguise
        tops = answer["meta_info"]["output_top_logprobs"]
        assert all(
            len(top) <= 3 and top[0][0] >= lp for top, lp in zip(tops, logprobs, strict=True)
        )


async def test_concurrent_requests_share_decode_steps_and_equal_their_solo_runs(
    server: PolicyServer,
) -> None:
    policy = server.policy
    assert isinstance(policy, HFPolicy)
    lengths = [30, 7, 22, 15, 40]
    jobs = [
        (prompt, {"max_new_tokens": n, "ignore_eos": True, "seed": 10 + i, "temperature": 0.9})
        for i, (prompt, n) in enumerate(zip(PROMPTS, lengths, strict=True))
    ]
    alone = [ids_and_logprobs(await generate(server.url, p, **dict(s))) for p, s in jobs]
    steps = policy.decode_steps
    together = await asyncio.gather(*(generate(server.url, p, **dict(s)) for p, s in jobs))
    used = policy.decode_steps - steps
    assert used < sum(lengths) - len(lengths)  # solo runs take one step per token but the first
    assert used >= max(lengths) - 1
    for (ids, lps), answer in zip(alone, together, strict=True):
        got_ids, got_lps = ids_and_logprobs(answer)
        assert got_ids == ids
        np.testing.assert_allclose(got_lps, lps, atol=1e-4, rtol=0)


async def test_batch_form_of_generate_is_decoded_together(server: PolicyServer) -> None:
    body = {
        "input_ids": PROMPTS[:3],
        "sampling_params": {"max_new_tokens": 12, "ignore_eos": True, "seed": 5},
        "return_logprob": True,
    }
    steps = server.policy.decode_steps  # type: ignore[union-attr]
    async with aiohttp.ClientSession() as http, http.post(f"{server.url}/generate", json=body) as r:
        answers = await r.json()
    assert [len(a["output_ids"]) for a in answers] == [12, 12, 12]
    assert server.policy.decode_steps - steps == 11  # type: ignore[union-attr]


# -- stopping -----------------------------------------------------------------------------------


async def test_stops_on_the_generation_config_eos_ids_and_the_requests_stop_ids(
    server: PolicyServer, tmp_path: Path
) -> None:
    greedy = {"temperature": 0.0, "max_new_tokens": 10}
    out, _ = ids_and_logprobs(await generate(server.url, PROMPTS[0], **greedy, ignore_eos=True))
    assert len(out) == 10
    stop = out[3]
    cut = out[: out.index(stop) + 1]
    answer = await generate(server.url, PROMPTS[0], **greedy, stop_token_ids=[stop])
    assert answer["output_ids"] == cut
    assert answer["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    short = await generate(server.url, PROMPTS[0], **{**greedy, "max_new_tokens": 2})
    assert short["meta_info"]["finish_reason"] == {"type": "length", "length": 2}
    # A model whose generation_config names `stop` an end-of-turn id stops there by itself.
    other = build_model(tmp_path / "eos", 0, eos=[IM_END, stop])
    async with PolicyServer(HFPolicy(other)) as eos_server:
        answer = await generate(eos_server.url, PROMPTS[0], **greedy)
        assert answer["output_ids"] == cut
        assert answer["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
        assert answer["text"] == hf_renderer().tokenizer.decode(cut[:-1], skip_special_tokens=True)
        ignored = await generate(eos_server.url, PROMPTS[0], **greedy, ignore_eos=True)
        assert ignored["output_ids"] == out


async def test_bad_requests_get_a_one_line_400(server: PolicyServer) -> None:
    async with aiohttp.ClientSession() as http:
        for body, words in [
            ({"input_ids": [5, VOCAB]}, "vocabulary"),
            ({"input_ids": [5], "sampling_params": {"stop_token_ids": [10**6]}}, "stop_token_ids"),
            ({"input_ids": []}, "at least one token"),
        ]:
            async with http.post(f"{server.url}/generate", json=body) as r:
                assert r.status == 400
                assert words in (await r.json())["error"]["message"]


# -- weights and aborts -------------------------------------------------------------------------


async def test_a_weight_update_changes_the_version_and_the_outputs(
    server: PolicyServer, model_dirs: dict[str, Path]
) -> None:
    sp = {"max_new_tokens": 8, "ignore_eos": True, "seed": 3}
    before = await generate(server.url, PROMPTS[1], **dict(sp))
    assert before["meta_info"]["weight_version"] == "0"
    async with aiohttp.ClientSession() as http:
        url = f"{server.url}/update_weights_from_disk"
        async with http.post(url, json={"model_path": str(model_dirs["a"] / "nope")}) as r:
            assert r.status == 400 and "safetensors" in (await r.json())["message"]
        body = {"model_path": str(model_dirs["b"]), "weight_version": "step-1"}
        async with http.post(url, json=body) as r:
            assert r.status == 200 and (await r.json())["success"] is True
    after = await generate(server.url, PROMPTS[1], **dict(sp))
    assert after["meta_info"]["weight_version"] == "step-1"
    assert after["output_ids"] != before["output_ids"]
    policy = server.policy
    assert isinstance(policy, HFPolicy)
    _, lps = ids_and_logprobs(after)
    expected = teacher_forced(policy, PROMPTS[1], after["output_ids"], SamplingParams(**sp))
    np.testing.assert_allclose(lps, expected, atol=1e-4, rtol=0)


async def wait_for_tokens(policy: HFPolicy, count: int) -> None:
    start = policy.tokens
    for _ in range(2000):  # 10 s at most
        if policy.tokens >= start + count:
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the policy sampled too few tokens")


async def test_abort_in_flight_answers_with_the_tokens_so_far(server: PolicyServer) -> None:
    policy = server.policy
    assert isinstance(policy, HFPolicy)
    long = {"max_new_tokens": 3000, "ignore_eos": True, "seed": 1}
    task = asyncio.create_task(generate(server.url, PROMPTS[0], **long, rid="long"))
    other = asyncio.create_task(generate(server.url, PROMPTS[1], **long, rid="other"))
    await wait_for_tokens(policy, 10)
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{server.url}/abort_request", json={"rid": "long"}) as r:
            assert r.status == 200
        answer = await asyncio.wait_for(task, 10)
        assert answer["meta_info"]["finish_reason"]["type"] == "abort"
        ids, lps = ids_and_logprobs(answer)
        assert 3 <= len(ids) < 3000 and len(lps) == len(ids)
        expected = teacher_forced(policy, PROMPTS[0], ids, SamplingParams(**long))
        np.testing.assert_allclose(lps, expected, atol=1e-4, rtol=0)
        assert not other.done()  # its batch-mate runs on
        # A weight update with abort_all_requests ends the rest at once and loads.
        body = {"model_path": str(policy.model_dir), "abort_all_requests": True}
        async with http.post(f"{server.url}/update_weights_from_disk", json=body) as r:
            assert r.status == 200
        rest = await asyncio.wait_for(other, 10)
    assert rest["meta_info"]["finish_reason"]["type"] == "abort"
    assert rest["meta_info"]["weight_version"] == "0" and policy.weight_version == "1"
    assert 0 < len(rest["output_ids"]) < 3000


# -- through the gateway ------------------------------------------------------------------------


async def test_gateway_traces_equal_what_the_hf_server_sampled(server: PolicyServer) -> None:
    async with (
        Gateway(SGLangBackend(server.url), hf_renderer()) as gateway,
        GatewayAdmin(gateway.admin_url, gateway.admin_token) as admin,
    ):
        traces = await asyncio.gather(*(exactness_rollout(gateway, admin, i) for i in range(4)))
        by_rid = {r["rid"]: r for r in await recorded(server.url)}
    policy = server.policy
    assert isinstance(policy, HFPolicy)
    for trace in traces:
        assert trace["token_capture"] is True and trace["num_turns"] == 3
        for sample in trace["samples"]:  # a random model's replies may drift: several samples
            check_sample_against_records(sample, by_rid, trace["turns"])
        for turn in trace["turns"]:
            record = by_rid[turn["rid"]]
            sp = SamplingParams(**{**record["sampling_params"], "stop": ()})
            out = record["output_ids"]
            expected = teacher_forced(policy, record["input_ids"], out, sp)
            np.testing.assert_allclose(record["output_logprobs"], expected, atol=1e-4, rtol=0)
