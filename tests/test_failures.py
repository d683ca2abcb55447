"""Every failure path ends in its named outcome and leaves the rest of the batch intact."""

from __future__ import annotations

import asyncio
import json
import math
import time

import pytest

from agentcore_rollout import Outcome, RolloutEngine, RolloutRequest
from agentcore_rollout._results import inbox as _inbox
from agentcore_rollout.contract import (
    result_key,
)
from agentcore_rollout.training import outcome_samples

from .agents.basic import controls, expected_reward
from .conftest import engine_config
from .factories import make_result, signed_body

pytestmark = pytest.mark.component


def _batch(n: int, special: dict[int, dict] | None = None) -> list[RolloutRequest]:
    special = special or {}
    return [
        RolloutRequest({"a": i, "b": 1, **special.get(i, {})}, input_id=f"q{i}") for i in range(n)
    ]


def _assert_rest_ok(batch, bad: set[int]) -> None:
    for i, o in enumerate(batch.outcomes):
        if i not in bad:
            assert o.outcome is Outcome.OK, (i, o.outcome, o.error)
            assert o.reward == expected_reward(o.request.payload)
    assert sum(batch.counts.values()) == len(batch.outcomes)


async def test_agent_error_and_hang_past_deadline(moto, channel, emulator):
    emu = await emulator()
    reqs = _batch(
        9,
        {
            1: {"mode": "raise"},
            4: {"mode": "hang"},
            5: {"mode": "slow_cancel"},
            6: {"mode": "bad_output"},
            7: {"mode": "unjudged"},
            8: {"mode": "agent_timeout"},
        },
    )
    cfg = engine_config(moto, channel, emu, rollout_timeout=3.0, result_grace=3.0)
    async with RolloutEngine(cfg) as engine:
        batch = await engine.rollout(reqs)
    assert batch.outcomes[1].outcome is Outcome.AGENT_ERROR
    assert batch.outcomes[1].error == "ValueError: bad input 1"
    assert batch.outcomes[1].reward is None
    hang = batch.outcomes[4]
    assert (
        hang.outcome is Outcome.TIMEOUT and hang.result is not None
    )  # the agent's watchdog wrote it
    assert hang.result.error.type == "DeadlineExceeded"
    slow = batch.outcomes[5]  # the watchdog does not wait for the rollout to give up
    assert slow.outcome is Outcome.TIMEOUT and slow.result is not None
    bad = batch.outcomes[6]  # output the contract rejects is the agent's error, said in one line
    assert bad.outcome is Outcome.AGENT_ERROR
    assert bad.error.startswith("InvalidOutput: rewards") and "\n" not in bad.error
    # a verifier that could not judge is its own outcome, with no reward (not a 0 to train)
    unjudged = batch.outcomes[7]
    assert unjudged.outcome is Outcome.VERIFIER_ERROR and unjudged.reward is None
    assert unjudged.error == "VerifierError: tests/test.sh exited 2 and wrote no reward"
    with pytest.raises(ValueError, match="ended verifier_error: a failure never becomes"):
        outcome_samples(unjudged, 1.0)
    late = batch.outcomes[8]  # an agent's own time limit ends it as the deadline would
    assert late.outcome is Outcome.TIMEOUT and late.error.startswith("AgentTimeout: ")
    _assert_rest_ok(batch, {1, 4, 5, 6, 7, 8})
    assert sorted(emu.sessions.stopped) == sorted(emu.sessions.started)


async def test_agent_process_killed_mid_rollout(moto, channel, emulator):
    emu = await emulator(mode="process")
    reqs = _batch(3, {0: {"mode": "hang"}})
    cfg = engine_config(moto, channel, emu, rollout_timeout=6.0, result_grace=1.0)
    async with RolloutEngine(cfg) as engine:
        handles = [engine.submit(r) for r in reqs]
        victim = f"exp1-0-{reqs[0].request_id}"
        await _until(lambda: victim in emu.sessions and emu.sessions[victim].ready.is_set())
        await asyncio.sleep(0.3)  # the invocation was forwarded and accepted
        emu.sessions.kill_agent(victim)
        outcomes = [await h for h in handles]
    assert outcomes[0].outcome is Outcome.TIMEOUT and outcomes[0].result is None
    assert outcomes[0].error == "no result by the deadline"
    assert [o.outcome for o in outcomes[1:]] == [Outcome.OK, Outcome.OK]
    assert victim in emu.sessions.expired  # the emulator noticed the dead agent
    assert set(emu.sessions.started) == set(emu.sessions.stopped) | {victim}


