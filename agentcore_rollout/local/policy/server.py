"""PolicyServer: a local policy behind the HTTP APIs SGLang and vLLM workers expose, so the gateway,
the router and the example agents run unchanged against it on a laptop and against SGLang on a
GPU (the endpoints: docs/local-stack.md). The toy and `hf.HFPolicy` run behind the same routes.

With `admin_token` set, the routes that change or read more than the model (weight loads, aborts,
the recorded samples, the cache) need it: an agent that reaches the server can sample, but not
load a host path as weights, abort every session or read their samples."""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from ...serving.http import Handler, boolean, dumps, read_json_object, sse_response
from ...serving.server import Server
from .model import TinyPolicy
from .openai_api import OpenAIApi
from .sampling import SamplingParams
from .worker import BatchedPolicy, PolicyWorker, request_id, top_n

TOKEN_ENV = "AGENTCORE_POLICY_ADMIN_TOKEN"
"""Where `python -m agentcore_rollout.local.policy` reads its admin token (never argv)."""

_Job = tuple[list[int], SamplingParams, str, bool, int]  # prompt, sampling, rid, logprobs, top n


class PolicyServer(Server):
    """An aiohttp server around one policy (`worker.PolicyWorker`); `async with PolicyServer()
    as s: s.url`. GET /debug/samples reads what `record=True` kept, DELETE clears it."""

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
        token_delay: float = 0.0,
        admin_token: str | None = None,
    ) -> None:
        super().__init__(host, port)
        self._admin_token = admin_token
        self.worker = PolicyWorker(
            policy, seed=seed, token_delay=token_delay, record=record, record_limit=record_limit
        )
        self.policy = self.worker.policy
        self.tokenizer = self.worker.tokenizer
        self._worker_id = worker_id

    async def start(self) -> None:
        await super().start()
        self.worker.worker_id = self._worker_id or f"{self.host}:{self.port}"

    async def stop(self) -> None:
        await super().stop()
        await self.worker.close()

    def app(self) -> web.Application:
        app = web.Application(middlewares=[_json_errors], client_max_size=16 * 1024 * 1024)
        get, post, admin = web.get, web.post, self._admin
        app.add_routes(
            [
                post("/generate", self._generate),
                *OpenAIApi(self.worker).routes(),
                get("/health", self._health),
                get("/health_generate", self._health_generate),
                get("/get_model_info", self._model_info),
                get("/get_server_info", self._server_info),
                get("/server_info", self._server_info),
                get("/flush_cache", admin(self._flush_cache)),
                post("/flush_cache", admin(self._flush_cache)),
                post("/update_weights_from_disk", admin(self._update_weights_from_disk)),
                post("/abort_request", admin(self._abort_request)),
                get("/get_weight_version", self._weight_version),
                get("/params/version", self._weight_version),
                get("/debug/samples", admin(self._get_samples)),
                web.delete("/debug/samples", admin(self._clear_samples)),
            ]
        )
        return app

    def _admin(self, handler: Handler) -> Handler:
        """`handler` for callers holding `admin_token` only (anyone, when there is none)."""
        if self._admin_token is None:
            return handler
        expected = f"Bearer {self._admin_token}".encode()

        async def checked(request: web.Request) -> web.StreamResponse:
            given = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                message = f"{request.path} needs the policy's admin token (Authorization: Bearer)"
                return _json(_error_body(401, message), 401)
            return await handler(request)

        return checked

    # -- SGLang native ------------------------------------------------------------------------

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        """POST /generate (SGLang): single or batch (`text` list / `input_ids` list of lists);
        every per-request field may then be a list with one entry per prompt."""
        body = await read_json_object(request)
        prompts, batch = self._generate_prompts(body)
        with_text = boolean(body.get("return_text_in_logprobs"), "return_text_in_logprobs")
        # Validate every prompt's arguments before generating any, so a bad batch has no effect.
        jobs = [self._generate_job(body, i, batch, prompt) for i, prompt in enumerate(prompts)]
        outputs = await asyncio.gather(*(self._generate_one(job, with_text) for job in jobs))
        if boolean(body.get("stream"), "stream"):
            return await sse_response(request, iter(outputs))
        return _json(outputs if batch else outputs[0])

    def _generate_job(
        self, body: Mapping[str, Any], i: int, batch: bool, prompt: list[int]
    ) -> _Job:
        sp = SamplingParams.from_json(_pick(body.get("sampling_params"), i, batch))
        self.worker.check_context(len(prompt), sp.max_new_tokens)
        rid = request_id(_pick(body.get("rid"), i, batch))
        want_logprob = boolean(_pick(body.get("return_logprob"), i, batch), "return_logprob")
        top = top_n(_pick(body.get("top_logprobs_num"), i, batch), "top_logprobs_num")
        return prompt, sp, rid, want_logprob, top if want_logprob else 0

    async def _generate_one(self, job: _Job, with_text: bool) -> dict[str, Any]:
        """One /generate output: {"text", "output_ids", "meta_info"} as SGLang shapes it."""
        prompt, sp, rid, want_logprob, top = job
        started = time.perf_counter()
        gen = await self.worker.generate(prompt, sp, top, rid, "/generate")
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
            if top:
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

    async def _health(self, request: web.Request) -> web.StreamResponse:
        return web.Response(status=200)

    async def _health_generate(self, request: web.Request) -> web.StreamResponse:
        await self.worker.check_health()
        return web.Response(status=200)

    async def _model_info(self, request: web.Request) -> web.StreamResponse:
        # No model_path / tokenizer_path on purpose: sglang-router would try to fetch a
        # tokenizer from the Hugging Face hub for whatever path a worker reports.
        worker = self.worker
        return _json(
            {
                "model_name": worker.model_name,
                "is_generation": True,
                "weight_version": self.policy.weight_version,
                "vocab_size": self.tokenizer.vocab_size,
                "context_length": worker.context_length,
                "preferred_sampling_params": None,
            }
        )

    async def _server_info(self, request: web.Request) -> web.StreamResponse:
        worker = self.worker
        return _json(
            {
                "model_name": worker.model_name,
                "worker_id": worker.worker_id,
                "context_length": worker.context_length,
                "vocab_size": self.tokenizer.vocab_size,
                "weight_version": self.policy.weight_version,
                "record": worker.record,
                "version": "tiny-char-policy/1",
            }
        )

    async def _flush_cache(self, request: web.Request) -> web.StreamResponse:
        return web.Response(text="Cache flushed.\n")  # there is no cache; SGLang's answer

    async def _update_weights_from_disk(self, request: web.Request) -> web.StreamResponse:
        """SGLang's body {"model_path": file.npz | dir, "weight_version"?: str} and answer
        {"success", "message", "num_paused_requests"}; a failure is a 400 carrying both that
        answer and the usual error object."""
        body = await read_json_object(request)
        path, label = body.get("model_path"), body.get("weight_version")
        abort_all = boolean(body.get("abort_all_requests"), "abort_all_requests")
        try:
            if not isinstance(path, str) or not (label is None or isinstance(label, str)):
                raise ValueError("model_path must be a string path (weight_version a string)")
            await self.worker.load(path, label, abort_all)
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
        self.worker.abort(None if abort_all else rid)
        return web.Response(status=200)

    async def _weight_version(self, request: web.Request) -> web.StreamResponse:
        policy = self.policy
        return _json({"weight_version": policy.weight_version, "version": policy.version})

    async def _get_samples(self, request: web.Request) -> web.StreamResponse:
        worker = self.worker
        return _json(
            {
                "worker_id": worker.worker_id,
                "recording": worker.record,
                "total": worker.recorded,
                "dropped": worker.recorded - len(worker.samples),
                "samples": list(worker.samples),
            }
        )

    async def _clear_samples(self, request: web.Request) -> web.StreamResponse:
        cleared = len(self.worker.samples)
        self.worker.samples.clear()
        self.worker.recorded = 0
        return _json({"cleared": cleared})


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
