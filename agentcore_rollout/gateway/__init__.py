"""Token-capture gateway: the endpoint rollout agents call for the policy, in the API they speak
(OpenAI chat or Responses, Anthropic Messages), which records the exact token ids of each turn.

Names are imported on first use, so importing this package loads neither the server, the router
nor a tokenizer. The server needs only aiohttp; the Hugging Face renderer and sglang-router need
the [gateway] extra. docs/gateway.md is the guide; docs/architecture.md lists the modules."""

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
