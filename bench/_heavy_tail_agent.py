"""The math agent behind a heavy-tailed environment, for `bench/async_train.py`: first it waits
a lognormal time (median `payload["think_median"]` seconds, log-sd `payload["think_sigma"]`,
seeded by its request id), as a tool or a sandbox would, then runs `examples.math_agent`
unchanged. A few rollouts take many times the median: the tail a synchronous step waits for."""

from __future__ import annotations

import asyncio
import hashlib
import random
from typing import Any

from agentcore_rollout.agent import RolloutApp, RolloutContext, RolloutOutput
from examples.math_agent.app import rollout as math_rollout

app = RolloutApp()


@app.rollout_entrypoint
async def rollout(payload: dict[str, Any], ctx: RolloutContext) -> RolloutOutput:
    seed = int.from_bytes(hashlib.sha256(ctx.request_id.encode()).digest()[:8], "big")
    draws = random.Random(seed)
    median, sigma = float(payload["think_median"]), float(payload["think_sigma"])
    await asyncio.sleep(median * draws.lognormvariate(0.0, sigma))
    return await math_rollout(payload, ctx)
