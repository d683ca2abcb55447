"""Several runtime endpoints through the real wire: aiobotocore -> emulator(s) -> RolloutApp.

Starts spread over the endpoints at the sum of their rates, each within its own quota; one
endpoint killed mid-run leaves the others to carry every request that can start there."""

from __future__ import annotations

import asyncio

from agentcore_rollout import Outcome, RolloutEngine, RolloutRequest

from .conftest import RUNTIME_ARN, engine_config

ARNS = [RUNTIME_ARN.replace("abc123", suffix) for suffix in ("aaa111", "bbb222", "ccc333")]


def _requests(n: int, **payload: object) -> list[RolloutRequest]:
    return [
        RolloutRequest({"a": i, "b": i % 5, **payload}, input_id=f"q{i}", sample_index=0)
        for i in range(n)
    ]


def _runtimes_config(moto, channel, emu, runtimes: list[dict[str, object]], **overrides):
    cfg = engine_config(moto, channel, emu, **overrides)
    return type(cfg).model_validate(
        cfg.model_dump(exclude={"runtime_arn"}) | {"runtimes": runtimes}
    )


async def test_three_endpoints_reach_the_sum_of_their_start_rates(moto, channel, emulator):
    # 330/min = 5.5/s per endpoint: above each engine rate, so nothing is throttled
    emu = await emulator(runtime_arns=tuple(ARNS), new_sessions_per_minute=330)
    rates = [3.0, 4.0, 5.0]
    runtimes = [{"arn": arn, "start_rate": rate} for arn, rate in zip(ARNS, rates, strict=True)]
    cfg = _runtimes_config(
        moto, channel, emu, runtimes, max_live_sessions=200, session_start_time=2.0
    )
    async with RolloutEngine(cfg) as engine:
        batch = await engine.rollout(_requests(60))
    assert batch.counts["ok"] == 60, [o.error for o in batch.outcomes if o.outcome != Outcome.OK]
    created = sorted(t for t, _, _ in emu.created)
    achieved = (len(created) - 1) / (created[-1] - created[0])  # the emulator's own clock
    assert achieved >= 0.95 * sum(rates), achieved
    by_arn = {arn: sum(1 for _, a, _ in emu.created if a == arn) for arn in ARNS}
    assert by_arn[ARNS[0]] < by_arn[ARNS[2]], by_arn  # each at its own rate, not round robin
    assert emu.counts["ThrottlingException"] == 0
    starts = batch.stats.starts_by_endpoint
    assert {name.split("#")[0]: n for name, n in starts.items()} == by_arn
    assert sorted(emu.stopped) == sorted(emu.started)  # each stopped where it started


async def test_a_killed_endpoint_leaves_its_requests_to_the_others(moto, channel, emulator):
    emus = [await emulator(runtime_arns=(arn,)) for arn in ARNS]
    runtimes = [
        {"arn": arn, "start_rate": 5.0, "endpoint_url": e.url}
        for arn, e in zip(ARNS, emus, strict=True)
    ]
    cfg = _runtimes_config(
        moto, channel, emus[0], runtimes, max_live_sessions=200, rollout_timeout=6.0
    )
    killed = emus[1]
    async with RolloutEngine(cfg) as engine:
        handles = [engine.submit(r) for r in _requests(45, sleep=0.5)]
        while len(killed.started) < 4:  # noqa: ASYNC110 (the emulator has no event for it)
            await asyncio.sleep(0.02)
        await killed.stop()  # its process gone: connections refused, its sessions ended
        outcomes = [await h for h in handles]
        stats = engine.stats()
    on_killed = set(killed.started)
    for o in outcomes:
        # whatever never started on the killed endpoint started elsewhere and ended ok
        assert o.outcome is Outcome.OK or o.session_id in on_killed, (o.outcome, o.error)
        assert o.outcome in {Outcome.OK, Outcome.TIMEOUT, Outcome.SUBMIT_FAILED}
    assert sum(o.outcome is Outcome.OK for o in outcomes) >= 45 - len(on_killed)
    assert stats.endpoints_down == 1 and not stats.runtime_down
    alive = set(emus[0].started) | set(emus[2].started)
    assert alive and sorted(emus[0].stopped + emus[2].stopped) == sorted(alive)
