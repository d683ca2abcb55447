"""A rollout whose verifier runs in a session of its own environment (`contract.VERIFIER_KEY`,
a Harbor task with `[verifier] environment_mode = "separate"`), through the real wire: the
emulator, moto, the engine. The agent's session hands its artifacts over through S3; the
verifier's rewards are the rollout's; any way the verifier cannot judge is `verifier_error`."""

from __future__ import annotations

import pytest

from agentcore_rollout import Outcome, RolloutEngine, RolloutRequest
from agentcore_rollout.contract import ARTIFACTS_KEY

from .conftest import RUNTIME_ARN, engine_config

pytestmark = pytest.mark.component

AGENT_ARN, VERIFIER_ARN = (RUNTIME_ARN.replace("abc123", s) for s in ("agt111", "ver222"))


def _request(i: int, agent: dict, verifier: dict | None = None) -> RolloutRequest:
    payload = {"environment": "agent-env", **agent}
    payload["verifier"] = {"environment": "verifier-env", "phase": "verify", **(verifier or {})}
    return RolloutRequest(payload, f"task-{i}")


def _in_session(i: int, agent: dict) -> RolloutRequest:
    """Its verifier names no environment: invoked again in the agent's session."""
    payload = {"environment": "agent-env", "verifier_mode": "shared", **agent}
    return RolloutRequest(payload | {"verifier": {"phase": "verify"}}, f"shared-{i}")


@pytest.fixture
async def routed(moto, channel, emulator):
    """An emulator serving the agent's and the verifier's environments, and its config."""
    emu = await emulator(app="tests.agents.judged:app", runtime_arns=(AGENT_ARN, VERIFIER_ARN))
    base = engine_config(moto, channel, emu, max_live_sessions=2)
    cfg = type(base).model_validate(
        base.model_dump(exclude={"runtime_arn"})
        | {
            "runtimes": [
                {"arn": AGENT_ARN, "environment": "agent-env"},
                {"arn": VERIFIER_ARN, "environment": "verifier-env"},
            ]
        }
    )
    return emu, cfg


async def test_the_verifier_session_judges_what_the_agent_session_handed_over(routed):
    emu, cfg = routed
    requests = [
        _request(0, {"answer": 42}),
        _request(1, {"answer": 41}),
        _request(2, {"answer": 42}, {"cannot_judge": True}),
        _request(3, {"answer": 42, "forge": True}),
        _request(4, {"crash": True}),
    ]
    async with RolloutEngine(cfg) as engine:
        outcomes = [await h for h in [engine.submit(r) for r in requests]]
    kinds = [o.outcome for o in outcomes]
    assert kinds == [
        Outcome.OK,
        Outcome.OK,
        Outcome.VERIFIER_ERROR,
        Outcome.VERIFIER_ERROR,
        Outcome.AGENT_ERROR,
    ], [o.error for o in outcomes]
    right, wrong, unjudged, forged, crashed = outcomes
    assert (right.reward, wrong.reward) == (1.0, 0.0)
    assert right.result.trajectory["verifier_output"] == "42"  # both sessions' trajectories
    assert right.result.trajectory["agent_output"] == "done"
    assert right.result.trajectory[ARTIFACTS_KEY]["key"].endswith(".artifacts.tar.gz")
    assert unjudged.reward is None and unjudged.error.startswith("verifier: ")
    assert "wrote no reward" in unjudged.error
    assert forged.reward is None and "changed since the agent's session" in forged.error
    assert "the agent crashed" in crashed.error
    arns = [arn for _, arn, _ in emu.sessions.created]
    assert (arns.count(AGENT_ARN), arns.count(VERIFIER_ARN)) == (5, 4)  # none after the crash
    assert right.cost.sandbox_seconds > 0


async def test_a_verifier_without_an_environment_runs_in_the_agents_session_after_it(routed):
    emu, cfg = routed
    requests = [_in_session(0, {"answer": 42}), _in_session(1, {"answer": 7})]
    async with RolloutEngine(cfg) as engine:
        outcomes = [await h for h in [engine.submit(r) for r in requests]]
        invokes = engine.stats().invokes
    assert [(o.outcome, o.reward) for o in outcomes] == [(Outcome.OK, 1.0), (Outcome.OK, 0.0)]
    assert outcomes[0].result.trajectory["agent_output"] == "left in the session"
    arns = [arn for _, arn, _ in emu.sessions.created]
    assert arns == [AGENT_ARN, AGENT_ARN]  # one session each: the verifier started none
    assert invokes == 4 and len(emu.sessions.stopped) == 2


async def test_verifiers_sessions_wait_ahead_of_new_agents_for_few_slots(routed):
    """12 rollouts of two sessions each through 2 live slots: every verifier gets a slot
    before the agents queued behind it, so none waits out its rollout's deadline."""
    emu, cfg = routed
    requests = [_request(i, {"answer": 42}) for i in range(12)]
    async with RolloutEngine(cfg) as engine:
        outcomes = [await h for h in [engine.submit(r, timeout=20.0) for r in requests]]
        most_live = engine.stats().max_live_sessions
    assert [(o.outcome, o.reward) for o in outcomes] == [(Outcome.OK, 1.0)] * 12
    arns = [arn for _, arn, _ in emu.sessions.created]
    assert (arns.count(AGENT_ARN), arns.count(VERIFIER_ARN)) == (12, 12) and most_live == 2
