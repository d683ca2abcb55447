"""A test agent whose verifier runs in a session of its own (`contract.VERIFIER_KEY`): the
agent's session hands over `answer` through the Harbor wrapper's artifacts, the verifier's
session checks them and scores 1.0 if the answer is 42. The payload chooses what goes wrong."""

from __future__ import annotations

from typing import Any

from agentcore_rollout.agent import RolloutApp, RolloutContext, RolloutOutput, VerifierError
from agentcore_rollout.contract import AGENT_ARTIFACTS_KEY, ARTIFACTS_KEY, artifacts_key
from agentcore_rollout.harbor import artifacts

app = RolloutApp()
answers: dict[str, str] = {}  # session_id -> what its agent left there (one process serves all)


@app.rollout_entrypoint
async def rollout(payload: dict[str, Any], ctx: RolloutContext) -> RolloutOutput:
    if payload.get("phase") == "verify":
        if payload.get("cannot_judge"):
            raise VerifierError("tests/test.sh wrote no reward")
        if AGENT_ARTIFACTS_KEY in payload:  # a session of its own
            answer = (await artifacts.fetch(payload[AGENT_ARTIFACTS_KEY])).decode()
        elif ctx.session_id in answers:  # invoked again in the agent's session
            answer = answers.pop(ctx.session_id)
        else:
            raise VerifierError("not the agent's session")
        return RolloutOutput(1.0 if answer == "42" else 0.0, {"verifier_output": answer})
    if payload.get("crash"):
        raise RuntimeError("the agent crashed")
    body = str(payload["answer"]).encode()
    if payload.get("verifier_mode") == "shared":
        answers[ctx.session_id] = body.decode()
        return RolloutOutput(None, {"agent_output": "left in the session"})
    key = artifacts_key(ctx.result_key)
    await artifacts.put(ctx.result_bucket, key, body)
    digest = "0" * 64 if payload.get("forge") else artifacts.digest(body)
    handed = {"bucket": ctx.result_bucket, "key": key, "sha256": digest}
    return RolloutOutput(None, {"agent_output": "done", ARTIFACTS_KEY: handed})
