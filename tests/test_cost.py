"""What a rollout cost: the arithmetic (`_cost`), and over the wire, an agent holding a known
time through the local stack's emulator, gateway and toy policy: its sandbox seconds within
bounds the test measures, its tokens the trace's, a timeout and a cancel that started costing
too, and the same figures in `batch.metrics()` and summary.json."""

from __future__ import annotations

import asyncio
import json
import math
import time

import pytest

from agentcore_rollout import (
    EngineStats,
    Outcome,
    RolloutBatch,
    RolloutCost,
    RolloutEngine,
    RolloutOutcome,
    RolloutRequest,
    RolloutStart,
    SessionCallError,
    load_config,
)
from agentcore_rollout._cost import rollout_cost
from agentcore_rollout._dispatch.dispatcher import RequestDispatcher
from agentcore_rollout._dispatch.endpoints import SubmitFailed
from agentcore_rollout.cli.summary import RunSummary, Tally
from agentcore_rollout.config import ConfigError, CostConfig
from agentcore_rollout.local.config import LocalConfig
from agentcore_rollout.local.stack import LocalStack

from .factories import flat_config

pytestmark = pytest.mark.component

AGENTCORE_PER_S = (2 * 0.0895 + 8 * 0.00945) / 3600  # published prices, a whole session's size


def _trace(prompt: int, completion: int, reused: int | None) -> dict:
    usage = {"prompt_tokens": prompt, "completion_tokens": completion}
    if reused is not None:
        usage["reused_prompt_tokens"] = reused
    return {"usage": usage, "turns": [{"reused_prompt_tokens": 5}, {"reused_prompt_tokens": 7}]}


def test_sandbox_seconds_at_agentcore_prices_and_tokens_at_per_token_prices():
    prices = CostConfig(
        prompt_usd_per_mtok=1.0, completion_usd_per_mtok=2.0, reused_usd_per_mtok=0.1
    )
    cost = rollout_cost(prices, 100.0, 160.0, _trace(1000, 200, 600))
    assert cost.sandbox_seconds == 60.0
    assert cost.sandbox_usd == pytest.approx(60 * AGENTCORE_PER_S)
    assert (cost.prompt_tokens, cost.completion_tokens, cost.reused_prompt_tokens) == (
        1000,
        200,
        600,
    )
    assert cost.token_usd == pytest.approx((400 * 1.0 + 600 * 0.1 + 200 * 2.0) / 1e6)
    assert cost.usd == pytest.approx(cost.sandbox_usd + cost.token_usd)
    # reused tokens at the prompt price unless priced apart; a gateway without the total: turns
    same = rollout_cost(CostConfig(prompt_usd_per_mtok=1.0), 0.0, 1.0, _trace(1000, 0, None))
    assert same.reused_prompt_tokens == 12 and same.token_usd == pytest.approx(1000 / 1e6)


def test_never_started_costs_nothing_a_short_session_a_billed_second_no_trace_unknown_tokens():
    prices = CostConfig()
    never = rollout_cost(prices, None, 50.0, None)
    assert never.sandbox_seconds == 0.0 and never.usd == 0.0
    short = rollout_cost(prices, 10.0, 10.25, None)  # AgentCore bills 1 s at least
    assert short.sandbox_seconds == 0.25 and short.sandbox_usd == pytest.approx(AGENTCORE_PER_S)
    assert short.prompt_tokens is None and short.token_usd is None and short.untraced == 1
    free = rollout_cost(CostConfig(session_vcpus=0, session_gb=0), 0.0, 9.0, _trace(3, 4, 0))
    assert free.usd == 0.0 and free.token_usd == 0.0 and free.untraced == 0  # self-hosted


def test_sums_keep_unknown_tokens_apart_and_metrics_give_per_rollout_and_per_ok():
    prices = CostConfig(prompt_usd_per_mtok=1.0)
    costs = [
        rollout_cost(prices, 0.0, 10.0, _trace(100, 10, 40)),
        rollout_cost(prices, 0.0, 30.0, _trace(300, 30, 0)),
        rollout_cost(prices, 0.0, 20.0, None),  # a failure: its tokens unknown
        rollout_cost(prices, None, 5.0, None),  # never started
    ]
    total = RolloutCost.total([*costs, None])
    assert total.rollouts == 4 and total.untraced == 2
    assert total.sandbox_seconds == 60.0 and total.prompt_tokens == 400
    assert (total.completion_tokens, total.reused_prompt_tokens) == (40, 40)
    assert total.usd == pytest.approx(sum(c.usd for c in costs))
    assert RolloutCost.total([costs[2]]).prompt_tokens is None  # no rollout's tokens known
    metrics = total.metrics(ok=2)
    assert metrics["rollout/cost/usd_per_ok"] == pytest.approx(total.usd / 2)
    assert metrics["rollout/cost/usd_per_rollout"] == pytest.approx(total.usd / 4)
    assert metrics["rollout/cost/untraced"] == 2 and metrics["rollout/cost/sandbox_seconds"] == 60
    assert "rollout/cost/usd_per_ok" not in total.metrics(ok=0)


