"""A malformed request is refused by `submit` itself, in one line, before anything is taken:
no buffer waiter, no live-session slot, no invocation, no stop."""

from __future__ import annotations

import pytest

from agentcore_rollout import RolloutEngine, RolloutRequest

from .conftest import engine_config

pytestmark = pytest.mark.component


@pytest.mark.parametrize(
    ("request_fields", "message"),
    [
        ({"request_id": "a/b"}, "request_id 'a/b': 1-128 characters"),
        ({"request_id": "x" * 200}, "1-128 characters"),
        ({"request_id": ""}, "1-128 characters"),
        ({"sample_index": -1}, "sample_index -1: must be >= 0"),
        ({"sample_index": 1.5}, "sample_index 1.5: must be an integer"),
        ({"input_id": 7}, "input_id 7: must be a non-empty string"),
        ({"input_id": None}, "input_id None: must be a non-empty string"),
        ({"payload": {"x": object()}}, "payload is not JSON"),
        ({"payload": {"x": float("nan")}}, "payload is not JSON"),
        ({"payload": ["not", "a", "dict"]}, "payload must be a dict"),
        ({"payload": {"_rollout": {}}}, "must not hold the '_rollout' key"),
    ],
)
async def test_bad_requests_raise_before_anything_is_taken(
    moto, channel, emulator, request_fields, message
):
    emu = await emulator()
    fields = {"payload": {"a": 1, "b": 2}, "input_id": "g", "sample_index": 0} | request_fields
    async with RolloutEngine(engine_config(moto, channel, emu)) as engine:
        before = engine.stats()
        with pytest.raises(ValueError, match=message) as raised:
            engine.submit(RolloutRequest(**fields))
        after = engine.stats()
        good = await engine.submit(RolloutRequest({"a": 1, "b": 2}, input_id="g"))
    assert "\n" not in str(raised.value)
    assert after == before  # no waiter, slot, invocation or stop
    assert good.outcome == "ok"  # and the engine goes on
    assert emu.counts["invoke"] == 1


async def test_a_step_out_of_the_staleness_window_is_refused(moto, channel, emulator):
    emu = await emulator()
    cfg = engine_config(moto, channel, emu, max_staleness=1)
    async with RolloutEngine(cfg, step=2) as engine:
        for step in (-1, 0, 3):
            with pytest.raises(ValueError, match=f"step {step}: must be the engine's step 2"):
                engine.submit(RolloutRequest({"a": 1}, input_id="g"), step=step)
        assert engine.stats().tracked_requests == 0
