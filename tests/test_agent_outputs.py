"""Outputs the wire cannot carry end at once as a named outcome, never as a timeout.

Returned through the SDK (NaN, infinities, per-step rewards that sum to inf, a lone surrogate,
a 10,000-deep trajectory, a result over the size limit), they become the agent's own
`agent_error`, written as soon as the rollout returns. Written by hand past the SDK, the engine
refuses them as `invalid_result`. Either way the rest of the batch is untouched, and the row
ends far inside its rollout timeout.
"""

from __future__ import annotations

import asyncio
import logging
import re
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from agentcore_rollout import Outcome, RolloutEngine, RolloutRequest
from agentcore_rollout.agent import ResultWriter, RolloutApp, RolloutContext, RolloutOutput
from agentcore_rollout.contract import (
    CONTROL_KEY,
    DEFAULT_MAX_RESULT_BYTES,
    MAX_DEPTH,
    ContractError,
    RolloutControl,
    RolloutResult,
    result_key,
    split_payload,
)

from .agents.basic import HOSTILE, controls, expected_reward
from .conftest import engine_config
from .factories import make_result

pytestmark = pytest.mark.component

TIMEOUT = 30.0
PROMPT = TIMEOUT / 6  # a hostile row must end far sooner than a lost result would

SDK_ERRORS = {
    "nan_reward": re.escape("InvalidOutput: rewards: non-finite number nan"),
    "inf_reward": re.escape("InvalidOutput: rewards: non-finite number inf"),
    "overflowing_steps": re.escape(
        "InvalidOutput: rewards: sum of per-step rewards overflows to inf"
    ),
    "nan_metric": re.escape("InvalidOutput: metrics.turns: non-finite number nan"),
    "nan_in_trajectory": re.escape("InvalidOutput: trajectory.score: non-finite number -inf"),
    "lone_surrogate": re.escape(
        "InvalidOutput: trajectory.messages[3].content: invalid unicode (lone surrogate)"
    ),
    # The result object is level 1, its trajectory level 2: level 65 is 63 keys below that.
    "deep": re.escape(
        f"InvalidOutput: trajectory{'.a' * (MAX_DEPTH - 1)}: nested deeper than {MAX_DEPTH} levels"
    ),
    "too_big": rf"InvalidOutput: result is \d+ bytes, over the {DEFAULT_MAX_RESULT_BYTES} limit",
    "secret_key_nan": re.escape(
        "InvalidOutput: result cannot be written (not_finite); the reason quotes a secret"
    ),
}

HAND_ERRORS = {
    "nan_reward": ("result object: rewards: non-finite number nan", "not_finite"),
    "overflowing_steps": (
        "result object: rewards: sum of per-step rewards overflows to inf",
        "not_finite",
    ),
    "lone_surrogate": (
        "result object: trajectory.messages[0].content: invalid unicode (lone surrogate)",
        "not_json",
    ),
    "deep": ("result object is nested too deeply to parse", "too_deep"),
}


def _mixed(modes: dict[str, dict]) -> tuple[list[RolloutRequest], dict[int, str]]:
    """An ok request before each hostile one and one at the end."""
    reqs: list[RolloutRequest] = []
    hostile: dict[int, str] = {}
    for what, extra in modes.items():
        reqs.append(RolloutRequest({"a": len(reqs), "b": 1}, input_id=f"q{len(reqs)}"))
        hostile[len(reqs)] = what
        reqs.append(RolloutRequest({"a": 0, "b": 0, "what": what, **extra}, input_id=what))
    reqs.append(RolloutRequest({"a": len(reqs), "b": 1}, input_id=f"q{len(reqs)}"))
    return reqs, hostile


def _assert_others_ok(batch, hostile: dict[int, str]) -> None:
    for i, o in enumerate(batch.outcomes):
        if i not in hostile:
            assert o.outcome is Outcome.OK, (i, o.outcome, o.error)
            assert o.reward == expected_reward(o.request.payload)


async def test_outputs_the_wire_cannot_carry_are_the_agents_error(moto, channel, emulator):
    assert set(SDK_ERRORS) == set(HOSTILE)
    emu = await emulator()
    reqs, hostile = _mixed({what: {"mode": "hostile"} for what in SDK_ERRORS})
    async with RolloutEngine(engine_config(moto, channel, emu, rollout_timeout=TIMEOUT)) as engine:
        batch = await engine.rollout(reqs)
    for i, what in hostile.items():
        o = batch.outcomes[i]
        assert o.outcome is Outcome.AGENT_ERROR, (what, o.outcome, o.error)
        assert re.fullmatch(SDK_ERRORS[what], o.error), (what, o.error)
        assert o.result is not None and o.result.error is not None
        assert o.result.error.type == "InvalidOutput" and o.result.trajectory is None
        assert o.reward is None
        assert o.latency < PROMPT, (what, o.latency)
    _assert_others_ok(batch, hostile)
    assert batch.stats.invalid_results == {}  # the SDK wrote valid results
    assert sorted(emu.sessions.stopped) == sorted(emu.sessions.started)

    leaky = next(i for i, what in hostile.items() if what == "secret_key_nan")
    rid = reqs[leaky].request_id
    stored = moto.client("s3").get_object(
        Bucket=channel.bucket, Key=result_key("rollouts", "exp1", 0, rid)
    )
    assert controls[rid].sig_key not in stored["Body"].read().decode()


