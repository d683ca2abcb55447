"""Several runtime endpoints through the real wire: aiobotocore -> emulator(s) -> RolloutApp.

The endpoints of one account share its quotas (new sessions, data-plane calls), read from
Service Quotas at start-up; another account or region brings its own. One endpoint killed
mid-run leaves the others to carry every request that can start there."""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter

import pytest

from agentcore_rollout import ConfigError, Outcome, RolloutEngine, RolloutRequest, RolloutStart
from agentcore_rollout._dispatch.dispatcher import RequestDispatcher
from agentcore_rollout._dispatch.endpoints import RuntimeEndpoint, SubmitFailed, retry_budget
from agentcore_rollout._dispatch.start_queue import LiveSession
from agentcore_rollout.config import load_config
from agentcore_rollout.runtimes.base import SessionCallError

from .conftest import RUNTIME_ARN, engine_config
from .factories import dies_before_stopping, flat_config
from .test_limits import FakeRuntime

pytestmark = pytest.mark.component

ARNS = [RUNTIME_ARN.replace("abc123", suffix) for suffix in ("aaa111", "bbb222", "ccc333")]
OTHER_ACCOUNT = ARNS[0].replace("123456789012", "210987654321")


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


def _per_second(created: list[float]) -> tuple[int, float]:
    """The most sessions created in any one second, and the rate over the whole span (by the
    emulator's own clock)."""
    created = sorted(created)
    most = max(sum(1 for u in created[i:] if u - t < 1.0) for i, t in enumerate(created))
    return most, (len(created) - 1) / (created[-1] - created[0])


async def _spread(moto, channel, emu, arns: list[str], n: int, **overrides):
    """`n` rollouts over the endpoints DEFAULT and endpoint_2 of each of `arns`, the engine's
    quotas read from the emulator's Service Quotas."""
    runtimes = [{"arn": arn, "qualifier": q} for arn in arns for q in ("DEFAULT", "endpoint_2")]
    cfg = _runtimes_config(
        moto,
        channel,
        emu,
        runtimes,
        service_urls={
            "s3": moto.url,
            "sqs": moto.url,
            "agentcore": emu.url,
            "service_quotas": emu.url,
        },
        **({"start_rate": None} | overrides),
    )
    async with RolloutEngine(cfg) as engine:
        batch = await engine.rollout(_requests(n))
    assert batch.counts["ok"] == n, [o.error for o in batch.outcomes if o.outcome != Outcome.OK]
    assert emu.counts["ThrottlingException"] == 0  # never above an account's quota
    sessions = emu.sessions
    assert sorted(sessions.stopped) == sorted(sessions.started)  # each stopped where it started
    return batch


async def test_an_accounts_endpoints_share_its_start_rate_another_account_doubles_it(
    moto, channel, emulator
):
    # 5 new sessions a second per account: low, so a machine busy with other tests keeps up
    # with two accounts (at 10/s, once in a full parallel run it did not: the ratio fell short)
    emu = await emulator(
        runtime_arns=(ARNS[0], OTHER_ACCOUNT),
        qualifiers=("DEFAULT", "endpoint_2"),
        new_sessions_per_second=5,
    )
    one = await _spread(moto, channel, emu, [ARNS[0]], 30)
    most, one_rate = _per_second([t for t, _, _ in emu.sessions.created])
    assert most <= 5 + 1  # the account's second, and the engine's one token of burst
    assert one_rate <= 5 * 1.05, one_rate
    assert one.stats.pool_limits == {
        "123456789012:us-east-1/start_rate": 5.0,
        "123456789012:us-east-1/call_rate": 1000.0,
        "123456789012:us-east-1/max_live_sessions": 64.0,
    }
    assert sum(one.stats.starts_by_endpoint.values()) == 30
    emu.sessions.created.clear()
    # Credentials are one account's: Service Quotas says nothing of the other (the published
    # 25/s there), so the rate is set, and holds in each account.
    two = await _spread(
        moto, channel, emu, [ARNS[0], OTHER_ACCOUNT], 30, exp_id="two", start_rate=5.0
    )
    _, two_rate = _per_second([t for t, _, _ in emu.sessions.created])
    assert two.stats.start_rate == 10.0
    assert two_rate >= 1.5 * one_rate, (one_rate, two_rate)
    assert {a.split(":")[4] for _, a, _ in emu.sessions.created} == {"123456789012", "210987654321"}


async def test_stops_share_the_data_plane_rate_with_invokes(moto, channel, emulator):
    # 10 data-plane calls a second per account: starts and their stops fit in it together
    emu = await emulator(
        runtime_arns=(ARNS[0],), qualifiers=("DEFAULT", "endpoint_2"), data_plane_tps=10
    )
    batch = await _spread(moto, channel, emu, [ARNS[0]], 30)
    assert batch.stats.pool_limits["123456789012:us-east-1/call_rate"] == 10.0
    assert emu.counts["invoke"] == emu.counts["stop"] == 30