def test_cost_config_loads_from_the_environment_and_refuses_negative_prices():
    environ = {"AGENTCORE_ROLLOUT_COST__SESSION_VCPUS": "0.25"}
    cost = load_config(None, env_file=None, environ=environ).cost
    assert cost.session_vcpus == 0.25 and cost.vcpu_hour_usd == 0.0895
    with pytest.raises(ConfigError, match=r"engine\.cost\.prompt_usd_per_mtok"):
        load_config(
            None, env_file=None, environ={}, overrides=["engine.cost.prompt_usd_per_mtok=-1"]
        )


def _request(rid: str, hold: float) -> RolloutRequest:
    return RolloutRequest({"question": "What is 2 + 3?", "hold": hold}, "g", request_id=rid)


async def test_each_outcome_carries_what_its_session_and_tokens_cost_over_the_wire():
    """An agent that takes one policy turn and holds `hold` seconds: its session cost at least
    that and at most the time the test saw it run; a timeout and a cancel whose sessions
    started cost their time and tokens too; the batch's metrics and summary.json hold the
    sums."""
    hold, timeout = 1.0, 1.0
    local = LocalConfig(
        app="tests.agents.held:app",
        mode="in_process",
        policy_workers=1,
        bucket="cost",
        queue="cost",
    )
    async with LocalStack(local) as stack:
        config = stack.engine_config(
            flat_config(exp_id="cost", start_rate=50.0, wait_time=1, result_grace=0.5)
        )
        config.cost.prompt_usd_per_mtok = 2.0
        config.cost.completion_usd_per_mtok = 8.0
        async with RolloutEngine(config) as engine:
            began = time.time()
            batch = await engine.rollout([_request(f"ok-{i}", hold) for i in range(3)])
            seen = time.time() - began
            late = engine.submit(_request("late", 6.0), timeout=timeout)
            started = asyncio.Event()

            def on_start(_: RolloutStart) -> None:
                started.set()

            unstarted = engine.submit(_request("unstarted", 6.0))
            unstarted.cancel()  # before its task ran: no session, no gateway session
            cancelled = engine.submit(_request("cancelled", 6.0), on_start=on_start)
            await asyncio.wait_for(started.wait(), 10)
            await asyncio.sleep(2.0)  # its one turn taken long since, then holding
            cancelled.cancel()
            timed_out, cancelled_outcome = await late, await cancelled
            never = (await unstarted).cost

    assert [o.outcome for o in batch.outcomes] == [Outcome.OK] * 3
    for o in batch.outcomes:
        cost, usage = o.cost, o.trace["usage"]
        assert hold <= cost.sandbox_seconds <= o.finished_at - o.started_at + 1e-6 <= seen
        assert (cost.prompt_tokens, cost.completion_tokens) == (
            usage["prompt_tokens"],
            usage["completion_tokens"],
        )
        assert cost.prompt_tokens > 0 and cost.completion_tokens > 0
        # One turn: nothing of its own to reuse, but the sessions send the same question, so
        # all but the first may reuse its render (the gateway's shared prefixes), priced here
        # as any prompt token.
        assert cost.reused_prompt_tokens == usage["reused_prompt_tokens"] < cost.prompt_tokens
        tokens = (cost.prompt_tokens * 2.0 + cost.completion_tokens * 8.0) / 1e6
        assert cost.token_usd == pytest.approx(tokens)
        assert cost.sandbox_usd == pytest.approx(max(1, cost.sandbox_seconds) * AGENTCORE_PER_S)
        assert o.to_dict()["cost"] == cost.to_dict(counts=False)
    # Started, then failed: their sessions cost. The agent's watchdog wrote the timeout's
    # result, so its trace (its turn's tokens) came with it; the cancel has none, and its
    # tokens are what its gateway session reported as it was dropped: the same one turn.
    assert timed_out.outcome is Outcome.TIMEOUT and timed_out.trace is not None
    assert timeout <= timed_out.cost.sandbox_seconds <= timeout + 0.5 + 5.0
    assert timed_out.cost.prompt_tokens == timed_out.trace["usage"]["prompt_tokens"] > 0
    assert cancelled_outcome.outcome is Outcome.CANCELLED
    dropped, one_turn = cancelled_outcome.cost, batch.outcomes[0].cost
    assert cancelled_outcome.trace is None and dropped.untraced == 0
    assert 2.0 <= dropped.sandbox_seconds < 6.0
    assert dropped.prompt_tokens == one_turn.prompt_tokens
    # Its question was rendered by the batch's sessions before: all but the generation prompt
    assert 0 < dropped.reused_prompt_tokens < dropped.prompt_tokens
    assert dropped.completion_tokens > 0
    assert dropped.token_usd > 0
    # Cancelled before it started: no sandbox second, and known to have spent no token.
    assert (never.sandbox_seconds, never.prompt_tokens, never.untraced) == (0.0, 0, 0)
    assert dropped.usd == pytest.approx(dropped.sandbox_usd + dropped.token_usd)

    metrics = batch.metrics()
    assert metrics["rollout/cost/sandbox_seconds"] == pytest.approx(
        sum(o.cost.sandbox_seconds for o in batch.outcomes)
    )
    assert metrics["rollout/cost/prompt_tokens"] == sum(
        o.trace["usage"]["prompt_tokens"] for o in batch.outcomes
    )
    assert metrics["rollout/cost/usd_per_ok"] == pytest.approx(batch.cost.usd / 3)

    tally = Tally()
    for o in [*batch.outcomes, timed_out, cancelled_outcome]:
        tally.add(o)
    summary = json.loads(RunSummary.of(tally, EngineStats(), 1.0, interrupted=False).to_json())
    everything = batch.cost + timed_out.cost + cancelled_outcome.cost
    assert summary["cost"]["rollouts"] == 5 and summary["cost"]["untraced"] == 0
    assert summary["cost"]["sandbox_seconds"] == pytest.approx(everything.sandbox_seconds)
    assert summary["cost"]["prompt_tokens"] == everything.prompt_tokens > batch.cost.prompt_tokens
    assert summary["cost"]["usd"] == pytest.approx(everything.usd)
    assert summary["cost"]["usd_per_ok"] == pytest.approx(everything.usd / 3)


