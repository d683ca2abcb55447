"""One ok outcome -> veRL `AgentLoopOutput`s, one per sample of its token trace, exactly as
captured (`response_mask` = the trace's loss mask, `response_logprobs` the sampling log-probs).

Nothing is cut to fit: a sample longer than the trainer's lengths raises, since a truncated row
would train as if the policy had sampled it that way (cap at the gateway's `max_context`).
docs/verl.md#settings says what the rows carry and in which order."""

from __future__ import annotations

import logging
from typing import Any, Literal

from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

from ... import Outcome, RolloutOutcome
from ...contract import NamedRewards
from ...training import TrainingSample, outcome_samples

OnFailure = Literal["raise", "empty"]


log = logging.getLogger(__name__)


class ConversionError(ValueError):
    """An outcome that cannot become rows: a failure, no trace, or too long."""


def agent_loop_outputs(
    outcome: RolloutOutcome,
    *,
    max_prompt_length: int | None = None,
    max_response_length: int | None = None,
    on_failure: OnFailure = "raise",
) -> list[AgentLoopOutput]:
    """The rows of one outcome. A failure, or an ok outcome without a token trace, raises
    `ConversionError` (`on_failure="raise"`) or gives no row (`"empty"`); a sample longer than
    a given length always raises."""
    if outcome.outcome is not Outcome.OK or outcome.trace is None:
        if on_failure == "empty":
            return []
        why = "it has no token trace" if outcome.outcome is Outcome.OK else outcome.error
        raise ConversionError(
            f"request {outcome.request.request_id} ended {outcome.outcome}: no veRL row ({why})"
        )
    try:
        samples = outcome_samples(outcome, advantage=0.0)  # veRL computes its own advantages
    except ValueError as e:
        raise ConversionError(str(e)) from None
    if not samples:
        log.info(
            "request %s ended ok without a model call: no veRL row", outcome.request.request_id
        )
    for s in samples:
        _check_length(s, "prompt", len(s.prompt_ids), max_prompt_length)
        _check_length(s, "response", len(s.response_ids), max_response_length)
    samples.sort(key=lambda s: sum(s.loss_mask))  # stable: the most trained tokens last
    latency = sum(float(t.get("latency_s") or 0.0) for t in outcome.trace.get("turns", []))
    return [_output(outcome, s, latency) for s in samples]


def _output(outcome: RolloutOutcome, sample: TrainingSample, latency: float) -> AgentLoopOutput:
    versions = _global_steps(sample, outcome.step)
    result = outcome.result
    assert result is not None  # an ok outcome has its result
    components = result.rewards.components if isinstance(result.rewards, NamedRewards) else {}
    extra: dict[str, Any] = {
        "min_global_steps": min(versions),
        "max_global_steps": max(versions),
        "reward_extra_info": dict(components),
        "outcome": str(outcome.outcome),
        "request_id": outcome.request.request_id,
        "session_id": outcome.session_id,
        "input_id": outcome.request.input_id,
    }
    return AgentLoopOutput(
        prompt_ids=sample.prompt_ids,
        response_ids=sample.response_ids,
        response_mask=sample.loss_mask,
        response_logprobs=sample.logprobs,
        reward_score=sample.reward,
        # user, then assistant and the observation after it, per assistant turn
        num_turns=2 * len(sample.weight_versions),
        metrics=AgentLoopMetrics(generate_sequences=latency),
        extra_fields=extra,
    )


def _global_steps(sample: TrainingSample, step: int) -> list[int]:
    """The sampling weight versions as veRL global steps (integers): each turn's and, for a
    turn resumed after a weight update, each sampled token's; the request's step when the
    backend reported none."""
    tokens = [v for v, m in zip(sample.token_versions, sample.loss_mask, strict=False) if m]
    versions = [v for v in (*sample.weight_versions, *tokens) if v is not None]
    try:
        return [int(v) for v in versions] or [step]
    except ValueError:
        raise ConversionError(
            f"request {sample.request_id}: weight versions {versions} are not veRL global steps "
            "(integers); push weights with weight_version=str(global_steps)"
        ) from None


def _check_length(sample: TrainingSample, what: str, length: int, limit: int | None) -> None:
    if limit is not None and length > limit:
        raise ConversionError(
            f"request {sample.request_id}: {what} of {length} tokens is over the trainer's "
            f"{limit}; cap it at the gateway (engine.gateway.max_context), never truncate"
        )
