"""An agent in the AgentCore RL Toolkit's style, on the plain bedrock-agentcore app (no
RolloutApp): it acknowledges the invocation at once and works in the background for
`payload["work"]` seconds, tracked with `add_async_task`, so `/ping` says HealthyBusy until
its signed result is written. Only `/ping` tells the runtime the session is still busy.
`payload["hold"]`: seconds the reply itself waits, HealthyBusy from the invocation's arrival
(so a test can tell the invocation reached the agent)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bedrock_agentcore.runtime import BedrockAgentCoreApp

from agentcore_rollout.agent import ResultWriter
from agentcore_rollout.contract import RolloutControl, RolloutResult, Timings, split_payload

app = BedrockAgentCoreApp()
writer = ResultWriter()
_tasks: set[asyncio.Task[None]] = set()  # strong references while they run


@app.entrypoint
async def invoke(payload: dict[str, Any]) -> dict[str, Any]:
    user, control = split_payload(payload)
    task_id = app.add_async_task("rollout", {"request_id": control.request_id})
    await asyncio.sleep(user.get("hold", 0))
    task = asyncio.create_task(_work(user, control, time.time()))
    _tasks.add(task)
    task.add_done_callback(lambda t: (_tasks.discard(t), app.complete_async_task(task_id)))
    return {"status": "accepted", "request_id": control.request_id}


async def _work(user: dict[str, Any], control: RolloutControl, received: float) -> None:
    await asyncio.sleep(user.get("work", 0))
    result = RolloutResult(
        exp_id=control.exp_id,
        step=control.step,
        request_id=control.request_id,
        input_id=control.input_id,
        session_id=control.session_id,
        status="ok",
        rewards=float(user.get("reward", 1.0)),
        timings=Timings(received=received, started=received, finished=time.time()),
    )
    await writer.write(result, control)
