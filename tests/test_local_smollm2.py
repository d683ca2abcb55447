"""The local stack serving a real model (`local.policy`): SmolLM2-135M-Instruct, converted once per
test session (tests/smollm2.py), served by a worker process (HFPolicy) behind the token-capture
gateway, which renders with the model's tokenizer and chat template. The calculator example
agent runs on it greedily: the model writes a real Hermes tool call, the gateway parses it into
an OpenAI tool call, the agent runs the tool and sends the result back, and the trace holds
exactly the tokens and log-probs the worker sampled. Plus the config's and the worker's checks.
"""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from agentcore_rollout import ConfigError, RolloutEngine, RolloutRequest
from agentcore_rollout.cli.config import Config
from agentcore_rollout.contract import LLMSettings
from agentcore_rollout.local.config import LocalConfig
from agentcore_rollout.local.policy.__main__ import main as policy_main
from agentcore_rollout.local.stack import LocalStack
from agentcore_rollout.local.trainer import make_learner

from .factories import flat_config, recorded_samples
from .test_traces import _runs

pytestmark = pytest.mark.e2e

NAME = "smollm2-135m-instruct"


def test_policy_params_belong_to_the_toy() -> None:
    with pytest.raises(ValueError, match=r"policy_params is the toy's \.npz"):
        LocalConfig(policy="smollm2-135m-instruct", policy_params="step-0001.npz")
    assert LocalConfig(policy_params="step-0001.npz").policy == "toy"


async def test_an_unknown_policy_is_a_config_error_and_starts_nothing() -> None:
    stack = LocalStack(LocalConfig(policy="gpt-5", bucket="unknown", queue="unknown"))
    with pytest.raises(ConfigError) as info:
        async with stack:
            pytest.fail("the stack started")
    message = str(info.value)
    assert message.startswith("config: local.policy: unknown model 'gpt-5'"), message
    assert "\n" not in message and "smollm2-135m-instruct" in message
    assert stack.workers == [] and stack.gateways == [] and stack.emulator is None


async def test_without_the_models_extra_a_model_policy_is_a_one_line_config_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torch" else find_spec(name)
    )
    expected = (
        "config: local.policy: a Hugging Face policy needs torch: pip install -e '.[models]' "
        "(or make models)"
    )
    stack = LocalStack(LocalConfig(policy=NAME, bucket="no-torch", queue="no-torch"))
    with pytest.raises(ConfigError) as info:
        async with stack:
            pytest.fail("the stack started")
    assert str(info.value) == expected and stack.workers == []
    with pytest.raises(ConfigError) as info:
        make_learner(Config(local=LocalConfig(policy=NAME)))
    assert str(info.value) == expected


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--model", "m", "--params", "p.npz"], "--params is the toy's"),
        (["--threads", "2"], "--threads needs --model"),
        (["--model", "/no/such/model"], "--model: model dir /no/such/model does not exist"),
    ],
)
def test_the_worker_refuses_contradictory_flags(
    argv: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    with pytest.raises(SystemExit) as exit_info:
        policy_main(argv)
    assert exit_info.value.code == 2
    assert error in capsys.readouterr().err


async def test_a_real_tool_call_from_smollm2_through_the_gateway_is_token_exact() -> None:
    pytest.importorskip("torch")
    from agentcore_rollout.gateway import HFRenderer
    from agentcore_rollout.local.hf_grpo import HFLearner
    from agentcore_rollout.local.policy import SamplingParams
    from agentcore_rollout.training import TrainingSample

    from .smollm2 import model_dir

    path = model_dir()
    local = LocalConfig(
        app="examples.calculator_agent.app:app",
        mode="in_process",
        policy=str(path),
        policy_workers=1,
        record_samples=True,
        bucket="smollm2",
        queue="smollm2",
    )
    # Greedy: the model called the tool on this question (see the example's docstring).
    request = RolloutRequest(
        {"question": "What is 23 * 47?", "answer": 1081, "max_turns": 2}, input_id="calc"
    )
    async with LocalStack(local) as stack:
        assert stack.gateways
        greedy = LLMSettings(base_url=f"{stack.gateways[0].url}/v1", sampling={"temperature": 0.0})
        base = flat_config(exp_id="smollm2", rollout_timeout=120.0)
        async with RolloutEngine(stack.engine_config(base, llm=greedy)) as engine:
            batch = await engine.rollout([request])
        recorded = await recorded_samples(stack)
    (outcome,) = batch.outcomes
    assert outcome.outcome == "ok", outcome.error
    assert outcome.result is not None and outcome.trace is not None
    messages = outcome.result.trajectory["messages"]
    episode = messages[messages.index({"role": "user", "content": "What is 23 * 47?"}) :]
    call = episode[1]["tool_calls"][0]["function"]  # parsed by the gateway from the model's text
    assert call["name"] == "calculator"
    assert json.loads(call["arguments"]) == {"expression": "23 * 47"}
    assert episode[2]["role"] == "tool" and episode[2]["content"] == "1081"
    assert outcome.result.metrics["tool_calls"] == 1.0

    trace = outcome.trace
    assert trace["token_capture"] is True
    assert trace["turns"][0]["finish_reason"] == "tool_calls"
    assert trace["turns"][1]["finish_reason"] == "stop"
    renderer = HFRenderer.from_pretrained(path)
    by_prompt = {tuple(s["input_ids"]): s for s in recorded}
    assert len(by_prompt) == len(recorded) == trace["num_turns"] == 2
    sampled = []
    for sample in trace["samples"]:
        ids, mask, lps = sample["response_ids"], sample["loss_mask"], sample["logprobs"]
        for start, end in _runs(mask):
            # The worker saw exactly this prompt and sampled exactly these tokens and log-probs.
            worker = by_prompt.pop(tuple(sample["prompt_ids"] + ids[:start]))
            assert worker["output_ids"] == ids[start:end]
            assert worker["output_logprobs"] == lps[start:end]
            sampled.append(renderer.tokenizer.decode(ids[start:end]))
    assert not by_prompt, "every generation the worker recorded is in the trace"
    assert sampled[0].startswith("<tool_call>\n") and sampled[0].endswith("</tool_call><|im_end|>")
    assert '"expression": "23 * 47"' in sampled[0]
    # The parsed call, rendered back into the next prompt, gave the very tokens sampled: both
    # turns are one training sequence. Then the model answered with the tool's result.
    assert [t["render"] for t in trace["turns"]] == ["full", "incremental"]
    assert len(trace["samples"]) == 1
    assert sampled[1] == "1081<|im_end|>" and outcome.reward == 1.0
    # The trainer's recomputation of every sampled token (greedy reports log_softmax of the
    # raw logits: temperature 1's transform) within 1e-4 of what the worker captured.
    learner = HFLearner(path, lr=1e-6, sampling=SamplingParams(temperature=1.0))
    sample = trace["samples"][0]
    mask = sample["loss_mask"]
    now = learner.token_logprobs(
        TrainingSample(
            request_id="calc",
            input_id="calc",
            step=0,
            prompt_ids=sample["prompt_ids"],
            response_ids=sample["response_ids"],
            loss_mask=mask,
            logprobs=[lp or 0.0 for lp in sample["logprobs"]],
            reward=1.0,
            advantage=0.0,
            weight_versions=("0",),
        )
    )
    captured = [lp for lp, m in zip(sample["logprobs"], mask, strict=True) if m]
    assert len(captured) == sum(mask) > 20
    np.testing.assert_allclose(now.detach().numpy(), captured, atol=1e-4, rtol=0)