async def test_throttling_a_third_of_invocations_is_retried_and_slows_the_rate(
    moto, channel, emulator
):
    emu = await emulator(throttle_every=3)
    reqs = _batch(24)
    async with RolloutEngine(engine_config(moto, channel, emu)) as engine:
        batch = await engine.rollout(reqs)
    _assert_rest_ok(batch, set())
    throttled, stats = emu.counts["ThrottlingException"], batch.stats
    assert throttled >= 8
    assert stats.throttles == stats.invoke_errors["ThrottlingException"] == throttled
    assert stats.retries == {"ThrottlingException": throttled}
    assert stats.invokes == 24 + throttled
    assert stats.rate_cuts >= 1
    metrics = batch.metrics()
    assert metrics["rollout/engine/throttles"] == throttled
    assert metrics["rollout/engine/retries/ThrottlingException"] == throttled


async def test_emulator_data_plane_limit_slows_the_dispatcher_down(moto, channel, emulator):
    emu = await emulator(data_plane_tps=8.0)
    # Five times the emulator's rate: the point is the rate adapting, not retries running out.
    cfg = engine_config(moto, channel, emu, start_rate=40.0, max_retries=30)
    async with RolloutEngine(cfg) as engine:
        batch = await engine.rollout(_batch(30))
    _assert_rest_ok(batch, set())
    assert emu.counts["ThrottlingException"] > 0 and batch.stats.rate_cuts >= 1
    assert batch.stats.start_rate < 40.0


async def test_quota_402_is_retried_until_a_slot_frees(moto, channel, emulator):
    emu = await emulator(max_sessions=2)
    reqs = _batch(6)
    async with RolloutEngine(engine_config(moto, channel, emu, max_retries=30)) as engine:
        batch = await engine.rollout(reqs)
    _assert_rest_ok(batch, set())
    assert emu.counts["ServiceQuotaExceededException"] > 0
    assert emu.sessions.live.peak <= 2


async def test_quota_402_with_no_retries_left_is_submit_failed(moto, channel, emulator):
    emu = await emulator(max_sessions=3)
    reqs = _batch(8, {i: {"sleep": 1.0} for i in range(8)})
    async with RolloutEngine(engine_config(moto, channel, emu, max_retries=0)) as engine:
        batch = await engine.rollout(reqs)
    assert batch.counts["ok"] == 3 and batch.counts["submit_failed"] == 5
    failed = [o for o in batch.outcomes if o.outcome is Outcome.SUBMIT_FAILED]
    assert all("ServiceQuotaExceededException" in o.error and o.result is None for o in failed)
    assert sorted(emu.sessions.stopped) == sorted(emu.sessions.started)


async def test_non_retryable_error_fails_at_once(moto, channel, emulator):
    emu = await emulator(
        runtime_arns=("arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/other",)
    )
    async with RolloutEngine(engine_config(moto, channel, emu)) as engine:
        batch = await engine.rollout(_batch(2))
    assert batch.counts["submit_failed"] == 2
    assert "ResourceNotFoundException" in batch.outcomes[0].error
    assert batch.stats.invokes == 2 and batch.stats.retries == {}  # no retries
    assert batch.stats.invoke_errors == {"ResourceNotFoundException": 2}


async def test_duplicate_notifications_give_one_outcome_each(moto, channel, emulator):
    emu = await emulator()
    sqs = moto.client("sqs")
    reqs = _batch(4, {i: {"sleep": 0.5} for i in range(4)})
    async with RolloutEngine(engine_config(moto, channel, emu)) as engine:
        handles = [engine.submit(r) for r in reqs]
        event = {
            "Records": [
                {
                    "eventSource": "aws:s3",
                    "eventName": "ObjectCreated:Put",
                    "s3": {
                        "bucket": {"name": channel.bucket},
                        "object": {"key": result_key("rollouts", "exp1", 0, r.request_id)},
                    },
                }
                for r in reqs
            ]
        }
        outcomes = [await h for h in handles]
        for _ in range(3):  # late duplicates, after hand-off
            sqs.send_message(QueueUrl=channel.queue_url, MessageBody=json.dumps(event))
        await _until(lambda: engine.stats().duplicates >= 12)
    assert [o.outcome for o in outcomes] == [Outcome.OK] * 4


