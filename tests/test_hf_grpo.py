"""GRPO on a Hugging Face causal LM (local.hf_grpo.HFLearner) against a real HFPolicy server.

Samples are drawn by PolicyServer(HFPolicy) over real HTTP from the tiny random Llama of
test_hf_policy, so "the trainer recomputes what the server reported" is checked against the
server's own batched, KV-cached decode, not against a second copy of the trainer's arithmetic.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from agentcore_rollout.local.hf_grpo import HFLearner  # noqa: E402
from agentcore_rollout.local.policy import PolicyServer, SamplingParams  # noqa: E402
from agentcore_rollout.local.policy.hf import HFPolicy  # noqa: E402
from agentcore_rollout.training import TrainingSample, grpo_advantages  # noqa: E402

from .test_hf_policy import PROMPTS, build_model, generate, ids_and_logprobs  # noqa: E402

pytestmark = pytest.mark.unit

TRANSFORMS = [
    {"temperature": 1.0},
    {"temperature": 0.7, "top_p": 0.9, "top_k": 50},
    {"temperature": 1.3, "min_p": 0.05},
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model(tmp_path_factory.mktemp("hfgrpo") / "m", 0)


@pytest.fixture
async def server(model_dir: Path) -> AsyncIterator[PolicyServer]:
    async with PolicyServer(HFPolicy(model_dir)) as server:
        yield server


def sample(
    prompt: list[int],
    response: list[int],
    mask: list[int],
    logprobs: list[float],
    advantage: float = 0.0,
    version: str = "0",
) -> TrainingSample:
    return TrainingSample(
        request_id="r",
        input_id="i",
        step=0,
        prompt_ids=prompt,
        response_ids=response,
        loss_mask=mask,
        logprobs=logprobs,
        reward=0.0,
        advantage=advantage,
        weight_versions=(version,),
    )


async def two_turns(url: str, prompt: list[int], sp: dict[str, Any]) -> TrainingSample:
    """A two-turn sample as the gateway records it: turn 1 sampled, three observation tokens
    the policy did not sample, turn 2 sampled with everything before it as its prompt."""
    first, lp1 = ids_and_logprobs(await generate(url, prompt, **sp, seed=1))
    observation = [400, 401, 402]
    second, lp2 = ids_and_logprobs(
        await generate(url, [*prompt, *first, *observation], **sp, seed=2)
    )
    mask = [1] * len(first) + [0] * len(observation) + [1] * len(second)
    return sample(
        prompt,
        [*first, *observation, *second],
        mask,
        [*lp1, *[0.0] * len(observation), *lp2],
    )


@pytest.mark.parametrize("transform", TRANSFORMS)
async def test_recomputed_logprobs_equal_what_the_server_sampled(
    server: PolicyServer, model_dir: Path, transform: dict[str, Any]
) -> None:
    sp = {**transform, "max_new_tokens": 12, "ignore_eos": True}
    samples = [await two_turns(server.url, p, sp) for p in PROMPTS[:3]]
    sampling = SamplingParams(**transform)
    learner = HFLearner(model_dir, lr=1e-3, sampling=sampling)
    for s in samples:
        now = learner.token_logprobs(s).detach().numpy()
        captured = [lp for lp, m in zip(s.logprobs, s.loss_mask, strict=True) if m]
        assert len(now) == 24
        np.testing.assert_allclose(now, captured, atol=1e-4, rtol=0)
    stats = learner.update(samples, weight_version="0")
    assert stats.on_policy_samples == 3 and stats.tokens == 72
    assert stats.logprob_max_abs_diff is not None and stats.logprob_max_abs_diff <= 1e-4
    assert abs(stats.ratio_mean - 1) < 1e-4 and stats.clipped_fraction == 0
    # off-policy (another version's samples) are weighed, not compared
    assert learner.update(samples, weight_version="1").logprob_max_abs_diff is None


def first_token_logprob(learner: HFLearner, prompt: list[int], token: int) -> float:
    with torch.no_grad():
        return float(learner.token_logprobs(sample(prompt, [token], [1], [0.0]))[0])


async def test_an_update_raises_the_probability_of_the_rewarded_token(
    server: PolicyServer, model_dir: Path, tmp_path: Path
) -> None:
    prompt = PROMPTS[0]
    sp = {"temperature": 1.0, "max_new_tokens": 4, "ignore_eos": True}
    drawn = [ids_and_logprobs(await generate(server.url, prompt, **sp, seed=s)) for s in range(12)]
    firsts = [ids[0] for ids, _ in drawn]
    favoured = firsts[0]
    assert 1 < firsts.count(favoured) < len(firsts) - 1  # the reward separates the group
    rewards = [float(f == favoured) for f in firsts]
    advantages = grpo_advantages(rewards)
    samples = [
        sample(prompt, ids, [1] * len(ids), lps, a)
        for (ids, lps), a in zip(drawn, advantages, strict=True)
    ]
    learner = HFLearner(model_dir, lr=3e-3)
    before = first_token_logprob(learner, prompt, favoured)
    stats = learner.update(samples, weight_version="0")
    after = first_token_logprob(learner, prompt, favoured)
    assert stats.grad_norm > 0 and stats.logprob_max_abs_diff <= 1e-4  # type: ignore[operator]
    assert after > before + 0.05, (before, after)

    # The saved dir is what /update_weights_from_disk loads: the server then samples from the
    # trainer's weights (its log-probs change, and equal the trainer's recomputation).
    saved = learner.save(tmp_path / "step-0001")
    assert (saved / "model.safetensors").is_file() and (saved / "tokenizer.json").is_file()
    probe = {**sp, "max_new_tokens": 8, "seed": 99}
    old_ids, old_lps = ids_and_logprobs(await generate(server.url, prompt, **probe))
    body = {"model_path": str(saved), "weight_version": "1"}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{server.url}/update_weights_from_disk", json=body) as r,
    ):
        assert r.status == 200 and (await r.json())["success"] is True
    answer = await generate(server.url, prompt, **probe)
    assert answer["meta_info"]["weight_version"] == "1"
    new_ids, new_lps = ids_and_logprobs(answer)
    assert (new_ids, new_lps) != (old_ids, old_lps)
    assert max(abs(a - b) for a, b in zip(new_lps, old_lps, strict=False)) > 1e-3
    now = learner.token_logprobs(sample(prompt, new_ids, [1] * 8, new_lps, version="1"))
    np.testing.assert_allclose(now.detach().numpy(), new_lps, atol=1e-4, rtol=0)


async def test_a_clipped_ratio_stops_the_gradient_and_greedy_is_refused(model_dir: Path) -> None:
    learner = HFLearner(model_dir, lr=1e-3)
    prompt, token = PROMPTS[1], 7
    now = first_token_logprob(learner, prompt, token)
    # captured log-prob far below today's: ratio >> 1 + clip, pushed up by A > 0: out of the clip
    stale = sample(prompt, [token], [1], [now - 2.0], advantage=1.0, version="old")
    stats = learner.update([stale], weight_version="0")
    assert stats.clipped_fraction == 1 and stats.grad_norm == 0
    assert stats.ratio_max == pytest.approx(np.exp(2.0), rel=1e-6)
    assert first_token_logprob(learner, prompt, token) == pytest.approx(now, abs=1e-9)
    with pytest.raises(ValueError, match="temperature > 0"):
        HFLearner(model_dir, lr=1e-3, sampling=SamplingParams(temperature=0.0))


def test_the_trainer_picks_its_learner_by_local_policy(model_dir: Path, tmp_path: Path) -> None:
    from agentcore_rollout.cli.config import load_config
    from agentcore_rollout.local.trainer import make_learner

    def config(**overrides: object):
        return load_config(env_file=None, environ={}, overrides={"train.lr": 1e-3, **overrides})

    assert type(make_learner(config())).__name__ == "_ToyLearner"  # the default: "toy"
    hf = config(
        **{
            "local.policy": str(model_dir),
            "engine.llm.base_url": "http://x",
            "engine.llm.sampling": {"temperature": 0.8, "top_p": 0.9},
        }
    )
    learner = make_learner(hf)
    assert learner.learner.sampling == SamplingParams(temperature=0.8, top_p=0.9)  # type: ignore[attr-defined]
    for step in range(4):
        saved = learner.save(tmp_path, step)
    assert saved == (tmp_path / "weights" / "step-0003").resolve()
    assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == ["step-0002", "step-0003"]
    # `train --resume`: the weights and the AdamW state saved after step 3, taken up again
    prompt = PROMPTS[0]
    stale = sample(prompt, [7], [1], [-1.0], advantage=1.0, version="3")
    learner.update([stale], weight_version="3")
    saved = learner.save(tmp_path, 4)
    resumed = make_learner(hf, resume_from=saved).learner  # type: ignore[attr-defined]
    state, again = learner.learner.optimizer.state_dict(), resumed.optimizer.state_dict()  # type: ignore[attr-defined]
    assert state["state"] and again["state"].keys() == state["state"].keys()
    for key, moments in state["state"].items():
        for name, value in moments.items():
            assert torch.equal(again["state"][key][name], value), (key, name)
    before = learner.learner  # type: ignore[attr-defined]
    assert first_token_logprob(resumed, prompt, 7) == first_token_logprob(before, prompt, 7)
    with pytest.raises(ValueError, match="neither a local model directory nor a known name"):
        make_learner(config(**{"local.policy": "nope"}))