async def test_a_killed_endpoint_leaves_its_requests_to_the_others(moto, channel, emulator):
    emus = [await emulator(runtime_arns=(arn,)) for arn in ARNS]
    runtimes = [{"arn": arn, "data_plane_url": e.url} for arn, e in zip(ARNS, emus, strict=True)]
    cfg = _runtimes_config(  # a deadline far beyond the retry budget: nothing waits it out
        moto, channel, emus[0], runtimes, max_live_sessions=200, rollout_timeout=300.0
    )
    killed = emus[1]
    async with RolloutEngine(cfg) as engine:
        handles = [engine.submit(r) for r in _requests(45, sleep=0.5)]
        while len(killed.sessions.started) < 4:  # noqa: ASYNC110 (the emulator has no event for it)
            await asyncio.sleep(0.02)
        await killed.stop()  # its process gone: connections refused, its sessions ended
        outcomes = [await h for h in handles]
        stats = engine.stats()
    on_killed = set(killed.sessions.started)
    assert all(o.outcome in {Outcome.OK, Outcome.TIMEOUT, Outcome.SUBMIT_FAILED} for o in outcomes)
    # Whatever could start elsewhere did and ended ok. What may have started on the killed
    # endpoint could not (a second session would run the same rollout): a session it opened,
    # or an invocation cut off by the kill, each retried and stopped only there.
    lost = [o for o in outcomes if o.outcome is not Outcome.OK and o.session_id not in on_killed]
    cut_off = sum(n for code, n in stats.invoke_errors.items() if code != "EndpointConnectionError")
    assert len(lost) <= cut_off, (stats.invoke_errors, [o.error for o in lost])
    assert all("bbb222" in (o.error or "") for o in lost)
    assert sum(o.outcome is Outcome.OK for o in outcomes) >= 45 - len(on_killed) - cut_off
    assert stats.endpoints_down == 1 and not stats.runtime_down
    # Its sessions that had not written before the kill ended once it was declared down (its
    # probes found it gone), long before their deadlines, and say why.
    ran_there = [o for o in outcomes if o.started_at is not None and o.session_id in on_killed]
    cut = [o for o in ran_there if o.outcome is not Outcome.OK]
    assert cut, [o.outcome for o in ran_there]  # sleep 0.5 s: some were running at the kill
    for o in cut:
        assert o.outcome is Outcome.TIMEOUT and "endpoint was declared down" in (o.error or "")
        assert o.deadline is not None and o.finished_at < o.deadline - 200, o
    alive = set(emus[0].sessions.started) | set(emus[2].sessions.started)
    assert alive and sorted(emus[0].sessions.stopped + emus[2].sessions.stopped) == sorted(alive)


async def test_resume_stops_each_session_on_the_endpoint_it_started_on(moto, channel, emulator):
    emu = await emulator(runtime_arns=tuple(ARNS[:2]))
    runtimes = [{"arn": ARNS[0]}, {"arn": ARNS[1]}]
    cfg = _runtimes_config(moto, channel, emu, runtimes, run_secret="s" * 32, start_rate=4.0)
    requests = _requests(4, sleep=4.0)
    journaled: list[RolloutStart] = []
    first = RolloutEngine(cfg)
    await first.start()
    for r in requests:
        first.submit(r, on_start=journaled.append)
    while len(journaled) < 4:  # noqa: ASYNC110 (waiting for the engine's own callbacks)
        await asyncio.sleep(0.05)

    dies_before_stopping(first)
    await first.aclose()
    assert {s.endpoint for s in journaled} == {f"{a}#DEFAULT" for a in ARNS[:2]}
    assert not emu.sessions.stopped and len(emu.sessions) == 4
    async with RolloutEngine(cfg) as second:
        handles = [second.resume(s) for s in journaled]
        outcomes = [await h for h in handles]
    assert [o.outcome for o in outcomes] == [Outcome.OK] * 4
    assert emu.counts["invoke"] == 4  # none ran twice
    # each stop named its session's own runtime: one on the other would be ResourceNotFound
    assert sorted(emu.sessions.stopped) == sorted(emu.sessions.started) and not emu.sessions
    assert emu.counts["ResourceNotFoundException"] == 0


