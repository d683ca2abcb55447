"""Test doubles for the gateway tests: a scripted SGLang/OpenAI worker and the fixture tokenizer.

The toy PolicyServer speaks the char vocabulary only; tests of the Hugging Face renderer (drift,
tool calls) need a worker that "samples" chosen ids of the fixture BPE vocabulary. ScriptedWorker
is a real HTTP server with SGLang's /generate shape that answers each call with the next scripted
id list (cut at max_new_tokens, like a real server), with made-up but recorded log-probs.
"""

from __future__ import annotations

import functools
import json
from collections import deque
from pathlib import Path
from typing import Any

from aiohttp import web

from agentcore_rollout.gateway import HFRenderer
from agentcore_rollout.serving.server import Server

TOKENIZER_DIR = Path(__file__).resolve().parent / "fixtures" / "tokenizer"

# The tests' one tool, in each API's shape: OpenAI chat, OpenAI Responses, Anthropic Messages.
_ADD = {
    "name": "add",
    "description": "Add two integers.",
    "parameters": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
}
ADD_TOOL: dict[str, Any] = {"type": "function", "function": _ADD}
ADD_TOOL_RESPONSES: dict[str, Any] = {"type": "function", **_ADD, "strict": True}
ADD_TOOL_ANTHROPIC: dict[str, Any] = {
    "name": _ADD["name"],
    "description": _ADD["description"],
    "input_schema": _ADD["parameters"],
}


def exactness_conversation(i: int) -> tuple[dict[str, Any], list[dict[str, Any]], list[Any]]:
    """Rollout `i` of the exactness tests: its sampling, its first message, and the message
    the agent appends after each of its three replies."""
    sampling = {"temperature": 1.0, "max_tokens": 3 + i % 3}
    observations = [
        {"role": "tool", "tool_call_id": f"c{i}", "content": f"calculator: {i + 4}"},
        {"role": "user", "content": f"And {i} + 5?"},
        {"role": "user", "content": "Thanks. Last one: 9 + 9?"},
    ]
    return sampling, [{"role": "user", "content": f"What is {i} + 4?"}], observations


async def exactness_rollout(gateway: Any, admin: Any, i: int) -> dict[str, Any]:
    """Rollout `i` of `exactness_conversation` through `gateway` with the OpenAI SDK, each reply
    echoed back as the assistant's message; its trace. Every turn must end stop or length."""
    import openai

    sampling, messages, observations = exactness_conversation(i)
    session = await admin.create_session(f"req-{i}", sampling=sampling)
    async with openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key=session.api_key) as client:
        for observation in observations:
            reply = await client.chat.completions.create(model="policy", messages=messages)
            assert reply.choices[0].finish_reason in ("stop", "length")
            content = reply.choices[0].message.content or ""
            messages += [{"role": "assistant", "content": content}, observation]
    return await admin.finish_session(session.session_id)


@functools.cache
def hf_renderer() -> HFRenderer:
    """The offline fixture tokenizer (tests/fixtures/make_tokenizer.py), loaded once."""
    return HFRenderer.from_pretrained(TOKENIZER_DIR)


class ScriptedWorker(Server):
    """`async with ScriptedWorker([[ids...], ...]) as w`: POST /generate pops the next script.

    Every call is recorded in `.calls` (input ids, output ids, log-probs, sampling params) like
    PolicyServer's /debug/samples. POST /v1/chat/completions answers `openai_reply` and records
    the Authorization header it was sent (to prove the gateway never forwards agent keys).
    """

    def __init__(self, scripts: list[list[int]] | None = None) -> None:
        super().__init__()
        self.scripts: deque[list[int]] = deque(scripts or [])
        self.calls: list[dict[str, Any]] = []
        self.openai_auth: list[str | None] = []
        self.openai_reply = {"role": "assistant", "content": "upstream says hi"}

    def app(self) -> web.Application:
        app = web.Application()
        app.add_routes(
            [
                web.post("/generate", self._generate),
                web.post("/v1/chat/completions", self._chat),
                web.get("/health", lambda _: web.Response()),
            ]
        )
        return app

    async def _generate(self, request: web.Request) -> web.Response:
        body = json.loads(await request.text())
        sp = body.get("sampling_params") or {}
        script = self.scripts.popleft()
        limit = sp.get("max_new_tokens")
        out = script if limit is None else script[:limit]
        stops = set(sp.get("stop_token_ids") or [])
        finish = (
            {"type": "stop", "matched": out[-1]}
            if out and out[-1] in stops
            else {"type": "length", "length": len(out)}
        )
        logprobs = [-0.01 * (len(self.calls) + 1) - 0.001 * i for i in range(len(out))]
        self.calls.append(
            {
                "rid": body.get("rid"),
                "input_ids": body["input_ids"],
                "output_ids": out,
                "output_logprobs": logprobs,
                "sampling_params": sp,
            }
        )
        meta = {
            "id": body.get("rid"),
            "finish_reason": finish,
            "prompt_tokens": len(body["input_ids"]),
            "completion_tokens": len(out),
            "weight_version": "7",
            "output_token_logprobs": [[lp, t, None] for lp, t in zip(logprobs, out, strict=True)],
        }
        return web.json_response({"text": "", "output_ids": out, "meta_info": meta})

    async def _chat(self, request: web.Request) -> web.Response:
        self.openai_auth.append(request.headers.get("Authorization"))
        body = json.loads(await request.text())
        self.calls.append({"openai": body})
        choice = {"index": 0, "message": self.openai_reply, "finish_reason": "stop"}
        usage = {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}
        return web.json_response(
            {"id": "x", "object": "chat.completion", "choices": [choice], "usage": usage}
        )
