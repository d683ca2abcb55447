"""Sampling backends: where a turn is generated, behind one interface (`complete(request)`).

`SGLangBackend` (token capture) sends prompt ids to SGLang's native `/generate` and returns the
sampled ids with their log-probs, never a re-tokenization of the text; `OpenAIBackend` passes the
conversation through to any OpenAI-compatible endpoint (traces say `token_capture: false`). A
backend's 400 stays the agent's; anything else is a one-line `BackendError` (502/504). An aborted
generation is no error: a Completion with finish_reason `abort`, which `resume` continues."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import aiohttp

from . import _fastjson
from .sampling import to_sglang
from .turns import ToolChoice, TurnRequest


class BackendError(Exception):
    """A turn could not be generated. `status` is what the gateway answers the agent."""

    def __init__(self, message: str, status: int = 502, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable


@dataclass
class Completion:
    """What a backend generated. Token backends fill `output_ids`/`logprobs` (the assistant
    message is then parsed by the renderer); pass-through backends fill `message`."""

    finish_reason: str  # stop | length | abort (tool_calls is decided by the gateway after parsing)
    output_ids: list[int] | None = None
    logprobs: list[float] | None = None
    message: dict[str, Any] | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    weight_version: str | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None  # per output token: (id, logprob)
    logprob_entries: list[dict[str, Any]] | None = None  # pass-through: the upstream's own
    stop_sequence: str | None = None  # the stop string that ended generation
    # Per output token, the weight version that sampled it, as runs (version, count) in order;
    # set by the gateway (`resume`), which also counts the times it `resumed` the generation.
    version_runs: list[tuple[str | None, int]] | None = None
    resumed: int = 0


class Backend(ABC):
    """A place to sample from. `token_capture` says whether completions carry token ids."""

    name: ClassVar[str]
    token_capture: ClassVar[bool]

    @abstractmethod
    async def complete(self, request: TurnRequest) -> Completion: ...

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections (the gateway calls it when it stops)."""


class _HTTPBackend(Backend):
    """Shared JSON-over-HTTP plumbing: one pooled aiohttp session, uniform error mapping."""

    def __init__(self, url: str, *, timeout: float, max_connections: int) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.max_connections = max_connections
        self._http: aiohttp.ClientSession | None = None
        self._headers = {"Content-Type": "application/json"}

    async def _post(self, path: str, body: Mapping[str, Any]) -> Any:
        if self._http is None or self._http.closed:
            connector = aiohttp.TCPConnector(limit=self.max_connections)
            self._http = aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=self.timeout)
            )
        target = f"{self.url}{path}"
        data = _fastjson.dumps(body)
        try:
            async with self._http.post(target, data=data, headers=self._headers) as response:
                raw = await response.read()
                status = response.status
        except TimeoutError:
            raise BackendError(
                f"{self.name} backend timed out after {self.timeout:g}s", 504
            ) from None
        except aiohttp.ClientError as exc:
            raise BackendError(
                f"{self.name} backend unreachable at {self.url}: {exc}", retryable=True
            ) from None
        if status != 200:
            detail = _error_detail(raw.decode(errors="replace"))
            if status == 400:
                raise BackendError(f"{self.name} backend rejected the request: {detail}", 400)
            message = f"{self.name} backend answered {status}: {detail}"
            raise BackendError(message, retryable=status in (502, 503))
        try:
            return _fastjson.loads(raw)
        except ValueError:
            raise BackendError(f"{self.name} backend answered non-JSON: {raw[:200]!r}") from None

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None


class SGLangBackend(_HTTPBackend):
    """SGLang native `/generate` with token ids in and token ids + log-probs out.

    Works against one SGLang worker, against sglang-router, and against the local PolicyServer
    (same wire shape). Log-probs are SGLang's `meta_info.output_token_logprobs` (the sampling
    distribution's, see local.policy.sampling); the sampled ids are taken from the same entries
    and cross-checked against `output_ids` when the server returns both.
    """

    name = "sglang"
    token_capture = True

    def __init__(self, url: str, *, timeout: float = 3600.0, max_connections: int = 1024) -> None:
        super().__init__(url, timeout=timeout, max_connections=max_connections)

    async def complete(self, request: TurnRequest) -> Completion:
        if request.prompt_ids is None:
            raise ValueError("the SGLang backend needs rendered prompt ids")
        params = to_sglang(request.sampling, request.stop_token_ids)
        if request.json_schema is not None:  # SGLang's grammar backend constrains decoding
            params["json_schema"] = json.dumps(request.json_schema)
        body = {
            "input_ids": request.prompt_ids,
            "sampling_params": params,
            "return_logprob": True,
            "logprob_start_len": -1,  # output tokens only: no prompt log-probs to compute
            "rid": request.rid,
            "stream": False,
        }
        if request.top_logprobs:
            body["top_logprobs_num"] = request.top_logprobs
        return parse_generate(await self._post("/generate", body))