async def test_message_of_another_experiment_stays_on_the_queue(
    moto, channel, emulator, monkeypatch
):
    monkeypatch.setattr(_inbox, "_FOREIGN_VISIBILITY", 30)  # still hidden when counted below
    emu = await emulator()
    sqs, s3 = moto.client("sqs"), moto.client("s3")
    foreign_key = result_key("rollouts", "someone-else", 0, "r1")
    s3.put_object(Bucket=channel.bucket, Key=foreign_key, Body=b"{}")
    async with RolloutEngine(engine_config(moto, channel, emu)) as engine:
        batch = await engine.rollout(_batch(3))
        await _until(lambda: engine.stats().foreign_messages >= 1)
    _assert_rest_ok(batch, set())
    sqs.change_message_visibility  # noqa: B018  (kept visible-later, not deleted)
    attrs = sqs.get_queue_attributes(
        QueueUrl=channel.queue_url, AttributeNames=["ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    assert int(attrs["ApproximateNumberOfMessagesNotVisible"]) == 1
    assert s3.get_object(Bucket=channel.bucket, Key=foreign_key)["Body"].read() == b"{}"


async def test_result_of_an_older_step_is_kept_apart(moto, channel, emulator):
    emu = await emulator()
    async with RolloutEngine(engine_config(moto, channel, emu)) as engine:
        # Step 0: a straggler is cancelled; its agent's result lands after the step moved on.
        straggler = RolloutRequest({"a": 1, "b": 1, "mode": "hang"}, input_id="late")
        handle = engine.submit(straggler)
        await _until(lambda: straggler.request_id in controls)
        handle.cancel()
        assert (await handle).outcome is Outcome.CANCELLED
        engine.set_step(1)
        batch1_task = asyncio.create_task(engine.rollout(_batch(3)))
        control = controls[straggler.request_id]
        late = make_result(
            exp_id="exp1",
            request_id=straggler.request_id,
            input_id="late",
            session_id=control.session_id,
            rewards=0.25,
        )
        body = signed_body(late, control.sig_key)
        moto.client("s3").put_object(Bucket=channel.bucket, Key=control.result.key, Body=body)
        batch1 = await batch1_task
        await _until(lambda: engine.stats().late_results >= 1)
        taken = engine.take_late()
        assert engine.take_late() == []  # taken once
    _assert_rest_ok(batch1, set())
    assert [(r.request_id, r.step, r.reward) for r in taken] == [(straggler.request_id, 0, 0.25)]
    assert all(o.step == 1 for o in batch1.outcomes)


async def test_corrupt_oversized_and_forged_results_are_invalid(moto, channel, emulator):
    emu = await emulator()
    reqs = _batch(
        7,
        {
            1: {"mode": "corrupt"},
            2: {"mode": "big_by_hand", "size": 200_000},
            3: {"mode": "forge"},
            4: {"mode": "big", "size": 200_000},
        },
    )
    cfg = engine_config(moto, channel, emu, max_result_bytes=100_000)
    async with RolloutEngine(cfg) as engine:
        batch = await engine.rollout(reqs)
    o = batch.outcomes
    assert [o[i].outcome for i in (1, 2, 3)] == [Outcome.INVALID_RESULT] * 3
    assert "not valid JSON" in o[1].error
    assert "over the 100000 limit" in o[2].error
    assert "signature does not match" in o[3].error
    assert batch.stats.invalid_results == {"not_json": 1, "too_large": 1, "signature": 1}
    # The engine tells the SDK its limit: an agent's own oversized output is its error.
    assert o[4].outcome is Outcome.AGENT_ERROR and "over the 100000 limit" in o[4].error
    assert all(o[i].result is None and o[i].reward is None for i in (1, 2, 3))
    _assert_rest_ok(batch, {1, 2, 3, 4})


async def test_lost_notifications_are_recovered_by_looking_in_s3(moto, channel, emulator):
    emu = await emulator()
    silent_queue = moto.client("sqs").create_queue(QueueName=f"{channel.bucket}-silent")["QueueUrl"]
    cfg = engine_config(
        moto, channel, emu, queue_url=silent_queue, rollout_timeout=8.0, reconcile_before=6.5
    )
    async with RolloutEngine(cfg) as engine:
        batch = await engine.rollout(_batch(4))
    _assert_rest_ok(batch, set())
    assert batch.stats.recovered_by_lookup == 4 and batch.stats.messages == 0
    assert batch.stats.s3_lookups >= 4


async def test_malformed_messages_do_not_stop_the_loop(moto, channel, emulator):
    emu = await emulator()
    sqs = moto.client("sqs")
    for body in ("not json", '{"Records": "nope"}', '{"v": 2, "kind": "rollout_result"}'):
        sqs.send_message(QueueUrl=channel.queue_url, MessageBody=body)
    async with RolloutEngine(engine_config(moto, channel, emu)) as engine:
        batch = await engine.rollout(_batch(3))
        await _until(lambda: engine.stats().malformed_messages >= 3)
    _assert_rest_ok(batch, set())


async def test_bounds_on_starts_and_live_sessions_hold(moto, channel, emulator):
    emu = await emulator(cold_start=0.3)
    rate, start_time, live = 20.0, 0.25, 6
    cfg = engine_config(
        moto, channel, emu, start_rate=rate, session_start_time=start_time, max_live_sessions=live
    )
    async with RolloutEngine(cfg) as engine:
        batch = await engine.rollout(_batch(30, {i: {"sleep": 0.2} for i in range(30)}))
    _assert_rest_ok(batch, set())
    assert emu.sessions.starting.peak == math.ceil(rate * start_time)  # reached, never exceeded
    assert emu.sessions.live.peak == live  # stopping sessions hold their slots too
    assert batch.stats.peak_starts_in_flight == math.ceil(rate * start_time)
    assert batch.stats.peak_live_sessions == live
    assert engine.stats().live_sessions == 0  # closing the engine waited for the last stops
    sessions = emu.sessions
    assert len(sessions.started) == 30 and sorted(sessions.stopped) == sorted(sessions.started)


async def test_cancel_and_stream(moto, channel, emulator):
    emu = await emulator()
    reqs = _batch(4, {0: {"mode": "hang"}})
    async with RolloutEngine(engine_config(moto, channel, emu)) as engine:
        early = engine.submit(RolloutRequest({"a": 0, "b": 0}, input_id="early"))
        early.cancel()  # before it ever ran: nothing dispatched
        assert (await early).outcome is Outcome.CANCELLED
        with pytest.raises(ValueError, match="already in use"):
            engine.submit(early.request)
        handle = engine.submit(reqs[0])
        seen = [o async for o in _take(engine.stream(reqs[1:]), 3)]
        handle.cancel()
        cancelled = await handle
    assert {o.outcome for o in seen} == {Outcome.OK}
    assert cancelled.outcome is Outcome.CANCELLED and cancelled.result is None
    assert not any(early.request.request_id in sid for sid in emu.sessions.started)
    assert sorted(emu.sessions.stopped) == sorted(emu.sessions.started)


async def _take(agen, n):
    got = 0
    async for item in agen:
        yield item
        got += 1
        if got == n:
            break


async def _until(predicate, timeout: float = 15.0) -> None:
    give_up = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < give_up, "condition not reached in time"
        await asyncio.sleep(0.05)


async def test_direct_notifications_when_the_bucket_does_not_notify(moto, channel, emulator):
    emu = await emulator()
    silent_queue = moto.client("sqs").create_queue(QueueName=f"{channel.bucket}-direct")["QueueUrl"]
    cfg = engine_config(moto, channel, emu, queue_url=silent_queue, notify_directly=True)
    async with RolloutEngine(cfg) as engine:
        batch = await engine.rollout(_batch(4))
    _assert_rest_ok(batch, set())
    assert batch.stats.messages == 4 and batch.stats.recovered_by_lookup == 0
