"""A test agent whose behaviour the payload chooses, to drive every failure path."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import math
import secrets
import uuid
from collections.abc import Callable
from typing import Any

from agentcore_rollout.agent import (
    AgentTimeout,
    RolloutApp,
    RolloutContext,
    RolloutOutput,
    VerifierError,
)
from agentcore_rollout.contract import (
    DEFAULT_MAX_RESULT_BYTES,
    RolloutControl,
    RolloutResult,
    Timings,
    encode_result,
    is_warm_up,
    sign_result,
    split_payload,
)

controls: dict[str, RolloutControl] = {}  # request_id -> control block, for in-process tests


class _DiggingApp(RolloutApp):
    """Keeps each raw control block, signing key included, as code digging past the SDK into
    the raw request could: to write results by hand and to try leaking the key."""

    async def _accept(self, payload: dict[str, Any], context: Any = None) -> dict[str, Any]:
        accepted = await super()._accept(payload, context)
        if not is_warm_up(payload):
            control = split_payload(payload)[1]
            controls[control.request_id] = control
        return accepted


app = _DiggingApp()
INSTANCE = uuid.uuid4().hex
"""This process's: a rollout of mode `instance` returns it, so a test tells which agent ran it."""


def expected_reward(payload: dict[str, Any]) -> float:
    """What the agent computes; tests recompute it to check rewards round-trip."""
    return round((payload["a"] * 7 + payload["b"] * 3) % 11 / 10, 6)


async def _put(ctx: RolloutContext, body: bytes) -> None:
    target = controls[ctx.request_id].result
    s3 = await app._writer._client("s3")
    await s3.put_object(Bucket=target.bucket, Key=target.key, Body=body)


def _nested(depth: int) -> dict[str, Any]:
    inner: dict[str, Any] = {}
    outer = inner
    for _ in range(depth - 1):
        inner["a"] = {}
        inner = inner["a"]
    return outer


# Outputs the wire cannot carry, returned through the SDK (payload `hostile`).
HOSTILE: dict[str, Callable[[RolloutContext], RolloutOutput]] = {
    "nan_reward": lambda ctx: RolloutOutput(rewards=math.nan),
    "inf_reward": lambda ctx: RolloutOutput(rewards=math.inf),
    "overflowing_steps": lambda ctx: RolloutOutput(rewards=[1e308, 1e308]),
    "nan_metric": lambda ctx: RolloutOutput(rewards=0.5, metrics={"turns": math.nan}),
    "nan_in_trajectory": lambda ctx: RolloutOutput(rewards=0.5, trajectory={"score": -math.inf}),
    "lone_surrogate": lambda ctx: RolloutOutput(
        rewards=0.5,
        trajectory={"messages": [{"content": "ok"}] * 3 + [{"content": "bad \ud800 text"}]},
    ),
    "deep": lambda ctx: RolloutOutput(rewards=0.5, trajectory=_nested(10_000)),
    "too_big": lambda ctx: RolloutOutput(
        rewards=0.5, trajectory={"blob": "x" * (DEFAULT_MAX_RESULT_BYTES + 1)}
    ),
    "secret_key_nan": lambda ctx: RolloutOutput(
        rewards=0.5, trajectory={f"key-{controls[ctx.request_id].sig_key}": math.nan}
    ),
}


def _key(ctx: RolloutContext) -> str:
    return controls[ctx.request_id].sig_key


def _raise(message: str) -> dict[str, Any]:
    raise RuntimeError(message)


