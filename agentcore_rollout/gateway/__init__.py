"""Token-capture gateway: the endpoint rollout agents call for the policy, in the API they speak
(OpenAI chat or Responses, Anthropic Messages).

    backend = SGLangBackend(router.url)                  # or a worker URL; OpenAIBackend(url)
    async with Gateway(backend, HFRenderer.from_pretrained(path)) as gateway:
        async with GatewayAdmin(gateway.admin_url, gateway.admin_token) as admin:
            session = await admin.create_session("req-1", sampling={"temperature": 1.0})
            # the agent: OpenAI(base_url=f"{session.url}/v1", api_key=session.api_key)
            trace = await admin.finish_session(session.session_id)

Modules, one concept each: `server` (the agents' listener and routes), `admin` (the admin
API's listener and routes), `_http` (what the routes share: refusals, JSON replies, bearer tokens),
`pipeline` (one turn: render, sample, parse, record), `turns` (one turn in the gateway's own
terms, and the `Dialect` each API is), `chat`, `responses` and `messages` (the OpenAI chat,
OpenAI Responses and Anthropic Messages dialects), `sessions` (per-session keys, limits,
expiry, render states), `render` (messages <-> token ids, incremental per session, choosing a
renderer), `parsers` (each model family's tool-call and reasoning syntax -> message),
`backends` (SGLang /generate with log-probs; OpenAI pass-through), `resume` (aborted
generations continued), `sampling` (which sampling fields pass, and how), `trajectory` (turns
-> training samples with loss masks), `router` (sglang-router as a managed subprocess),
`_fastjson` (orjson when installed, for the per-turn JSON), `_limits` (bounded bodies, read
deadlines, nesting, requests in flight per session, the thread pool renders run in). The admin
client the engine opens sessions with (`GatewayAdmin`, and the trace's JSON shape) is the core's own
(`agentcore_rollout._engine.gateway_admin`), re-exported here.

The other names are imported on first use, so importing this package loads neither the server,
the router nor a tokenizer. The gateway depends on no particular model: the local toy
policy's renderer is `agentcore_rollout.local.policy.CharRenderer`.

Needs the [gateway] extra for the Hugging Face renderer (transformers, tokenizers) and the router
(sglang-router); the server itself needs only aiohttp (and uses orjson, also in the extra, when
installed).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .._engine.gateway_admin import GatewayAdmin, GatewayError, GatewaySession

if TYPE_CHECKING:
    from .backends import Backend, BackendError, Completion, OpenAIBackend, SGLangBackend
    from .parsers import Family, detect_family
    from .render import (
        AnchoredRenderer,
        HFRenderer,
        IncrementalRenderer,
        Parsed,
        Rendered,
        Renderer,
        RenderState,
        TextRenderer,
        load_renderer,
    )
    from .resume import ResumePolicy
    from .router import RouterError, SGLangRouter
    from .server import Gateway
    from .trajectory import Sample, Trajectory, Turn
    from .turns import TurnRequest

_NAMES = {  # the submodule each lazily imported name is in
    "backends": ("Backend", "BackendError", "Completion", "OpenAIBackend", "SGLangBackend"),
    "parsers": ("Family", "detect_family"),
    "render": (
        "AnchoredRenderer",
        "HFRenderer",
        "IncrementalRenderer",
        "Parsed",
        "RenderState",
        "Rendered",
        "Renderer",
        "TextRenderer",
        "load_renderer",
    ),
    "resume": ("ResumePolicy",),
    "router": ("RouterError", "SGLangRouter"),
    "server": ("Gateway",),
    "trajectory": ("Sample", "Trajectory", "Turn"),
    "turns": ("TurnRequest",),
}
_SUBMODULE = {name: module for module, names in _NAMES.items() for name in names}

__all__ = [
    "AnchoredRenderer",
    "Backend",
    "BackendError",
    "Completion",
    "Family",
    "Gateway",
    "GatewayAdmin",
    "GatewayError",
    "GatewaySession",
    "HFRenderer",
    "IncrementalRenderer",
    "OpenAIBackend",
    "Parsed",
    "RenderState",
    "Rendered",
    "Renderer",
    "ResumePolicy",
    "RouterError",
    "SGLangBackend",
    "SGLangRouter",
    "Sample",
    "TextRenderer",
    "Trajectory",
    "Turn",
    "TurnRequest",
    "detect_family",
    "load_renderer",
]


def __getattr__(name: str) -> Any:
    submodule = _SUBMODULE.get(name)
    if submodule is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{submodule}", __name__), name)
    globals()[name] = value  # once: later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
