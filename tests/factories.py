"""Result objects for tests that play the agent's part by hand, ended outcomes (with their
token traces) for tests of what trainers do with them, engine configs written flat, and what a
local stack's policy worker recorded, and an engine whose process dies."""

from __future__ import annotations

import time
from typing import Any

import aiohttp

from agentcore_rollout import EngineConfig, Outcome, RolloutEngine, RolloutOutcome, RolloutRequest
from agentcore_rollout.contract import RolloutResult, Timings, encode_result, sign_result

SIG_KEY = "k" * 32
_SECTIONS = ("dispatch", "limits", "results")


def flat_config(**fields: Any) -> EngineConfig:
    """An EngineConfig from its fields written flat (`start_rate=50`), each put in its section
    (`dispatch.start_rate`), as tests name the one or two fields they are about."""
    nested: dict[str, Any] = {}
    for name, value in fields.items():
        home = next(
            (s for s in _SECTIONS if name in EngineConfig.model_fields[s].annotation.model_fields),
            None,
        )
        if home is None:
            nested[name] = value
        else:
            nested.setdefault(home, {})[name] = value
    return EngineConfig.model_validate(nested)


def make_result(**fields: Any) -> RolloutResult:
    """A valid `ok` result; any field can be overridden."""
    now = time.time()
    base: dict[str, Any] = {
        "exp_id": "e",
        "step": 0,
        "request_id": "r1",
        "input_id": "g",
        "session_id": "s" * 33,
        "status": "ok",
        "rewards": 1.0,
        "timings": Timings(received=now, started=now, finished=now),
    }
    return RolloutResult(**(base | fields))


def signed_body(result: RolloutResult, sig_key: str = SIG_KEY) -> bytes:
    """The bytes an agent would put in S3."""
    return encode_result(sign_result(result, sig_key))


def trace_sample(
    prompt: list[int],
    turns: list[tuple[list[int], list[int], list[float]]],
    versions: list[str | None],
    index: int = 0,
) -> dict[str, Any]:
    """A gateway trace sample; each turn is (observation ids, sampled ids, their log-probs)."""
    response: list[int] = []
    mask: list[int] = []
    logprobs: list[float | None] = []
    for observation, sampled, lps in turns:
        response += observation + sampled
        mask += [0] * len(observation) + [1] * len(sampled)
        logprobs += [None] * len(observation) + lps
    return {
        "index": index,
        "turns": list(range(len(turns))),
        "prompt_ids": prompt,
        "response_ids": response,
        "loss_mask": mask,
        "logprobs": logprobs,
        "weight_versions": versions,
        "truncated": False,
    }


def make_outcome(
    input_id: str = "g",
    k: int = 0,
    outcome: Outcome = Outcome.OK,
    rewards: Any = 1.0,
    *,
    step: int = 0,
    trace: dict[str, Any] | None = None,
    finished_at: float = 0.0,
) -> RolloutOutcome:
    """An ended request: `ok` with a result carrying `rewards`, or a failure without one."""
    request = RolloutRequest({"q": input_id}, input_id=input_id, sample_index=k)
    ok = outcome is Outcome.OK
    result = (
        make_result(
            exp_id="e", step=step, request_id=request.request_id, input_id=input_id, rewards=rewards
        )
        if ok
        else None
    )
    return RolloutOutcome(
        request,
        step,
        outcome,
        "s" * 33,
        result=result,
        error=None if ok else f"{outcome}: boom",
        trace=trace,
        finished_at=finished_at,
    )


async def recorded_samples(stack: Any) -> list[dict[str, Any]]:
    """What the `LocalStack`'s first policy worker sampled (`/debug/samples`, behind the
    stack's admin token): the oracle a trace's tokens are checked against."""
    async with (
        aiohttp.ClientSession(headers=stack.policy_headers) as http,
        http.get(f"{stack.workers[0].url}/debug/samples") as resp,
    ):
        return (await resp.json())["samples"]


def dies_before_stopping(engine: RolloutEngine) -> None:
    """The engine's process dies (a SIGKILL): from now on no stop of its reaches the runtime,
    so its sessions run on after its `aclose`."""

    async def no_stop(*_: object) -> None:
        pass

    engine._dispatcher._stop = no_stop  # type: ignore[method-assign]