def parse_generate(data: Any) -> Completion:
    """A Completion from one SGLang `/generate` answer; BackendError if it is not usable."""
    if isinstance(data, list) and len(data) == 1:
        data = data[0]
    meta = data.get("meta_info") if isinstance(data, Mapping) else None
    if not isinstance(meta, Mapping):
        raise BackendError("SGLang answer has no meta_info")
    entries = meta.get("output_token_logprobs")
    if not isinstance(entries, list):
        raise BackendError("SGLang answer has no output_token_logprobs (return_logprob ignored?)")
    try:
        logprobs = [float(e[0]) for e in entries]
        ids = [int(e[1]) for e in entries]
    except (TypeError, ValueError, IndexError):
        raise BackendError(
            "SGLang output_token_logprobs entries are not [logprob, id, ...]"
        ) from None
    output_ids = data.get("output_ids")
    if output_ids is not None and list(output_ids) != ids:
        raise BackendError("SGLang output_ids disagree with output_token_logprobs")
    finish = meta.get("finish_reason")
    kind = finish.get("type") if isinstance(finish, Mapping) else finish
    version = meta.get("weight_version")
    matched = finish.get("matched") if isinstance(finish, Mapping) else None
    return Completion(
        finish_reason=kind if kind in ("length", "abort") else "stop",
        output_ids=ids,
        logprobs=logprobs,
        prompt_tokens=meta.get("prompt_tokens"),
        completion_tokens=len(ids),
        weight_version=None if version is None else str(version),
        top_logprobs=_top_logprobs(meta.get("output_top_logprobs"), len(ids)),
        stop_sequence=matched if isinstance(matched, str) else None,
    )


def _top_logprobs(entries: Any, n: int) -> list[list[tuple[int, float]]] | None:
    """SGLang's `output_top_logprobs` (per token: [logprob, id, text] entries) as (id, logprob)."""
    if entries is None:
        return None
    try:
        tops = [[(int(e[1]), float(e[0])) for e in step or ()] for step in entries]
    except (TypeError, ValueError, IndexError):
        raise BackendError(
            "SGLang output_top_logprobs entries are not [logprob, id, ...]"
        ) from None
    if len(tops) != n:
        raise BackendError("SGLang output_top_logprobs do not match the output tokens")
    return tops


class OpenAIBackend(_HTTPBackend):
    """Pass-through to an OpenAI-compatible `/chat/completions` (no token capture).

    `base_url` includes the version prefix (e.g. `https://host/v1`); `api_key` is the upstream's
    key (the agent's per-session gateway key is never forwarded); `model` overrides the agent's
    model name.
    """

    name = "openai"
    token_capture = False

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        model: str | None = None,
        timeout: float = 600.0,
        max_connections: int = 256,
    ) -> None:
        super().__init__(base_url, timeout=timeout, max_connections=max_connections)
        if api_key:  # the upstream's key: the agent's per-session gateway key is never sent
            self._headers["Authorization"] = f"Bearer {api_key}"
        self.model = model

    def __repr__(self) -> str:  # keep the upstream key out of logs and tracebacks
        return f"OpenAIBackend(base_url={self.url!r}, model={self.model!r}, api_key='***')"

    async def complete(self, request: TurnRequest) -> Completion:
        body: dict[str, Any] = {
            "model": self.model or request.model,
            "messages": request.messages,
            **request.sampling,
        }
        if request.tools:
            body["tools"] = request.tools
            body["tool_choice"] = _openai_tool_choice(request.tool_choice)
            body["parallel_tool_calls"] = request.parallel_tool_calls
        if request.json_schema is not None:
            schema = {"name": "response", "schema": request.json_schema}
            body["response_format"] = {"type": "json_schema", "json_schema": schema}
        if request.logprobs:
            body["logprobs"] = True
            body["top_logprobs"] = request.top_logprobs
        data = await self._post("/chat/completions", body)
        try:
            choice = data["choices"][0]
            message = dict(choice["message"])
        except (KeyError, IndexError, TypeError):
            raise BackendError("upstream answer has no choices[0].message") from None
        usage = data.get("usage") or {}
        finish = choice.get("finish_reason")
        return Completion(
            finish_reason="length" if finish == "length" else "stop",
            message={k: message.get(k) for k in ("role", "content", "tool_calls") if k in message},
            prompt_tokens=usage.get("prompt_tokens"),
            completion_tokens=usage.get("completion_tokens"),
            logprob_entries=((choice.get("logprobs") or {}).get("content") or None)
            if request.logprobs
            else None,
        )


def _openai_tool_choice(choice: ToolChoice) -> Any:
    if choice.name is None:
        return choice.mode
    return {"type": "function", "function": {"name": choice.name}}


def _error_detail(text: str) -> str:
    """The one-line message of an error body (OpenAI or SGLang shape), else its start."""
    try:
        body = json.loads(text)
    except ValueError:
        return " ".join(text.split())[:200] or "(empty body)"
    error = body.get("error") if isinstance(body, Mapping) else None
    message = error.get("message") if isinstance(error, Mapping) else error
    message = message or (body.get("message") if isinstance(body, Mapping) else None)
    return " ".join(str(message or text).split())[:300]
