"""Outcomes -> veRL rows, checked against veRL 0.9.1's own code: `AgentLoopOutput.as_dict` (what
the v1 worker puts into TransferQueue), the v0 worker's padding, and GRPO's advantages."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

from agentcore_rollout import Outcome, RolloutOutcome
from agentcore_rollout.contract import NamedRewards
from agentcore_rollout.integrations.verl.convert import ConversionError, agent_loop_outputs
from agentcore_rollout.training import grpo_advantages

from .factories import make_outcome, trace_sample

pytestmark = pytest.mark.unit


def _outcome(samples, rewards=1.0, outcome=Outcome.OK, step=4) -> RolloutOutcome:
    turns = [{"index": 0, "latency_s": 0.25}, {"index": 1, "latency_s": 0.5}]
    trace = {"turns": turns, "samples": samples}
    return make_outcome("uid-1", 2, outcome, rewards, step=step, trace=trace)


MULTI_TURN = trace_sample(
    [1, 2, 3], [([], [7, 8], [-0.5, -0.25]), ([9, 9], [10], [-1.5])], ["3", "4"]
)


def test_an_ok_outcome_becomes_rows_veRL_reads_as_the_trace_says():
    rewards = NamedRewards(components={"reward": 0.75, "correct": 1.0}, scalar="reward")
    [row] = agent_loop_outputs(_outcome([MULTI_TURN], rewards=rewards))
    data = row.as_dict()  # what veRL's v1 worker stores, field by field
    assert data["prompts"].tolist() == [1, 2, 3]
    assert data["responses"].tolist() == [7, 8, 9, 9, 10]
    assert data["response_mask"].tolist() == [1, 1, 0, 0, 1]
    assert data["rollout_log_probs"].tolist() == [-0.5, -0.25, 0.0, 0.0, -1.5]
    assert data["rm_scores"].tolist() == [0.0, 0.0, 0.0, 0.0, 0.75]  # reward on the last token
    extra = data["extra_fields"]
    assert (extra["min_global_steps"], extra["max_global_steps"]) == (3, 4)
    assert isinstance(extra["min_global_steps"], int)
    assert extra["reward_extra_info"] == {"reward": 0.75, "correct": 1.0}
    assert extra["outcome"] == "ok" and extra["input_id"] == "uid-1"
    assert row.num_turns == 4 and row.metrics.generate_sequences == pytest.approx(0.75)


def test_the_sample_with_most_sampled_tokens_goes_last_and_versions_default_to_the_step():
    short = trace_sample([5], [([], [6], [-0.1])], [None], index=1)
    rows = agent_loop_outputs(_outcome([MULTI_TURN, short], rewards=0.5))
    assert [r.response_ids for r in rows] == [[6], [7, 8, 9, 9, 10]]
    assert rows[0].extra_fields["min_global_steps"] == rows[0].extra_fields["max_global_steps"] == 4
    assert all(r.extra_fields["reward_extra_info"] == {} for r in rows)


def test_failures_and_traceless_outcomes_raise_or_give_no_row():
    failed = _outcome([MULTI_TURN], outcome=Outcome.AGENT_ERROR)
    with pytest.raises(ConversionError, match="ended agent_error: no veRL row"):
        agent_loop_outputs(failed)
    assert agent_loop_outputs(failed, on_failure="empty") == []
    traceless = dataclasses.replace(_outcome([MULTI_TURN]), trace=None)
    with pytest.raises(ConversionError, match="no token trace"):
        agent_loop_outputs(traceless)
    assert agent_loop_outputs(traceless, on_failure="empty") == []
    unjudged = _outcome([MULTI_TURN], outcome=Outcome.VERIFIER_ERROR)  # a verifier that could not
    with pytest.raises(ConversionError, match="ended verifier_error: no veRL row"):
        agent_loop_outputs(unjudged)


def test_an_agent_that_never_called_the_model_gives_no_row_and_says_why(caplog):
    oracle = make_outcome("uid-1", 0, Outcome.OK, 1.0, trace={"turns": [], "samples": []})
    with caplog.at_level("INFO", logger="agentcore_rollout.integrations.verl.convert"):
        assert agent_loop_outputs(oracle) == []  # not a failure: nothing sampled to train
    assert "ended ok without a model call: no veRL row" in caplog.text


def test_over_length_samples_raise_instead_of_being_truncated():
    outcome = _outcome([MULTI_TURN])
    with pytest.raises(ConversionError, match="response of 5 tokens is over the trainer's 4"):
        agent_loop_outputs(outcome, max_response_length=4, on_failure="empty")
    with pytest.raises(ConversionError, match="prompt of 3 tokens is over the trainer's 2"):
        agent_loop_outputs(outcome, max_prompt_length=2)
    assert len(agent_loop_outputs(outcome, max_prompt_length=3, max_response_length=5)) == 1


def test_weight_versions_must_be_global_steps():
    odd = trace_sample([1], [([], [2], [-0.1])], ["policy-v7"])
    with pytest.raises(ConversionError, match="not veRL global steps"):
        agent_loop_outputs(_outcome([odd]))


def test_padded_like_veRLs_v0_worker_the_mask_keeps_only_sampled_tokens():
    """veRL pads responses on the right to `response_length` and multiplies the mask by the
    attention mask: padding never trains, sampled tokens stay exactly where they were."""
    [row] = agent_loop_outputs(_outcome([MULTI_TURN]))
    length = 8
    pad = length - len(row.response_ids)
    response_attention = torch.tensor([[1] * len(row.response_ids) + [0] * pad])
    padded_mask = torch.tensor([row.response_mask + [0] * pad]) * response_attention
    padded_logprobs = torch.tensor(row.response_logprobs + [0.0] * pad)
    assert padded_mask.tolist() == [[1, 1, 0, 0, 1, 0, 0, 0]]
    assert padded_logprobs[padded_mask[0].bool()].tolist() == [-0.5, -0.25, -1.5]


def test_our_grpo_advantages_equal_veRLs():
    rewards = [1.0, 0.0, 0.75, 0.0, 0.5, 0.5, 1.0]
    uids = np.array(["a", "a", "a", "b", "b", "c", "d"], dtype=object)
    scores = torch.zeros(len(rewards), 3)
    scores[:, -1] = torch.tensor(rewards)
    veRL, _ = compute_grpo_outcome_advantage(scores, torch.ones(len(rewards), 3), uids)
    ours: list[float] = []
    for uid in dict.fromkeys(uids):
        ours += grpo_advantages([r for r, u in zip(rewards, uids, strict=True) if u == uid])
    assert veRL[:, 0].tolist() == pytest.approx(ours, abs=1e-5)
