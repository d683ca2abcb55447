"""A stand-in for veRL's `LLMServerClient` that Ray can ship to its workers: `generate` samples
from a local policy worker (SGLang's `/generate`) and answers veRL's `TokenOutput`, labelled
with `global_steps` as veRL's rollout servers label theirs (given, or the worker's weight version),
and a generation the worker aborted as veRL's `stop_reason` "aborted". No vLLM or SGLang server
runs on CPU; this is what lets the hosted gateway be tested through veRL's own agent-loop path."""

from __future__ import annotations

from typing import Any

import aiohttp
from verl.workers.rollout.replica import TokenOutput

_SGLANG = {"max_tokens": "max_new_tokens"}


class PolicyServerManager:
    def __init__(self, url: str, global_steps: int | None = None) -> None:
        self.url = url
        self.global_steps = global_steps

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kw: Any
    ) -> TokenOutput:
        params = {_SGLANG.get(k, k): v for k, v in sampling_params.items() if k != "logprobs"}
        body = {"input_ids": prompt_ids, "sampling_params": params, "return_logprob": True}
        body["rid"] = request_id
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{self.url}/generate", json=body) as resp,
        ):
            answer = await resp.json()
        meta = answer["meta_info"]
        entries = meta["output_token_logprobs"]
        aborted = (meta.get("finish_reason") or {}).get("type") == "abort"
        version = self.global_steps
        return TokenOutput(
            token_ids=[int(e[1]) for e in entries],
            log_probs=[float(e[0]) for e in entries],
            stop_reason="aborted" if aborted else "completed",
            extra_fields={
                "global_steps": int(meta["weight_version"]) if version is None else version
            },
        )
