"""A test agent whose behaviour the payload chooses, to drive every failure path."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from agentcore_rollout.agent import RolloutApp, RolloutContext, RolloutOutput
from agentcore_rollout.contract import RolloutResult, Timings, encode_result, sign_result

app = RolloutApp()
controls: dict[str, Any] = {}  # request_id -> control block, for in-process tests


def expected_reward(payload: dict[str, Any]) -> float:
    """What the agent computes; tests recompute it to check rewards round-trip."""
    return round((payload["a"] * 7 + payload["b"] * 3) % 11 / 10, 6)


async def _put(ctx: RolloutContext, body: bytes) -> None:
    s3 = await app._writer._client("s3")
    await s3.put_object(Bucket=ctx.control.result.bucket, Key=ctx.control.result.key, Body=body)


@app.rollout_entrypoint
async def rollout(payload: dict[str, Any], ctx: RolloutContext) -> Any:
    mode = payload.get("mode", "ok")
    controls[ctx.request_id] = ctx.control
    await asyncio.sleep(payload.get("sleep", 0))
    if mode == "raise":
        raise ValueError(f"bad input {payload['a']}")
    if mode == "hang":
        await asyncio.sleep(3600)
    if mode == "slow_cancel":  # ignores cancellation for a while, as badly behaved code does
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await asyncio.sleep(30)
            raise
    if mode == "corrupt":
        await _put(ctx, b'{"v": 1, "exp_id": truncated')
    if mode == "forge":
        c = ctx.control
        fake = RolloutResult(
            exp_id=c.exp_id,
            step=c.step,
            request_id=c.request_id,
            input_id=c.input_id,
            session_id=c.session_id,
            status="ok",
            rewards=1.0,
            timings=Timings(received=0, finished=0),
        )
        await _put(ctx, encode_result(sign_result(fake, "not-the-key-" * 4)))
    if mode == "bad_output":
        return {"rewards": "lots"}
    if mode == "big":
        return RolloutOutput(rewards=0.0, trajectory={"blob": "x" * payload["size"]})
    if mode == "leak":
        return {"rewards": 0.5, "trajectory": {"echo": json.dumps(ctx.control.model_dump())}}
    return RolloutOutput(
        rewards=expected_reward(payload),
        trajectory={"messages": [{"role": "user", "content": f"{payload['a']}+{payload['b']}"}]},
        metrics={"turns": 1.0},
    )
