"""Several runtime endpoints through the real wire: aiobotocore -> emulator(s) -> RolloutApp.

Starts spread over the endpoints at the sum of their rates, each within its own quota; one
endpoint killed mid-run leaves the others to carry every request that can start there."""

from __future__ import annotations

import asyncio

import pytest

from agentcore_rollout import ConfigError, Outcome, RolloutEngine, RolloutRequest, RolloutStart
from agentcore_rollout.config import load_config

from .conftest import RUNTIME_ARN, engine_config
from .factories import flat_config

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


async def test_resume_stops_each_session_on_the_endpoint_it_started_on(moto, channel, emulator):
    emu = await emulator(runtime_arns=tuple(ARNS[:2]))
    runtimes = [{"arn": ARNS[0], "start_rate": 2.0}, {"arn": ARNS[1], "start_rate": 2.0}]
    cfg = _runtimes_config(moto, channel, emu, runtimes, run_secret="s" * 32)
    requests = _requests(4, sleep=4.0)
    journaled: list[RolloutStart] = []
    first = RolloutEngine(cfg)
    await first.start()
    for r in requests:
        first.submit(r, on_start=journaled.append)
    while len(journaled) < 4:  # noqa: ASYNC110 (waiting for the engine's own callbacks)
        await asyncio.sleep(0.05)

    async def _died_before_stopping(*_: object) -> None:
        """The first engine's process dies: its sessions run on, never stopped by it."""

    first._dispatcher._stop = _died_before_stopping  # type: ignore[method-assign]
    await first.aclose()
    assert {s.endpoint for s in journaled} == {f"{a}#DEFAULT" for a in ARNS[:2]}
    assert not emu.stopped and len(emu.sessions) == 4
    async with RolloutEngine(cfg) as second:
        handles = [
            second.resume(s.request, step=0, deadline=s.deadline, endpoint=s.endpoint)
            for s in journaled
        ]
        outcomes = [await h for h in handles]
    assert [o.outcome for o in outcomes] == [Outcome.OK] * 4
    assert emu.counts["invoke"] == 4  # none ran twice
    # each stop named its session's own runtime: one on the other would be ResourceNotFound
    assert sorted(emu.stopped) == sorted(emu.started) and not emu.sessions
    assert emu.counts["ResourceNotFoundException"] == 0


def test_one_runtime_is_the_one_element_case_of_runtimes():
    one = flat_config(runtime_arn=RUNTIME_ARN, qualifier="prod")
    listed = flat_config(runtimes=[{"arn": RUNTIME_ARN, "qualifier": "prod"}])
    assert one.all_runtimes == listed.all_runtimes
    (target,) = one.all_runtimes
    assert target.name == f"{RUNTIME_ARN}#prod" and target.account == "123456789012:us-east-1"
    assert target.start_rate is None and target.max_live_sessions is None  # dispatch's


def test_runtimes_errors_are_one_line_naming_the_key():
    def error(**engine: object) -> str:
        with pytest.raises(ConfigError) as e:
            load_config(env_file=None, environ={}, overrides={"engine": engine})
        assert "\n" not in str(e.value)
        return str(e.value)

    both = error(runtime_arn=RUNTIME_ARN, runtimes=[{"arn": ARNS[0]}])
    assert "runtime_arn" in both and "not both" in both
    assert "listed twice" in error(runtimes=[{"arn": ARNS[0]}, {"arn": ARNS[0]}])
    assert "engine.runtimes.0.arn" in error(runtimes=[{"arn": "arn:nope"}])
    assert "engine.runtimes.0.start_rate" in error(runtimes=[{"arn": ARNS[0], "start_rate": 0}])
    with pytest.raises(ConfigError, match=r"engine.runtime_arn or engine.runtimes is not set"):
        flat_config(bucket="b-bucket", queue_url="http://q").require_targets()
