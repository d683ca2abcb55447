"""`_decide`, the one function that chooses an outcome, on every kind of fact (pure logic)."""

from __future__ import annotations

import asyncio

import pytest

from agentcore_rollout._batch import RolloutOutcome, RolloutRequest
from agentcore_rollout._dispatch.endpoints import SubmitFailed
from agentcore_rollout._engine.request import Trace, _decide
from agentcore_rollout._results.buffer import Delivery
from agentcore_rollout.contract import ErrorInfo, Outcome

from .factories import make_result

pytestmark = pytest.mark.unit

OK = make_result()
FAILED = make_result(
    status="agent_error", rewards=None, error=ErrorInfo(type="ValueError", message="bad")
)


@pytest.mark.parametrize(
    ("delivery", "facts", "expected"),
    [
        (None, {"failure": SubmitFailed("throttled")}, (Outcome.SUBMIT_FAILED, "throttled")),
        (None, {"failure": asyncio.CancelledError()}, (Outcome.CANCELLED, "cancelled")),
        (
            None,
            {"failure": asyncio.CancelledError(), "stale": "step 0 is 2 behind"},
            (Outcome.STALE, "step 0 is 2 behind"),
        ),
        (
            None,
            {"failure": KeyError("bug")},
            (Outcome.ENGINE_ERROR, "engine error: KeyError('bug')"),
        ),
        (
            Delivery(missing="no result by the deadline"),
            {},
            (Outcome.TIMEOUT, "no result by the deadline"),
        ),
        (Delivery(invalid="bad signature"), {}, (Outcome.INVALID_RESULT, "bad signature")),
        (Delivery(OK), {}, (Outcome.OK, None)),
        (Delivery(FAILED), {}, (Outcome.AGENT_ERROR, "ValueError: bad")),
        (
            Delivery(OK),
            {"trace": Trace(lost="trace lost: gone")},
            (Outcome.INVALID_RESULT, "trace lost: gone"),
        ),
        # a failure keeps its own outcome when only its trace is lost: it trains nothing anyway
        (
            Delivery(FAILED),
            {"trace": Trace(lost="trace lost: gone")},
            (Outcome.AGENT_ERROR, "ValueError: bad"),
        ),
        (
            Delivery(FAILED),
            {"trace": Trace(lost="replica r lost its trace", replica_lost=True)},
            (
                Outcome.INVALID_RESULT,
                "replica r lost its trace (the agent's result: agent_error: ValueError: bad)",
            ),
        ),
    ],
)
def test_each_fact_has_its_outcome(delivery, facts, expected) -> None:
    outcome, result, error = _decide(delivery, **facts)
    assert (outcome, error) == expected
    assert (result is not None) == (outcome in (Outcome.OK, Outcome.AGENT_ERROR))


def _verification(outcome: Outcome, result=None, error: str | None = None) -> RolloutOutcome:
    return RolloutOutcome(RolloutRequest({}, "t"), 0, outcome, "s", result=result, error=error)


JUDGED = make_result(rewards=1.0, trajectory={"verifier_output": "1"})
UNJUDGED = make_result(
    status="verifier_error", rewards=None, error=ErrorInfo(type="VerifierError", message="none")
)


@pytest.mark.parametrize(
    ("verification", "expected"),
    [
        (_verification(Outcome.OK, JUDGED), (Outcome.OK, None, 1.0)),
        (
            _verification(Outcome.VERIFIER_ERROR, UNJUDGED, "VerifierError: none"),
            (Outcome.VERIFIER_ERROR, "verifier: VerifierError: none", None),
        ),
        (
            _verification(Outcome.SUBMIT_FAILED, None, "throttled"),
            (Outcome.VERIFIER_ERROR, "verifier: submit_failed: throttled", None),
        ),
        (
            _verification(Outcome.CANCELLED, None, "cancelled"),
            (Outcome.CANCELLED, "cancelled", None),
        ),
        (None, (Outcome.VERIFIER_ERROR, "verifier: never ran", None)),
    ],
)
def test_a_verified_rollout_takes_its_verifiers_verdict(verification, expected) -> None:
    """The agent's result has no reward of its own: its verifier's is the rollout's, and any
    way the verifier did not judge is `verifier_error` (a cancel stays a cancel)."""
    unverified = make_result(rewards=None, trajectory={"agent_output": "done"})
    outcome, result, error = _decide(Delivery(unverified), verification=verification, verified=True)
    assert (outcome, error, result.scalar_reward() if result else None) == expected
    if outcome is Outcome.OK:
        assert result.trajectory == {"agent_output": "done", "verifier_output": "1"}
    assert _decide(Delivery(FAILED), verification=None, verified=True)[0] is Outcome.AGENT_ERROR