def test_a_hand_built_outcome_has_no_cost_and_a_batch_of_them_sums_to_nothing():
    request = RolloutRequest({}, "g")
    outcome = RolloutOutcome(request, 0, Outcome.OK, "s")
    batch = RolloutBatch(0, [outcome], EngineStats(), 1.0)
    assert outcome.cost is None and outcome.to_dict()["cost"] is None
    assert batch.metrics()["rollout/cost/rollouts"] == 0


class _Failing:
    """A runtime whose invocations fail with `errors`, one each, then succeed."""

    def __init__(self, *errors: SessionCallError) -> None:
        self.errors = list(errors)

    async def invoke(self, session_id: str, payload: bytes) -> None:
        await asyncio.sleep(0.01)
        if self.errors:
            raise self.errors.pop(0)

    async def stop(self, session_id: str) -> None:
        pass


async def test_a_session_costs_from_the_first_invocation_that_may_have_created_it():
    """Cut off mid-call, an invocation may have started the session: its cost begins then, even
    if a later attempt is the one accepted, or none is. A refusal created nothing."""
    config = flat_config(
        bucket="bkt",
        queue_url="q",
        runtime_arn="arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/test_agent-abc123",
        backoff_base=0.05,
        backoff_max=0.05,
    )
    refused = SessionCallError("ThrottlingException", "x", retryable=True, maybe_started=False)
    cut = SessionCallError("ReadTimeoutError", "x", retryable=True, maybe_started=True)
    d = RequestDispatcher(_Failing(refused, cut), config)
    began = time.time()
    async with d.live_session("s" * 40, math.inf) as session:
        started = await d.start(session, lambda _: b"{}", timeout=10.0, deadline=math.inf)
    assert session.maybe_started and session.sent_at is not None
    assert began < session.sent_at < started.sent_at  # the cut attempt, not the refused one
    fatal = SessionCallError("ReadTimeoutError", "x", retryable=False, maybe_started=True)
    d = RequestDispatcher(_Failing(fatal), config)
    with pytest.raises(SubmitFailed):
        async with d.live_session("t" * 40, math.inf) as never_accepted:
            await d.start(never_accepted, lambda _: b"{}", timeout=10.0, deadline=math.inf)
    assert never_accepted.maybe_started and never_accepted.sent_at is not None
    await d.aclose()