def test_one_runtime_is_the_one_element_case_of_runtimes():
    one = flat_config(runtime_arn=RUNTIME_ARN, qualifier="prod")
    listed = flat_config(runtimes=[{"arn": RUNTIME_ARN, "qualifier": "prod"}])
    assert one.all_runtimes == listed.all_runtimes
    (target,) = one.all_runtimes
    assert target.name == f"{RUNTIME_ARN}#prod" and target.account == "123456789012:us-east-1"
    assert target.max_live_sessions is None  # only its account's


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
    per_account = error(runtimes=[{"arn": ARNS[0], "start_rate": 5}])  # a rate of its own: gone
    assert per_account.startswith("config: engine.runtimes.0: start_rate: ")
    assert "per account and region since August 2026" in per_account
    assert "set engine.dispatch.start_rate" in per_account
    with pytest.raises(ConfigError, match=r"engine.runtime_arn or engine.runtimes is not set"):
        flat_config(bucket="b-bucket", queue_url="http://q").require_targets()


# The dispatcher's choices between endpoints, with runtimes that answer as told.


async def _started_on(d: RequestDispatcher, sid: str) -> tuple[str, LiveSession]:
    async with d.live_session(sid, math.inf) as session:
        started = await d.start(session, lambda _: b"{}", timeout=10.0, deadline=math.inf)
    return started.endpoint, session


def _dispatcher(*runtimes: FakeRuntime, accounts: tuple[str, ...] = (), **cfg) -> RequestDispatcher:
    base = {"bucket": "bkt", "queue_url": "q", "runtime_arn": RUNTIME_ARN, "start_rate": 1000.0}
    config = flat_config(**(base | {"backoff_base": 0.01, "backoff_max": 0.05} | cfg))
    endpoints = [
        RuntimeEndpoint(f"e{i}", r, pool=accounts[i] if accounts else "")
        for i, r in enumerate(runtimes)
    ]
    return RequestDispatcher(endpoints, config)


async def test_a_refused_start_retries_elsewhere_one_that_may_have_started_where_it_was_sent():
    refused = SessionCallError("ServiceQuotaExceededException", "full", retryable=True)
    refused.maybe_started = False
    a, b = FakeRuntime(errors=[refused]), FakeRuntime()
    d = _dispatcher(a, b)
    assert (await _started_on(d, "s" * 40))[0] == "e1"  # refused on e0: started on e1
    await d.aclose()
    assert a.stopped == [] and b.stopped == ["s" * 40]  # stopped where it started

    cut = SessionCallError("InternalServerException", "5xx", retryable=True, outage=True)
    a, b = FakeRuntime(errors=[cut]), FakeRuntime()
    d = _dispatcher(a, b)
    assert (await _started_on(d, "t" * 40))[0] == "e0"  # may exist on e0: retried there
    await d.aclose()
    assert a.invoked == ["t" * 40] and b.invoked == [] and a.stopped == ["t" * 40]


async def test_live_bound_per_account_and_per_endpoint():
    runtimes = [FakeRuntime(start_time=0.01) for _ in range(3)]
    d = _dispatcher(*runtimes, accounts=("1", "1", "2"), max_live_sessions=2)
    held = [d.live_session(f"{i:040d}", math.inf) for i in range(6)]
    sessions = [await h.__aenter__() for h in held[:4]]  # 2 per account: 4 at most
    for s in sessions:
        await d.start(s, lambda _: b"{}", timeout=10.0, deadline=math.inf)
    by_account = Counter("1" if s.endpoint in ("e0", "e1") else "2" for s in sessions)
    assert by_account == {"1": 2, "2": 2}
    with pytest.raises(SubmitFailed, match="live-session slot"):
        async with d.live_session("x" * 40, time.time() + 0.05):
            pass
    for h in held[:4]:
        await h.__aexit__(None, None, None)
    await d.aclose()
    assert sum(len(r.stopped) for r in runtimes) == 4 and d.live.value == 0


async def test_every_endpoint_down_fails_waiting_starts_one_down_moves_them():
    def down() -> SessionCallError:
        return SessionCallError("EndpointConnectionError", "x", retryable=True, outage=True)

    for e in (a_down := [down() for _ in range(100)]):
        e.maybe_started = False
    a, b = FakeRuntime(errors=a_down), FakeRuntime()
    d = _dispatcher(a, b, max_retries=3)
    ends = [await _started_on(d, f"{i:040d}") for i in range(20)]
    assert {e for e, _ in ends} == {"e1"}  # none failed: e0's refusals went to e1
    assert d.stats()["starts_by_endpoint"] == {"e0": 0, "e1": 20}
    both = [down() for _ in range(400)]
    for e in both:
        e.maybe_started = False
    d = _dispatcher(FakeRuntime(errors=both[:200]), FakeRuntime(errors=both[200:]), max_retries=3)
    with pytest.raises(SubmitFailed):  # failing, both, since its first attempt
        await _started_on(d, "x" * 40)
    await asyncio.sleep(retry_budget(d._cfg))  # failing for longer than the budget
    with pytest.raises(SubmitFailed, match=r"every endpoint down: e0 down for .*; e1 down for"):
        await _started_on(d, "y" * 40)
    assert d.stats()["runtime_down"] and d.stats()["endpoints_down"] == 2
    with pytest.raises(SubmitFailed, match=r"every endpoint down"):  # at once, no probe due
        await _started_on(d, "z" * 40)


