"""A fast agent for `bench/run_memory.py`: it answers at once with a reward and a one-message
trajectory (no policy calls), so a long `run` spends its time in the CLI and the engine."""

from __future__ import annotations

from typing import Any

from agentcore_rollout.agent import RolloutApp, RolloutContext, RolloutOutput

app = RolloutApp()


@app.rollout_entrypoint
async def rollout(payload: dict[str, Any], ctx: RolloutContext) -> RolloutOutput:
    question = str(payload.get("question", ""))
    return RolloutOutput(
        rewards=float(len(question) % 2),
        trajectory={"messages": [{"role": "user", "content": question}]},
        metrics={"turns": 1.0},
    )
