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


async def test_the_verifier_session_judges_what_the_agent_session_handed_over(
    moto, channel, emulator
):
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