async def test_each_request_starts_on_a_runtime_of_its_environment(moto, channel, emulator):
    emu = await emulator(runtime_arns=tuple(ARNS))
    runtimes = [
        {"arn": ARNS[0], "environment": "env-a"},
        {"arn": ARNS[1], "environment": "env-b"},
        {"arn": ARNS[2], "environment": "env-b"},
    ]
    cfg = _runtimes_config(moto, channel, emu, runtimes, start_rate=50.0)
    requests = [
        RolloutRequest({"a": i, "b": 1, "environment": "ab"[i % 2].join(("env-", ""))}, f"q{i}")
        for i in range(12)
    ]
    started: list[RolloutStart] = []
    async with RolloutEngine(cfg) as engine:
        with pytest.raises(ValueError, match=r"^payload environment 'env-c': no runtime in"):
            engine.submit(RolloutRequest({"a": 1, "b": 1, "environment": "env-c"}, "qc"))
        with pytest.raises(ValueError, match=r"environment None: .*theirs: env-a, env-b\)$"):
            engine.submit(RolloutRequest({"a": 1, "b": 1}, "qn"))
        outcomes = [await h for h in [engine.submit(r, on_start=started.append) for r in requests]]
    assert [o.outcome for o in outcomes] == [Outcome.OK] * 12
    where: dict[str, set[str]] = {"env-a": set(), "env-b": set()}
    for s in started:
        where[s.request.payload["environment"]].add(s.endpoint.split("#")[0])
    assert where == {"env-a": {ARNS[0]}, "env-b": {ARNS[1], ARNS[2]}}  # b's spread over its two


async def test_many_more_requests_than_live_slots_over_environments_all_start(
    moto, channel, emulator
):
    """Harbor's shape: every runtime of one environment, 3x more requests than live slots.
    Each one waits its turn for a slot (the wait itself routed by environment), none fails."""
    emu = await emulator(runtime_arns=tuple(ARNS))
    runtimes = [{"arn": arn, "environment": f"env-{i}"} for i, arn in enumerate(ARNS)]
    cfg = _runtimes_config(moto, channel, emu, runtimes, start_rate=50.0, max_live_sessions=4)
    requests = [
        RolloutRequest({"a": i, "b": 1, "environment": f"env-{i % 3}"}, f"q{i}") for i in range(15)
    ]
    started: list[RolloutStart] = []
    async with RolloutEngine(cfg) as engine:
        handles = [engine.submit(r, on_start=started.append) for r in requests]
        outcomes = [await h for h in handles]
    assert Counter(o.outcome for o in outcomes) == {Outcome.OK: 15}, [o.error for o in outcomes]
    assert {s.request.payload["environment"]: s.endpoint.split("#")[0] for s in started} == {
        f"env-{i}": arn for i, arn in enumerate(ARNS)
    }


async def test_an_environment_whose_runtimes_are_down_fails_alone():
    def down() -> SessionCallError:
        error = SessionCallError("EndpointConnectionError", "x", retryable=True, outage=True)
        error.maybe_started = False
        return error

    base = {"bucket": "bkt", "queue_url": "q", "runtime_arn": RUNTIME_ARN, "start_rate": 1000.0}
    config = flat_config(**(base | {"backoff_base": 0.01, "backoff_max": 0.05, "max_retries": 3}))
    a, b = FakeRuntime(errors=[down() for _ in range(200)]), FakeRuntime()
    endpoints = [RuntimeEndpoint("a", a, environment="A"), RuntimeEndpoint("b", b, environment="B")]
    d = RequestDispatcher(endpoints, config)

    async def start(sid: str, environment: str) -> str:
        async with d.live_session(sid, math.inf, environment=environment) as session:
            started = await d.start(session, lambda _: b"{}", timeout=10.0, deadline=math.inf)
        return started.endpoint

    with pytest.raises(SubmitFailed):  # A's one runtime refuses: B's is no place for it
        await start("x" * 40, "A")
    await asyncio.sleep(retry_budget(d._cfg))
    with pytest.raises(SubmitFailed, match=r"^a down for "):  # A down: at once, and alone
        await start("y" * 40, "A")
    assert [await start(f"{i:040d}", "B") for i in range(5)] == ["b"] * 5
    assert sorted(b.invoked) == [f"{i:040d}" for i in range(5)]  # none of A's went to B
    assert d.stats()["endpoints_down"] == 1 and not d.stats()["runtime_down"]
    await d.aclose()
