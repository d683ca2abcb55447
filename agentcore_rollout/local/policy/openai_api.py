"""OpenAI's API on the policy server, as vLLM and SGLang serve it: `/v1/chat/completions`
(streaming optional), `/v1/completions` (not streaming) and `/v1/models`, the APIs the example
agents and the gateway's clients call."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from itertools import accumulate
from typing import Any

from aiohttp import web

from ...serving.http import (
    boolean,
    chat_chunks,
    dumps,
    openai_usage,
    read_json_object,
    sse_response,
)
from .model import Generation
from .sampling import SamplingParams
from .worker import PolicyWorker, request_id, top_n


class OpenAIApi:
    """The OpenAI routes over `worker`: fields map onto SGLang's sampling parameters."""

    def __init__(self, worker: PolicyWorker) -> None:
        self.worker = worker
        self.tokenizer = worker.tokenizer

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/chat/completions", self._chat),
            web.post("/v1/completions", self._completions),
            web.get("/v1/models", self._models),
        ]

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/chat/completions; `return_token_ids` (vLLM's extension) adds
        `prompt_token_ids` and `choices[0].token_ids`."""
        body = await read_json_object(request)
        prompt = self.tokenizer.apply_chat_template(body.get("messages"))
        sp = self._sampling(body, len(prompt))
        want_logprobs = boolean(body.get("logprobs"), "logprobs")
        top = top_n(body.get("top_logprobs"), "top_logprobs") if want_logprobs else 0
        stream = boolean(body.get("stream"), "stream")
        with_ids = boolean(body.get("return_token_ids"), "return_token_ids")
        rid = request_id(body.get("rid"))
        gen = await self.worker.generate(prompt, sp, top, rid, "/v1/chat/completions")
        logprobs = self._logprobs(gen) if want_logprobs else None
        head = self._head(f"chatcmpl-{rid}", "chat.completion", body)
        usage = openai_usage(len(prompt), len(gen.output_ids))
        if stream:
            deltas = self._deltas(gen, sp, logprobs)
            chunks = chat_chunks(head, deltas, _finish(gen), usage, body.get("stream_options"))
            return await sse_response(request, chunks)
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": gen.text},
            "logprobs": None if logprobs is None else {"content": logprobs},
            **_finish(gen),
        }
        result = {**head, "choices": [choice], "usage": usage}
        if with_ids:
            result["prompt_token_ids"] = prompt
            choice["token_ids"] = gen.output_ids
        return web.json_response(result, dumps=dumps)

    def _deltas(
        self, gen: Generation, sp: SamplingParams, logprobs: list[dict[str, Any]] | None
    ) -> Iterator[tuple[dict[str, Any], Any]]:
        """One streamed delta per generated token: its visible text (possibly "") and its
        logprob entry."""
        offset = 0  # gen.text is a prefix of the tokens' pieces: stop trimming only cuts its end
        for i, token in enumerate(gen.output_ids):
            width = len(self.tokenizer.decode([token], sp.skip_special_tokens))
            piece = gen.text[offset : offset + width]
            offset += len(piece)
            yield {"content": piece}, None if logprobs is None else {"content": [logprobs[i]]}

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/completions (non-streaming); `logprobs: n` gives the legacy logprobs object."""
        body = await read_json_object(request)
        prompt = self._prompt(body.get("prompt"))
        if boolean(body.get("stream"), "stream") or boolean(body.get("echo"), "echo"):
            raise ValueError("stream and echo are not supported on /v1/completions")
        sp = self._sampling(body, len(prompt))
        n_logprobs = body.get("logprobs")
        top = top_n(n_logprobs, "logprobs")
        rid = request_id(body.get("rid"))
        gen = await self.worker.generate(prompt, sp, top, rid, "/v1/completions")
        logprobs = None
        if n_logprobs is not None:
            texts = [self.tokenizer.token_text(t) for t in gen.output_ids]
            tops = [{self.tokenizer.token_text(t): lp for t, lp in s} for s in gen.top_logprobs]
            logprobs = {
                "tokens": texts,
                "token_logprobs": gen.logprobs,
                "top_logprobs": tops or None,
                "text_offset": list(accumulate(map(len, texts), initial=0))[:-1],
            }
        choice = {"index": 0, "text": gen.text, "logprobs": logprobs, **_finish(gen)}
        head = self._head(f"cmpl-{rid}", "text_completion", body)
        usage = openai_usage(len(prompt), len(gen.output_ids))
        return web.json_response({**head, "choices": [choice], "usage": usage}, dumps=dumps)

    async def _models(self, request: web.Request) -> web.StreamResponse:
        name = self.worker.model_name
        card = {
            "id": name,
            "object": "model",
            "created": 0,
            "owned_by": "agentcore-rollout",
            "root": name,
            "max_model_len": self.worker.context_length,
        }
        return web.json_response({"object": "list", "data": [card]}, dumps=dumps)

    def _sampling(self, body: Mapping[str, Any], prompt_len: int) -> SamplingParams:
        """OpenAI fields map onto SGLang's (same names, plus max_tokens -> max_new_tokens);
        SGLang/vLLM extensions (top_k, min_p, stop_token_ids, ignore_eos, ...) pass through."""
        response_format = body.get("response_format")
        if isinstance(response_format, Mapping) and response_format.get("type") != "text":
            raise ValueError("response_format other than text is not supported by this server")
        max_tokens = body.get("max_completion_tokens")
        max_tokens = body.get("max_tokens") if max_tokens is None else max_tokens
        default = max(self.worker.context_length - prompt_len, 0)
        raw = {**body, "max_new_tokens": max_tokens}
        sp = SamplingParams.from_json(raw, max_new_tokens=default)
        self.worker.check_context(prompt_len, sp.max_new_tokens)
        return sp

    def _prompt(self, prompt: Any) -> list[int]:
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        if isinstance(prompt, list):
            self.tokenizer.check_ids(prompt, "prompt token id")
            return prompt
        raise ValueError("prompt must be a string, a list of one string, or a list of token ids")

    def _head(self, rid: str, kind: str, body: Mapping[str, Any]) -> dict[str, Any]:
        model = body.get("model")
        return {
            "id": rid,
            "object": kind,
            "created": int(time.time()),
            "model": model if isinstance(model, str) else self.worker.model_name,
        }

    def _logprobs(self, gen: Generation) -> list[dict[str, Any]]:
        """choices[0].logprobs.content: one entry per generated token, the stop token included,
        so the entries' logprobs sum to the completion's log-prob."""
        tops = gen.top_logprobs or [[] for _ in gen.output_ids]
        return [
            {**self._token(token, lp), "top_logprobs": [self._token(*t) for t in top]}
            for token, lp, top in zip(gen.output_ids, gen.logprobs, tops, strict=True)
        ]

    def _token(self, token: int, logprob: float) -> dict[str, Any]:
        text = self.tokenizer.token_text(token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}


def _finish(gen: Generation) -> dict[str, Any]:
    return {
        "finish_reason": gen.finish_reason["type"],
        "matched_stop": gen.finish_reason.get("matched"),
    }
