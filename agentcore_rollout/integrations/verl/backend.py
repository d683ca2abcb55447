"""`VerlServerBackend`: the gateway samples through veRL's own server manager, so the trace holds
exactly what veRL's rollout servers sampled, labelled with veRL's weight version.

veRL's async trainers hand out a `FullyAsyncLLMServerClient`, which resumes an aborted generation
by itself but labels the whole output with one version: its resume loop is skipped, and the
gateway's resume records which version sampled each token."""

from __future__ import annotations

from functools import partial
from typing import Any

from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient, LLMServerClient

from ...gateway import Gateway, load_renderer
from ...gateway.backends import Backend, BackendError, Completion, TurnRequest

# veRL's sampling_params take the gateway's checked sampling fields by the same names, but these.
_UNSUPPORTED = frozenset({"min_p", "repetition_penalty", "ignore_eos"})


class VerlServerBackend(Backend):
    """Token capture through a veRL `LLMServerClient` (any object with its `generate`)."""

    name = "verl"
    token_capture = True

    def __init__(self, server_manager: Any) -> None:
        self.server_manager = server_manager
        self._generate = server_manager.generate
        if isinstance(server_manager, FullyAsyncLLMServerClient):  # one attempt, aborts shown
            self._generate = partial(LLMServerClient.generate, server_manager)

    async def complete(self, request: TurnRequest) -> Completion:
        if request.prompt_ids is None:
            raise ValueError("the veRL backend needs rendered prompt ids")
        if refused := _UNSUPPORTED.intersection(request.sampling):
            raise BackendError(f"veRL backend: unsupported sampling fields {sorted(refused)}", 400)
        if request.json_schema is not None or request.top_logprobs:
            what = "response_format" if request.json_schema is not None else "top_logprobs"
            raise BackendError(f"veRL backend: {what} is not supported by its server manager", 400)
        params: dict[str, Any] = dict(request.sampling)
        if request.stop_token_ids:
            ids = list(params.get("stop_token_ids") or [])
            params["stop_token_ids"] = ids + [i for i in request.stop_token_ids if i not in ids]
        params["logprobs"] = True
        try:
            output = await self._generate(
                request.rid, prompt_ids=request.prompt_ids, sampling_params=params
            )
        except Exception as e:  # a Ray or server error: the agent sees 502, in one line
            raise BackendError(f"veRL server manager failed: {type(e).__name__}: {e}") from None
        ids, logprobs = list(output.token_ids or ()), output.log_probs
        if logprobs is None and not ids:
            logprobs = []  # an abort before the first token
        if logprobs is None or len(logprobs) != len(ids):
            raise BackendError("veRL server returned no log-prob per sampled token")
        limit = params.get("max_tokens")
        stopped = bool(ids) and ids[-1] in params.get("stop_token_ids", ())
        version = (output.extra_fields or {}).get("global_steps")
        if output.stop_reason == "aborted":  # a weight update: the gateway resumes the turn
            finish = "abort"
        elif limit is not None and len(ids) >= limit and not stopped:
            finish = "length"
        else:
            finish = "stop"
        return Completion(
            finish_reason=finish,
            output_ids=ids,
            logprobs=[float(lp) for lp in logprobs],
            prompt_tokens=len(request.prompt_ids),
            completion_tokens=len(ids),
            weight_version=None if version is None else str(version),
        )


async def start_gateway(server_manager: Any, renderer: str, **options: Any) -> Gateway:
    """The hosted gateway, started: sampling through `server_manager`, rendering with
    `renderer` (a tokenizer directory or `module:attr`); `options` are the Gateway's."""
    gateway = Gateway(VerlServerBackend(server_manager), load_renderer(renderer), **options)
    await gateway.start()
    return gateway