async def test_objects_written_by_hand_past_the_sdk_are_invalid(moto, channel, emulator):
    emu = await emulator()
    reqs, hostile = _mixed({what: {"mode": "by_hand"} for what in HAND_ERRORS})
    async with RolloutEngine(engine_config(moto, channel, emu, rollout_timeout=TIMEOUT)) as engine:
        batch = await engine.rollout(reqs)
    for i, what in hostile.items():
        o = batch.outcomes[i]
        assert o.outcome is Outcome.INVALID_RESULT, (what, o.outcome, o.error)
        assert o.error == HAND_ERRORS[what][0]
        assert o.result is None and o.reward is None
        assert o.latency < PROMPT, (what, o.latency)
    _assert_others_ok(batch, hostile)
    assert batch.stats.invalid_results == Counter(reason for _, reason in HAND_ERRORS.values())


class _RecordingWriter:
    """Stands in for S3: what is tested here happens inside the app."""

    def __init__(self) -> None:
        self.written: list[str] = []

    async def write(self, result: RolloutResult, control: RolloutControl) -> bool:
        self.written.append(control.request_id)
        return True


class _UnreachableWriter:
    async def write(self, result: RolloutResult, control: RolloutControl) -> bool:
        raise OSError("connection refused\n(details on a second line)")


@contextmanager
def _worker_loop(app: RolloutApp) -> Iterator[tuple[asyncio.AbstractEventLoop, list[dict]]]:
    """The app's worker loop, where the base app runs `_accept`, and the errors it reports;
    after the block, every rollout has ended and the loop is stopped."""
    loop = app._ensure_worker_loop()
    errors: list[dict] = []
    loop.set_exception_handler(lambda _, context: errors.append(context))
    try:
        yield loop, errors
        asyncio.run_coroutine_threadsafe(_drained(app), loop).result(timeout=30)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        app._worker_thread.join(timeout=10)


async def _drained(app: RolloutApp) -> None:
    """Runs on the worker loop after every cancellation scheduled before it."""
    await asyncio.gather(*app._tasks.values(), return_exceptions=True)


def test_cancel_session_from_another_thread_while_its_rollouts_start_and_end():
    """The emulator stops a session from its own thread while the app's worker loop starts
    and ends that session's rollouts. Forcing thread switches every microsecond makes the
    old code (iterating the session's set on the caller's thread) fail with `Set changed
    size during iteration` in nearly every round; the fix must survive all of them."""
    writer = _RecordingWriter()
    app = RolloutApp(writer=writer)  # type: ignore[arg-type]

    @app.rollout_entrypoint
    async def rollout(payload: dict, ctx: RolloutContext) -> RolloutOutput:
        for _ in range(payload["hops"]):
            await asyncio.sleep(0)
        return RolloutOutput(rewards=1.0)

    accepted: list[str] = []
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with _worker_loop(app) as (loop, errors):
            for round_ in range(20):
                sid = f"session-{round_:02d}-" + "s" * 32
                starts = [
                    asyncio.run_coroutine_threadsafe(
                        app._accept(_payload(sid, f"r{round_}-{i}", hops=i % 5)), loop
                    )
                    for i in range(200)
                ]
                accepted += [start.result(timeout=10)["request_id"] for start in starts]
                app.cancel_session(sid)  # while the rollouts just accepted are ending
    finally:
        sys.setswitchinterval(switch_interval)
    assert errors == []
    assert app._tasks == {} and app._sessions == {}
    assert len(set(writer.written)) == len(writer.written)  # at most one result each
    assert set(writer.written) <= set(accepted)


def test_a_result_that_cannot_be_written_at_all_is_logged_once(caplog):
    app = RolloutApp(writer=_UnreachableWriter())  # type: ignore[arg-type]

    @app.rollout_entrypoint
    async def rollout(payload: dict, ctx: RolloutContext) -> RolloutOutput:
        return RolloutOutput(rewards=1.0)

    with caplog.at_level(logging.WARNING), _worker_loop(app) as (loop, errors):
        asyncio.run_coroutine_threadsafe(app._accept(_payload("s" * 40, "r1")), loop).result(10)
    assert errors == []
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("ERROR", "no result written for request_id=r1: OSError: connection refused")
    ]


async def test_the_writer_raises_when_not_even_the_replacement_can_be_encoded():
    """A surrogate in a field the replacement keeps; `split_payload` keeps it out of the
    control block, so only a caller of ResultWriter itself can get here."""
    _, control = split_payload(_payload("s" * 40, "r1"))
    result = make_result(request_id="r1", input_id="q\ud800", session_id="s" * 40)
    with pytest.raises(ContractError, match="input_id: invalid unicode"):
        await ResultWriter().write(result, control)


def _payload(session_id: str, request_id: str, **user: Any) -> dict[str, Any]:
    control = {
        "exp_id": "exp1",
        "step": 0,
        "request_id": request_id,
        "input_id": "g",
        "sample_index": 0,
        "session_id": session_id,
        "result": {"bucket": "unused", "key": f"rollouts/exp1/00000000/{request_id}.json"},
        "deadline": time.time() + 60,
        "sig_key": "k" * 32,
    }
    return {**user, CONTROL_KEY: control}
