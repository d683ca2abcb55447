"""`agentcore_rollout.training`: groups, over-provisioning, samples and advantages. Pure logic on
hand-made outcomes, and `GroupRollout` through the real wire (emulator, S3, SQS)."""

from __future__ import annotations

import asyncio
import dataclasses
import math

import pytest

from agentcore_rollout import Outcome, RolloutEngine, RolloutOutcome
from agentcore_rollout.training import (
    Group,
    GroupPolicy,
    GroupRollout,
    GroupStatus,
    TrainingSample,
    collect_groups,
    group_samples,
    grpo_advantages,
    outcome_samples,
    staleness_report,
    training_samples,
    within_staleness,
)

from .conftest import engine_config
from .factories import make_outcome, trace_sample

pytestmark = pytest.mark.component


def _trace(prompt: list[int], turns: list[tuple[list[int], list[int], list[float]]]) -> dict:
    """A gateway trace of one merged sample, every turn sampled by weights "3"."""
    return {
        "turns": [{"index": i, "weight_version": "3"} for i in range(len(turns))],
        "samples": [trace_sample(prompt, turns, ["3"] * len(turns))],
    }


def _outcome(
    input_id: str = "g",
    k: int = 0,
    outcome: Outcome = Outcome.OK,
    reward: float | None = 1.0,
    *,
    step: int = 0,
    finished_at: float = 0.0,
    trace: dict | None = None,
) -> RolloutOutcome:
    trace = trace if trace is not None else _trace([1, 2], [([], [5, 6], [-0.5, -0.25])])
    return make_outcome(
        input_id, k, outcome, reward, step=step, trace=trace, finished_at=finished_at
    )


# ---------------------------------------------------------------------- advantages


def test_grpo_advantages_match_the_group_normalized_formula():
    adv = grpo_advantages([1.0, 0.0, 0.0, 1.0])
    scale = math.sqrt(4 * 0.25 / 3) + 1e-6  # the sample std (n - 1), as veRL computes it
    assert adv == pytest.approx([0.5 / scale, -0.5 / scale, -0.5 / scale, 0.5 / scale])
    assert sum(adv) == pytest.approx(0.0)
    assert grpo_advantages([0.3, 0.3, 0.3]) == [0.0, 0.0, 0.0]
    assert grpo_advantages([0.7]) == [0.7]  # one member: its raw reward (veRL's convention)
    assert grpo_advantages([1.0, 0.0], scale_by_std=False) == [0.5, -0.5]
    assert grpo_advantages([]) == []
    with pytest.raises(ValueError, match="finite"):
        grpo_advantages([1.0, math.nan])


# ---------------------------------------------------------------------- groups


def test_group_policy_checks_its_numbers():
    assert GroupPolicy(n=8, extra=2).size == 10
    for bad in ({"n": 0}, {"n": 4, "extra": -1}, {"n": 4, "min_ok": 5}, {"n": 4, "min_ok": 0}):
        with pytest.raises(ValueError, match="GroupPolicy"):
            GroupPolicy(**bad)


def test_a_group_keeps_its_first_n_ok_members_and_judges_them():
    policy = GroupPolicy(n=2, extra=2, min_ok=2)
    members = [
        _outcome(k=0, outcome=Outcome.TIMEOUT, reward=None),
        _outcome(k=1, reward=1.0),
        _outcome(k=2, reward=0.0),
        _outcome(k=3, reward=0.5),  # ok, but after n were: an extra, never trained on
    ]
    group = Group.judge(members, policy)
    assert group.status is GroupStatus.TRAIN
    assert [m.request.sample_index for m in group.kept] == [1, 2]
    assert group.rewards == [1.0, 0.0]
    assert group.counts["ok"] == 3 and group.counts["timeout"] == 1
    rows = group_samples(group)
    assert {r.request_id for r in rows} == {m.request.request_id for m in group.kept}


def test_groups_with_too_few_ok_all_equal_rewards_or_stale_are_not_trained():
    policy = GroupPolicy(n=4, min_ok=2)
    one_ok = [_outcome(k=0), _outcome(k=1, outcome=Outcome.AGENT_ERROR, reward=None)]
    equal = [_outcome(k=k, reward=0.25) for k in range(4)]
    mixed = [_outcome(k=0, reward=1.0), _outcome(k=1, reward=0.0)]
    went_stale = [*mixed, _outcome(k=2, outcome=Outcome.STALE, reward=None)]
    assert Group.judge(one_ok, policy).status is GroupStatus.TOO_FEW_OK
    assert Group.judge(equal, policy).status is GroupStatus.ALL_EQUAL
    assert Group.judge(mixed, policy).status is GroupStatus.TRAIN
    assert Group.judge(mixed, policy, current_step=1, max_staleness=1).status is GroupStatus.TRAIN
    assert Group.judge(mixed, policy, current_step=2, max_staleness=1).status is GroupStatus.STALE
    assert Group.judge(went_stale, policy).status is GroupStatus.STALE
    for members in (one_ok, equal, went_stale):
        assert group_samples(Group.judge(members, policy)) == []