# Trajectories echoing a secret, whole or in part, next to the payload (mode `leak`, `how`): the
# signing key dug out of the raw request, or the LLM key the context gives.
LEAKS: dict[str, Callable[[RolloutContext], dict[str, Any]]] = {
    "raw_request": lambda ctx: {"echo": json.dumps(controls[ctx.request_id].model_dump())},
    "upper": lambda ctx: {"note": f"key={_key(ctx).upper()}"},
    "halves": lambda ctx: {"a": _key(ctx)[:32], "between": "x" * 100, "b": _key(ctx)[32:]},
    "eighths": lambda ctx: {"parts": [_key(ctx)[i : i + 8] for i in range(0, 64, 8)]},
    "reversed": lambda ctx: {"note": _key(ctx)[::-1]},
    "wrapped": lambda ctx: {"note": "\n".join(_key(ctx)[i : i + 10] for i in range(0, 64, 10))},
    "in_a_key": lambda ctx: {_key(ctx).swapcase(): 1},
    "in_an_error": lambda ctx: _raise(f"could not sign with {_key(ctx)}"),
    "api_key": lambda ctx: {"note": ctx.llm.api_key.upper() if ctx.llm else ""},
    # Not a leak: all the SDK hands the rollout function, and a key that is not this one's.
    "all_it_is_given": lambda ctx: {"ctx": repr(ctx), "other": secrets.token_hex(32)},
}


def _by_hand(ctx: RolloutContext, what: str) -> bytes:
    """A result object written without the SDK and signed with the real key, as a hostile
    agent could: the engine must refuse it on its own."""
    c = controls[ctx.request_id]
    data: dict[str, Any] = {
        "v": 1,
        "exp_id": c.exp_id,
        "step": c.step,
        "request_id": c.request_id,
        "input_id": c.input_id,
        "session_id": c.session_id,
        "status": "ok",
        "stop_reason": "done",
        "rewards": 1.0,
        "trajectory": None,
        "metrics": {},
        "timings": {"received": 0.0, "started": 0.0, "finished": 0.0},
        "error": None,
    }
    if what == "nan_reward":
        data["rewards"] = math.nan
    elif what == "overflowing_steps":
        data["rewards"] = [1e308, 1e308]
    elif what == "lone_surrogate":
        data["trajectory"] = {"messages": [{"content": "\ud800"}]}
    elif what == "deep":
        data["trajectory"] = {"x": "DEEP"}
    unsigned = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    sig = hmac.new(
        c.sig_key.encode(), unsigned.encode("utf-8", "surrogatepass"), hashlib.sha256
    ).hexdigest()
    body = json.dumps({**data, "sig": sig})  # ASCII: a surrogate goes as a \ud800 escape
    return body.replace('"DEEP"', "[" * 10_000 + "]" * 10_000).encode()


@app.rollout_entrypoint
async def rollout(payload: dict[str, Any], ctx: RolloutContext) -> Any:
    # Members of one group share a payload; `per_member` sets what member k does differently.
    payload = {**payload, **payload.get("per_member", {}).get(str(ctx.sample_index), {})}
    mode = payload.get("mode", "ok")
    await asyncio.sleep(payload.get("sleep", 0))
    if mode == "raise":
        raise ValueError(f"bad input {payload['a']}")
    if mode == "unjudged":
        raise VerifierError("tests/test.sh exited 2 and wrote no reward")
    if mode == "agent_timeout":
        raise AgentTimeout("the agent ran past its 1 s")
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
        c = controls[ctx.request_id]
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
    if mode == "hostile":
        return HOSTILE[payload["what"]](ctx)
    if mode == "by_hand":  # the SDK's own write afterwards finds the object there, and stops
        await _put(ctx, _by_hand(ctx, payload["what"]))
    if mode == "chatty":  # an agent that prints: where does its output go, and does it block?
        for _ in range(payload["lines"]):
            print("x" * 1023, flush=True)
    if mode == "big":
        return RolloutOutput(rewards=0.0, trajectory={"blob": "x" * payload["size"]})
    if mode == "big_by_hand":  # past the SDK, which would refuse it
        await _put(ctx, b" " * payload["size"])
    if mode == "instance":
        return RolloutOutput(rewards=0.0, trajectory={"instance": INSTANCE})
    if mode == "leak":
        echo = {"payload": payload, **LEAKS[payload["how"]](ctx)}
        return RolloutOutput(rewards=0.5, trajectory=echo)
    return RolloutOutput(
        rewards=payload.get("reward", expected_reward(payload)),
        trajectory={"messages": [{"role": "user", "content": f"{payload['a']}+{payload['b']}"}]},
        metrics={"turns": 1.0},
    )
