"""PolicyServer: the toy policy behind the HTTP APIs that SGLang and vLLM workers expose.

Speaking the real wire shapes (SGLang's native /generate, OpenAI's chat and completions, the
weight-update and info endpoints sglang-router and trainers call) lets the gateway, the router and
the example agents run unchanged against this server on a laptop and against SGLang on a GPU.

The toy's generation runs inline on the event loop: a completion costs well under a millisecond,
and with no await inside a generation a weight load can never interleave with one, so every
response is sampled from exactly one parameter version (reported as `weight_version`). So nothing
is ever in flight to abort: `token_delay` (seconds) paces the toy instead, a sleep after each
token, so its generations are in flight like a real server's: /abort_request ends them with the
tokens so far, and a weight update waits for them to finish (or, with `abort_all_requests`,
aborts them) before it loads, as SGLang does. Tests of the gateway's resumption need this. A Hugging
Face model (`hf.HFPolicy`, `PolicyServer(HFPolicy(model_dir))`) is served behind the same
endpoints: its scheduler thread batches concurrent requests and applies weight loads between
decode steps, once the batch has drained; each answer reports the version it was sampled from.

Endpoints (unknown request fields are ignored; see each handler for details):

  POST /generate                  SGLang native: {"text" | "input_ids", "sampling_params",
                                  "return_logprob", "top_logprobs_num", "rid", "stream"} ->
                                  {"text", "output_ids", "meta_info": {"id", "finish_reason",
                                  "prompt_tokens", "completion_tokens", "weight_version",
                                  "output_token_logprobs": [[logprob, id, null], ...], ...}};
                                  batch form (lists of prompts) answers a list
  POST /v1/chat/completions       OpenAI chat (stream optional), logprobs / top_logprobs
  POST /v1/completions            OpenAI legacy completions (non-streaming)
  POST /update_weights_from_disk  SGLang: {"model_path": "x.npz" (toy) | model dir (HF),
                                  "weight_version"?, "abort_all_requests"?}
  POST /abort_request             SGLang: {"rid"} or {"abort_all": true}: the generation answers
                                  at once with the tokens so far, finish_reason {"type": "abort"}
  GET  /params/version            {"weight_version", "version"} (also /get_weight_version)
  GET  /health, /health_generate, /v1/models, /get_model_info, /get_server_info (/server_info)
  GET, DELETE /debug/samples      the recorded generations (when started with record=True)

Every client error is a 400 (404/405/413 for routing and size) whose body is one line of JSON:
{"error": {"message": ..., "type": "invalid_request_error", "code": 400}}.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import dataclasses
import time
import uuid
from collections import deque
from collections.abc import Iterator, Mapping
from itertools import accumulate
from typing import Any, Protocol

import numpy as np
from aiohttp import web

from ...serving.http import (
    Handler,
    boolean,
    chat_chunks,
    dumps,
    openai_usage,
    read_json_object,
    sse_response,
)
from ...serving.server import Server
from .model import Generation, TinyPolicy
from .sampling import SamplingParams

MODEL_NAME = "tiny-char-policy"
DEFAULT_CONTEXT_LENGTH = 32768
MAX_TOP_LOGPROBS = 20


class BatchedPolicy(Protocol):
    """What PolicyServer calls on an engine that samples off the event loop (`hf.HFPolicy`)."""

    tokenizer: Any
    version: int
    weight_version: str
    context_length: int
    name: str

    async def generate_async(
        self, prompt: list[int], sp: SamplingParams, top_n: int, rid: str, seed: int | None
    ) -> Generation: ...

    def abort(self, rid: str | None) -> None: ...

    def submit_load(
        self, path: str, weight_version: str | None = None, abort_all: bool = False
    ) -> cf.Future[str]: ...

    def close(self) -> None: ...


class PolicyServer(Server):
    """An aiohttp server around one TinyPolicy; `async with PolicyServer() as s: s.url`.

    `seed` seeds the parameters (when no policy is given) and the server's sampling RNG; a
    request's own seed (`sampling_params.sampling_seed` / `seed`) makes that request reproducible
    on its own. With `record=True` every generation is kept (the last `record_limit`) for
    exactness tests: GET /debug/samples reads them, DELETE /debug/samples clears them.
    """

    def __init__(
        self,
        policy: TinyPolicy | BatchedPolicy | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        seed: int = 0,
        record: bool = False,
        record_limit: int = 10_000,
        worker_id: str | None = None,
        model_name: str = MODEL_NAME,
        context_length: int = DEFAULT_CONTEXT_LENGTH,
        token_delay: float = 0.0,
    ) -> None:
        super().__init__(host, port)
        self.policy = policy if policy is not None else TinyPolicy(seed)
        self.tokenizer = self.policy.tokenizer
        self.record = record
        if not isinstance(self.policy, TinyPolicy):
            context_length = min(context_length, self.policy.context_length)
            model_name = self.policy.name if model_name == MODEL_NAME else model_name
        self.model_name = model_name
        self.context_length = context_length
        self._worker_id = worker_id
        self._rng = np.random.default_rng(seed)
        self._samples: deque[dict[str, Any]] = deque(maxlen=record_limit)
        self._recorded = 0
        self.token_delay = token_delay
        self._paced: list[_Paced] = []  # the toy's generations in flight (token_delay > 0)
        self._loads_waiting = 0
        self._pacing = asyncio.Condition()

    @property
    def worker_id(self) -> str:
        return self._worker_id or f"{self.host}:{self.port}"

    def app(self) -> web.Application:
        app = web.Application(middlewares=[_json_errors], client_max_size=16 * 1024 * 1024)
        get, post = web.get, web.post
        app.add_routes(
            [
                post("/generate", self._generate),
                post("/v1/chat/completions", self._chat),
                post("/v1/completions", self._completions),
                get("/health", self._health),
                get("/health_generate", self._health_generate),
                get("/v1/models", self._models),
                get("/get_model_info", self._model_info),
                get("/get_server_info", self._server_info),
                get("/server_info", self._server_info),
                get("/flush_cache", self._flush_cache),
                post("/flush_cache", self._flush_cache),
                post("/update_weights_from_disk", self._update_weights_from_disk),
                post("/abort_request", self._abort_request),
                get("/get_weight_version", self._weight_version),
                get("/params/version", self._weight_version),
                get("/debug/samples", self._get_samples),
                web.delete("/debug/samples", self._clear_samples),
            ]
        )
        return app

    async def stop(self) -> None:
        await super().stop()
        if not isinstance(self.policy, TinyPolicy):
            await asyncio.to_thread(self.policy.close)

    # -- core ---------------------------------------------------------------------------------

    def _check_context(self, prompt_len: int, max_new_tokens: int) -> None:
        if prompt_len >= self.context_length:
            raise ValueError(
                f"the prompt ({prompt_len} tokens) is longer than the context length "
                f"({self.context_length} tokens)"
            )
        if prompt_len + max_new_tokens > self.context_length:
            raise ValueError(
                f"{prompt_len} prompt tokens + max_new_tokens {max_new_tokens} exceed the "
                f"context length ({self.context_length} tokens)"
            )

    async def _run(
        self, prompt: list[int], sp: SamplingParams, top_n: int, rid: str, endpoint: str
    ) -> Generation:
        self.tokenizer.check_ids(sp.stop_token_ids, "stop_token_ids entry")
        policy = self.policy
        if isinstance(policy, TinyPolicy):
            rng = self._rng if sp.seed is None else np.random.default_rng(sp.seed)
            if self.token_delay > 0:
                gen = await self._paced_generation(policy, prompt, sp, rng, top_n, rid)
            else:
                gen = policy.generate(prompt, sp, rng, top_n)
                gen.weight_version = policy.weight_version
        else:
            seed = int(self._rng.integers(2**63)) if sp.seed is None else sp.seed
            gen = await policy.generate_async(prompt, sp, top_n, rid, seed)
        if self.record:
            self._recorded += 1
            self._samples.append(
                {
                    "rid": rid,
                    "worker_id": self.worker_id,
                    "endpoint": endpoint,
                    "weight_version": gen.weight_version,
                    "input_ids": prompt,
                    "output_ids": gen.output_ids,
                    "output_logprobs": gen.logprobs,
                    "finish_reason": gen.finish_reason,
                    "sampling_params": dataclasses.asdict(sp),
                }
            )
        return gen

    async def _paced_generation(
        self,
        policy: TinyPolicy,
        prompt: list[int],
        sp: SamplingParams,
        rng: np.random.Generator,
        top_n: int,
        rid: str,
    ) -> Generation:
        """The toy's generation with a sleep after each token, abortable between tokens; it
        starts only when no weight load waits, so it is sampled from one version."""
        paced = _Paced(rid)
        async with self._pacing:
            await self._pacing.wait_for(lambda: not self._loads_waiting)
            self._paced.append(paced)
        reason = {"type": "length", "length": sp.max_new_tokens}
        gen = Generation([], [], "", reason, weight_version=policy.weight_version)
        try:
            for _ in policy.decode(prompt, sp, rng, top_n, gen):
                await asyncio.sleep(self.token_delay)
                if paced.aborted:
                    gen.finish_reason = {"type": "abort", "message": "aborted"}
                    break
        finally:
            async with self._pacing:
                self._paced.remove(paced)
                self._pacing.notify_all()
        return gen

    async def _load_paced(self, path: str, label: str | None, abort_all: bool) -> None:
        """A toy weight load once its paced generations ended (aborted first if asked)."""
        async with self._pacing:
            self._loads_waiting += 1
            try:
                for paced in self._paced if abort_all else ():
                    paced.aborted = True
                await self._pacing.wait_for(lambda: not self._paced)
                assert isinstance(self.policy, TinyPolicy)
                self.policy.load(path, label)
            finally:
                self._loads_waiting -= 1
                self._pacing.notify_all()

    def _openai_sampling(self, body: Mapping[str, Any], prompt_len: int) -> SamplingParams:
        """OpenAI fields map onto SGLang's (same names, plus max_tokens -> max_new_tokens);
        SGLang/vLLM extensions (top_k, min_p, stop_token_ids, ignore_eos, ...) pass through."""
        response_format = body.get("response_format")
        if isinstance(response_format, Mapping) and response_format.get("type") != "text":
            raise ValueError("response_format other than text is not supported by this server")
        max_tokens = body.get("max_completion_tokens")
        max_tokens = body.get("max_tokens") if max_tokens is None else max_tokens
        default = max(self.context_length - prompt_len, 0)
        raw = {**body, "max_new_tokens": max_tokens}
        sp = SamplingParams.from_json(raw, max_new_tokens=default)
        self._check_context(prompt_len, sp.max_new_tokens)
        return sp

    # -- SGLang native ------------------------------------------------------------------------

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        """POST /generate (SGLang): single or batch (`text` list / `input_ids` list of lists);
        every per-request field may then be a list with one entry per prompt."""
        body = await read_json_object(request)
        prompts, batch = self._generate_prompts(body)
        with_text = boolean(body.get("return_text_in_logprobs"), "return_text_in_logprobs")
        # Validate every prompt's arguments before generating any, so a bad batch has no effect.
        jobs = [self._generate_job(body, i, batch, prompt) for i, prompt in enumerate(prompts)]
        outputs = await asyncio.gather(
            *(self._generate_one(*job, with_text=with_text) for job in jobs)
        )
        if boolean(body.get("stream"), "stream"):
            return await sse_response(request, iter(outputs))
        return _json(outputs if batch else outputs[0])

    def _generate_job(
        self, body: Mapping[str, Any], i: int, batch: bool, prompt: list[int]
    ) -> tuple[list[int], SamplingParams, str, bool, int]:
        sp = SamplingParams.from_json(_pick(body.get("sampling_params"), i, batch))
        self._check_context(len(prompt), sp.max_new_tokens)
        rid = _rid(_pick(body.get("rid"), i, batch))
        want_logprob = boolean(_pick(body.get("return_logprob"), i, batch), "return_logprob")
        top_n = _top_n(_pick(body.get("top_logprobs_num"), i, batch), "top_logprobs_num")
        return prompt, sp, rid, want_logprob, top_n if want_logprob else 0

    async def _generate_one(
        self,
        prompt: list[int],
        sp: SamplingParams,
        rid: str,
        want_logprob: bool,
        top_n: int,
        *,
        with_text: bool,
    ) -> dict[str, Any]:
        """One /generate output: {"text", "output_ids", "meta_info"} as SGLang shapes it."""
        started = time.perf_counter()
        gen = await self._run(prompt, sp, top_n, rid, "/generate")
        meta: dict[str, Any] = {
            "id": rid,
            "finish_reason": gen.finish_reason,
            "prompt_tokens": len(prompt),
            "completion_tokens": len(gen.output_ids),
            "cached_tokens": 0,
            "weight_version": gen.weight_version,
        }
        if want_logprob:

            def entry(token: int, logprob: float) -> list[Any]:
                return [logprob, token, self.tokenizer.token_text(token) if with_text else None]

            pairs = zip(gen.output_ids, gen.logprobs, strict=True)
            meta["output_token_logprobs"] = [entry(t, lp) for t, lp in pairs]
            if top_n:
                meta["output_top_logprobs"] = [[entry(*t) for t in s] for s in gen.top_logprobs]
        meta["e2e_latency"] = time.perf_counter() - started
        return {"text": gen.text, "output_ids": gen.output_ids, "meta_info": meta}

    def _generate_prompts(self, body: Mapping[str, Any]) -> tuple[list[list[int]], bool]:
        text, ids = body.get("text"), body.get("input_ids")
        if (text is None) == (ids is None):
            raise ValueError("exactly one of 'text' and 'input_ids' is required")
        if ids is not None:
            if not isinstance(ids, list):
                raise ValueError("input_ids must be a list of token ids (or a list of such lists)")
            batch = bool(ids) and all(isinstance(x, list) for x in ids)
            prompts = ids if batch else [ids]
            for prompt in prompts:
                self.tokenizer.check_ids(prompt, "input_ids entry")
            return prompts, batch
        batch = isinstance(text, list)
        texts = text if batch else [text]
        if not texts or not all(isinstance(t, str) for t in texts):
            raise ValueError("text must be a string or a non-empty list of strings")
        return [self.tokenizer.encode(t) for t in texts], batch

    # -- OpenAI -------------------------------------------------------------------------------

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/chat/completions; `return_token_ids` (vLLM's extension) adds
        `prompt_token_ids` and `choices[0].token_ids`."""
        body = await read_json_object(request)
        prompt = self.tokenizer.apply_chat_template(body.get("messages"))
        sp = self._openai_sampling(body, len(prompt))
        want_logprobs = boolean(body.get("logprobs"), "logprobs")
        top_n = _top_n(body.get("top_logprobs"), "top_logprobs") if want_logprobs else 0
        stream = boolean(body.get("stream"), "stream")
        with_ids = boolean(body.get("return_token_ids"), "return_token_ids")
        rid = _rid(body.get("rid"))
        gen = await self._run(prompt, sp, top_n, rid, "/v1/chat/completions")
        logprobs = self._openai_logprobs(gen) if want_logprobs else None
        head = self._openai_head(f"chatcmpl-{rid}", "chat.completion", body)
        finish = {
            "finish_reason": gen.finish_reason["type"],
            "matched_stop": gen.finish_reason.get("matched"),
        }
        usage = openai_usage(len(prompt), len(gen.output_ids))
        if stream:
            deltas = self._deltas(gen, sp, logprobs)
            chunks = chat_chunks(head, deltas, finish, usage, body.get("stream_options"))
            return await sse_response(request, chunks)
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": gen.text},
            "logprobs": None if logprobs is None else {"content": logprobs},
            **finish,
        }
        result = {**head, "choices": [choice], "usage": usage}
        if with_ids:
            result["prompt_token_ids"] = prompt
            choice["token_ids"] = gen.output_ids
        return _json(result)

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
        prompt = self._completion_prompt(body.get("prompt"))
        if boolean(body.get("stream"), "stream") or boolean(body.get("echo"), "echo"):
            raise ValueError("stream and echo are not supported on /v1/completions")
        sp = self._openai_sampling(body, len(prompt))
        n_logprobs = body.get("logprobs")
        top_n = _top_n(n_logprobs, "logprobs")
        rid = _rid(body.get("rid"))
        gen = await self._run(prompt, sp, top_n, rid, "/v1/completions")
        logprobs = None
        if n_logprobs is not None:
            texts = [self.tokenizer.token_text(t) for t in gen.output_ids]
            logprobs = {
                "tokens": texts,
                "token_logprobs": gen.logprobs,
                "top_logprobs": [self._top_dict(step) for step in gen.top_logprobs] or None,
                "text_offset": list(accumulate(map(len, texts), initial=0))[:-1],
            }
        choice = {
            "index": 0,
            "text": gen.text,
            "logprobs": logprobs,
            "finish_reason": gen.finish_reason["type"],
            "matched_stop": gen.finish_reason.get("matched"),
        }
        head = self._openai_head(f"cmpl-{rid}", "text_completion", body)
        usage = openai_usage(len(prompt), len(gen.output_ids))
        return _json({**head, "choices": [choice], "usage": usage})

    def _completion_prompt(self, prompt: Any) -> list[int]:
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        if isinstance(prompt, list):
            self.tokenizer.check_ids(prompt, "prompt token id")
            return prompt
        raise ValueError("prompt must be a string, a list of one string, or a list of token ids")

    def _openai_head(self, rid: str, kind: str, body: Mapping[str, Any]) -> dict[str, Any]:
        model = body.get("model")
        return {
            "id": rid,
            "object": kind,
            "created": int(time.time()),
            "model": model if isinstance(model, str) else self.model_name,
        }

    def _openai_logprobs(self, gen: Generation) -> list[dict[str, Any]]:
        """choices[0].logprobs.content: one entry per generated token, the stop token included,
        so the entries' logprobs sum to the completion's log-prob."""
        tops = gen.top_logprobs or [[] for _ in gen.output_ids]
        return [
            {**self._openai_token(token, lp), "top_logprobs": [self._openai_token(*t) for t in top]}
            for token, lp, top in zip(gen.output_ids, gen.logprobs, tops, strict=True)
        ]

    def _openai_token(self, token: int, logprob: float) -> dict[str, Any]:
        text = self.tokenizer.token_text(token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    def _top_dict(self, step: list[tuple[int, float]]) -> dict[str, float]:
        return {self.tokenizer.token_text(t): lp for t, lp in step}

    # -- info, health, weights, recording -----------------------------------------------------

    async def _health(self, request: web.Request) -> web.StreamResponse:
        return web.Response(status=200)

    async def _health_generate(self, request: web.Request) -> web.StreamResponse:
        sp = SamplingParams(temperature=0.0, max_new_tokens=1)
        if isinstance(self.policy, TinyPolicy):
            self.policy.generate([0], sp, self._rng)
        else:
            await self.policy.generate_async([0], sp, 0, "health_generate", 0)
        return web.Response(status=200)

    async def _models(self, request: web.Request) -> web.StreamResponse:
        card = {
            "id": self.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "agentcore-rollout",
            "root": self.model_name,
            "max_model_len": self.context_length,
        }
        return _json({"object": "list", "data": [card]})

    async def _model_info(self, request: web.Request) -> web.StreamResponse:
        # No model_path / tokenizer_path on purpose: sglang-router would try to fetch a
        # tokenizer from the Hugging Face hub for whatever path a worker reports.
        return _json(
            {
                "model_name": self.model_name,
                "is_generation": True,
                "weight_version": self.policy.weight_version,
                "vocab_size": self.tokenizer.vocab_size,
                "context_length": self.context_length,
                "preferred_sampling_params": None,
            }
        )

    async def _server_info(self, request: web.Request) -> web.StreamResponse:
        return _json(
            {
                "model_name": self.model_name,
                "worker_id": self.worker_id,
                "context_length": self.context_length,
                "vocab_size": self.tokenizer.vocab_size,
                "weight_version": self.policy.weight_version,
                "record": self.record,
                "version": "tiny-char-policy/1",
            }
        )

    async def _flush_cache(self, request: web.Request) -> web.StreamResponse:
        return web.Response(text="Cache flushed.\n")  # there is no cache; SGLang's answer

    async def _update_weights_from_disk(self, request: web.Request) -> web.StreamResponse:
        """SGLang's body {"model_path": file.npz, "weight_version"?: str} and answer
        {"success", "message", "num_paused_requests"}; a failure is a 400 carrying both that
        answer and the usual error object."""
        body = await read_json_object(request)
        path, label = body.get("model_path"), body.get("weight_version")
        abort_all = boolean(body.get("abort_all_requests"), "abort_all_requests")
        try:
            if not isinstance(path, str) or not (label is None or isinstance(label, str)):
                raise ValueError("model_path must be a string path (weight_version a string)")
            if isinstance(self.policy, TinyPolicy):
                await self._load_paced(path, label, abort_all)
            else:  # applied by the scheduler thread once the running batch is empty
                await asyncio.wrap_future(self.policy.submit_load(path, label, abort_all))
        except ValueError as exc:
            error = _error_body(400, str(exc))
            return _json(
                {"success": False, "message": str(exc), "num_paused_requests": 0, **error}, 400
            )
        message = f"Loaded {path}; weight version {self.policy.weight_version}."
        return _json({"success": True, "message": message, "num_paused_requests": 0})

    async def _abort_request(self, request: web.Request) -> web.StreamResponse:
        """SGLang's POST /abort_request {"rid"} | {"abort_all": true}: 200 whether or not the rid
        is running (the toy's generations are only when paced: `token_delay`)."""
        body = await read_json_object(request)
        abort_all = boolean(body.get("abort_all"), "abort_all")
        rid = body.get("rid")
        if not abort_all and not isinstance(rid, str):
            raise ValueError("abort_request needs a string rid or abort_all: true")
        if not isinstance(self.policy, TinyPolicy):
            self.policy.abort(None if abort_all else rid)
        for paced in self._paced:
            paced.aborted |= abort_all or paced.rid == rid
        return web.Response(status=200)

    async def _weight_version(self, request: web.Request) -> web.StreamResponse:
        policy = self.policy
        return _json({"weight_version": policy.weight_version, "version": policy.version})

    async def _get_samples(self, request: web.Request) -> web.StreamResponse:
        return _json(
            {
                "worker_id": self.worker_id,
                "recording": self.record,
                "total": self._recorded,
                "dropped": self._recorded - len(self._samples),
                "samples": list(self._samples),
            }
        )

    async def _clear_samples(self, request: web.Request) -> web.StreamResponse:
        cleared = len(self._samples)
        self._samples.clear()
        self._recorded = 0
        return _json({"cleared": cleared})


@dataclasses.dataclass
class _Paced:
    """One paced toy generation in flight: its rid, and whether an abort asked it to end."""

    rid: str
    aborted: bool = False


# -- HTTP helpers ------------------------------------------------------------------------------


def _json(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, dumps=dumps)


def _error_body(status: int, message: str) -> dict[str, Any]:
    kind = "invalid_request_error" if status < 500 else "server_error"
    line = " ".join(message.split()) or "error"
    return {"error": {"message": line, "type": kind, "code": status}}


@web.middleware
async def _json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """ValueError anywhere in a handler is the client's fault: 400. aiohttp's own HTTP errors
    (404, 405, 413) keep their status but get the same JSON error body."""
    try:
        return await handler(request)
    except ValueError as exc:
        return _json(_error_body(400, str(exc)), 400)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _json(_error_body(exc.status, exc.reason), exc.status)


def _pick(value: Any, index: int, batch: bool) -> Any:
    """A per-request field of a batch request: a list gives each prompt its own entry."""
    if batch and isinstance(value, list):
        if len(value) <= index:
            raise ValueError("a per-request list field has fewer entries than there are prompts")
        return value[index]
    return value


def _top_n(value: Any, name: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOP_LOGPROBS:
        raise ValueError(f"{name} must be an integer in [0, {MAX_TOP_LOGPROBS}]")
    return value


def _rid(value: Any) -> str:
    if value is None:
        return uuid.uuid4().hex
    if not isinstance(value, str):
        raise ValueError("rid must be a string")
    return value