def test_collect_groups_splits_by_input_id_and_step_in_the_order_members_ended():
    outcomes = [
        _outcome("a", 0, reward=0.0, finished_at=3.0),
        _outcome("b", 0, reward=1.0, finished_at=1.0),
        _outcome("a", 1, reward=1.0, finished_at=2.0),
        _outcome("a", 0, reward=0.5, step=1, finished_at=0.5),
    ]
    groups = collect_groups(outcomes, GroupPolicy(n=1, min_ok=1))
    assert [(g.input_id, g.step, len(g.members)) for g in groups] == [
        ("a", 0, 2),
        ("b", 0, 1),
        ("a", 1, 1),
    ]
    assert groups[0].kept[0].request.sample_index == 1  # it ended first
    with pytest.raises(ValueError, match="one input_id at one step"):
        Group.judge([outcomes[0], outcomes[1]], GroupPolicy(n=2))


# ---------------------------------------------------------------------- samples


def test_samples_keep_masks_and_captured_logprobs_aligned():
    trace = _trace(
        [10, 11, 12],
        [([], [20, 21], [-0.1, -0.2]), ([30, 31, 32], [22], [-0.3])],
    )
    [row] = outcome_samples(_outcome(reward=0.75, trace=trace), advantage=1.5)
    assert row.prompt_ids == [10, 11, 12]
    assert row.response_ids == [20, 21, 30, 31, 32, 22]
    assert row.loss_mask == [1, 1, 0, 0, 0, 1]
    assert row.logprobs == [-0.1, -0.2, 0.0, 0.0, 0.0, -0.3]
    assert (row.reward, row.advantage) == (0.75, 1.5)
    assert row.sampled_runs() == [(0, 2), (5, 6)]
    assert row.on_policy("3") and not row.on_policy("4")


def test_a_sample_the_agent_never_got_all_of_is_no_row():
    trace = _trace([1], [([], [2, 3], [-0.1, -0.2])])
    lost = {**trace["samples"][0], "delivered": False}
    kept = {**trace["samples"][0], "response_ids": [4, 5], "delivered": True}
    rows = outcome_samples(_outcome(trace={"samples": [lost, kept]}), 1.0)
    assert [row.response_ids for row in rows] == [[4, 5]]


def test_failures_and_ok_outcomes_without_a_trace_never_become_rows():
    with pytest.raises(ValueError, match="ended timeout: a failure never becomes"):
        outcome_samples(_outcome(outcome=Outcome.TIMEOUT, reward=None), 1.0)
    no_trace = dataclasses.replace(_outcome(), trace=None)
    with pytest.raises(ValueError, match="without a token trace"):
        outcome_samples(no_trace, 1.0)
    broken = _trace([1], [([], [2, 3], [-0.1, -0.2])])
    broken["samples"][0]["logprobs"] = [-0.1]
    with pytest.raises(ValueError, match="one log-prob per response token"):
        outcome_samples(_outcome(trace=broken), 1.0)
    missing = _trace([1], [([], [2], [-0.1])])
    missing["samples"][0]["logprobs"] = [None]
    with pytest.raises(ValueError, match="no log-prob at token 0"):
        outcome_samples(_outcome(trace=missing), 1.0)


def test_within_staleness_masks_the_tokens_older_than_the_bound_and_drops_empty_samples():
    sample = trace_sample([1], [([], [5, 6], [-0.1, -0.2]), ([7], [8, 9], [-0.3, -0.4])], ["3"])
    sample["version_runs"] = [["1", 2], [None, 1], ["3", 2]]  # a turn resumed under "3"
    row = outcome_samples(_outcome(step=1, trace={"samples": [sample]}), 1.0)[0]
    assert within_staleness([row], version=3, max_staleness=2) == [row]
    (masked,) = within_staleness([row], version=4, max_staleness=1)
    assert masked.loss_mask == [0, 0, 0, 1, 1]
    assert masked.logprobs == [0.0, 0.0, 0.0, -0.3, -0.4]
    assert masked.token_versions == (None, None, None, "3", "3")
    assert masked.response_ids == row.response_ids and masked.prompt_ids == row.prompt_ids
    assert within_staleness([row], version=4, max_staleness=0) == []
    unversioned = dataclasses.replace(row, token_versions=())  # counts as its step's, 1
    assert within_staleness([unversioned], version=3, max_staleness=1) == []
    named = dataclasses.replace(row, token_versions=("v7",) * 5)
    with pytest.raises(ValueError, match="'v7' is not a step number"):
        within_staleness([named], version=3, max_staleness=1)


def test_staleness_report_counts_delivered_and_dropped_by_lag_and_duration():
    def ran(o: RolloutOutcome, seconds: float | None) -> RolloutOutcome:
        started = None if seconds is None else 100.0
        return dataclasses.replace(o, started_at=started, finished_at=100.0 + (seconds or 0))

    fast = ran(_outcome("a", 0, reward=1.0, step=0), 0.5)
    slow = ran(_outcome("a", 1, reward=0.0, step=0), 50.0)
    ended = ran(_outcome("b", 0, Outcome.STALE, None, step=1), None)
    failed = ran(_outcome("b", 1, Outcome.AGENT_ERROR, None, step=1), 2.0)
    groups = collect_groups([fast, slow, ended, failed], GroupPolicy(n=2))
    report = staleness_report(groups, 2, trained={fast.request.request_id})
    assert report == {
        "by_staleness": {
            "1": {"delivered": 0, "dropped": 1},
            "2": {"delivered": 1, "dropped": 1},
        },
        "by_duration": {
            "<1s": {"delivered": 1, "dropped": 0},
            "30-100s": {"delivered": 0, "dropped": 1},
            "unstarted": {"delivered": 0, "dropped": 1},
        },
    }
    assert staleness_report(groups, 2)["by_staleness"]["2"] == {"delivered": 2, "dropped": 0}


def test_training_samples_carry_each_groups_advantages():
    policy = GroupPolicy(n=3, min_ok=2)
    trained = Group.judge([_outcome("a", k, reward=float(k % 2)) for k in range(3)], policy)
    skipped = Group.judge([_outcome("b", k, reward=1.0) for k in range(3)], policy)
    rows = training_samples([trained, skipped])
    assert all(isinstance(r, TrainingSample) and r.input_id == "a" for r in rows)
    assert [r.advantage for r in rows] == pytest.approx(grpo_advantages([0.0, 1.0, 0.0]))


# ---------------------------------------------------------------------- through the wire


async def test_over_provisioning_cancels_the_extras_and_never_trains_on_them(
    moto, channel, emulator
):
    emu = await emulator()
    # Members 0 and 1 of each group hang; 2-4 finish with rewards 1, 0, 1. n=3, extra=2.
    payload = {
        "a": 1,
        "b": 2,
        "per_member": {
            "0": {"mode": "hang"},
            "1": {"mode": "hang"},
            "2": {"reward": 1.0},
            "3": {"reward": 0.0},
            "4": {"reward": 1.0},
        },
    }
    async with (
        RolloutEngine(engine_config(moto, channel, emu)) as engine,
        GroupRollout(engine, GroupPolicy(n=3, extra=2)) as groups,
    ):
        groups.submit("g1", payload)
        groups.submit("g2", payload)
        resolved = [g async for g in groups]
        assert groups.pending == 0
    assert sorted(g.input_id for g in resolved) == ["g1", "g2"]
    for group in resolved:
        assert group.status is GroupStatus.TRAIN
        assert len(group.members) == 5
        assert group.counts["ok"] == 3 and group.counts["cancelled"] == 2
        assert sorted(m.request.sample_index for m in group.kept) == [2, 3, 4]
        cancelled = {m.request.sample_index for m in group.members if m.outcome == "cancelled"}
        assert cancelled == {0, 1}
    sessions = emu.sessions
    assert sorted(sessions.stopped) == sorted(sessions.started)  # the extras' sessions were stopped


async def test_leaving_a_group_rollout_cancels_what_still_runs(moto, channel, emulator):
    emu = await emulator()
    async with RolloutEngine(engine_config(moto, channel, emu)) as engine:
        async with GroupRollout(engine, GroupPolicy(n=2)) as groups:
            groups.submit("g", {"a": 1, "b": 1, "mode": "hang"})
            await asyncio.sleep(0.5)
        async with asyncio.timeout(10):  # the stops run behind the cancelled outcomes
            while engine.stats().live_sessions:  # noqa: ASYNC110 (a gauge, not an event)
                await asyncio.sleep(0.01)
        assert engine.stats().stops == 2
        with pytest.raises(RuntimeError, match="no group is pending"):
            await GroupRollout(engine, GroupPolicy(n=2)).next()
