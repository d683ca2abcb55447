"""Sampling parameters: which OpenAI request fields the gateway honours, and how they map to
SGLang's `sampling_params`.

A session carries the trainer's defaults, which an agent's request may override field by field.
Only known fields are accepted and type-checked, so a typo in a session's defaults fails at
session creation instead of being silently ignored by a backend."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

# OpenAI (and common vLLM/SGLang extension) name -> SGLang sampling_params name.
SGLANG_NAMES: dict[str, str] = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "max_tokens": "max_new_tokens",
    "stop": "stop",
    "stop_token_ids": "stop_token_ids",
    "seed": "sampling_seed",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "repetition_penalty": "repetition_penalty",
    "ignore_eos": "ignore_eos",
}
_FLOATS = {"temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty"}
_FLOATS |= {"repetition_penalty"}
_INTS = {"top_k", "max_tokens", "seed"}


def check_sampling(raw: Any, what: str = "sampling") -> dict[str, Any]:
    """Validate a dict of sampling fields (session defaults); unknown names are an error.
    `max_completion_tokens` is accepted as `max_tokens`."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ValueError(f"{what} must be an object")
    out: dict[str, Any] = {}
    for key, value in raw.items():
        name = "max_tokens" if key == "max_completion_tokens" else key
        if name not in SGLANG_NAMES:
            known = ", ".join(sorted(SGLANG_NAMES))
            raise ValueError(f"{what}: unknown field {key!r} (known: {known})")
        if value is not None:
            out[name] = _check(name, value, what)
    return out


def request_sampling(body: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The session's defaults overridden by the sampling fields present in an OpenAI request
    body (other body fields are not sampling fields and are left alone). `n` must be 1."""
    n = body.get("n")
    if n not in (None, 1):
        raise ValueError("n must be 1 (one completion per request)")
    picked = {k: body[k] for k in SGLANG_NAMES if k in body}
    if body.get("max_completion_tokens") is not None:
        picked["max_tokens"] = body["max_completion_tokens"]
    return {**defaults, **check_sampling(picked, "request")}


def to_sglang(sampling: Mapping[str, Any], stop_token_ids: tuple[int, ...] = ()) -> dict[str, Any]:
    """SGLang `sampling_params` for checked sampling fields; the renderer's end-of-turn ids are
    added to `stop_token_ids` so generation ends where the chat template expects it to."""
    params = {SGLANG_NAMES[k]: v for k, v in sampling.items()}
    if isinstance(params.get("stop"), str):
        params["stop"] = [params["stop"]]
    if stop_token_ids:
        ids = list(params.get("stop_token_ids") or [])
        params["stop_token_ids"] = ids + [i for i in stop_token_ids if i not in ids]
    return params


def _check(name: str, value: Any, what: str) -> Any:
    bad = f"{what}: {name} must be "
    if name in _FLOATS:
        if not finite_number(value):
            raise ValueError(bad + "a finite number")
        return value
    if name in _INTS:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(bad + "an integer")
        if name == "max_tokens" and value < 0:
            raise ValueError(bad + ">= 0")
        return value
    if name == "ignore_eos":
        if not isinstance(value, bool):
            raise ValueError(bad + "a boolean")
        return value
    if name == "stop":
        if isinstance(value, str) or (
            isinstance(value, list) and all(isinstance(s, str) for s in value)
        ):
            return value
        raise ValueError(bad + "a string or a list of strings")
    # stop_token_ids
    if isinstance(value, list) and all(
        isinstance(i, int) and not isinstance(i, bool) for i in value
    ):
        return value
    raise ValueError(bad + "a list of token ids")


def finite_number(value: Any) -> bool:
    """An int or float (not a bool) that is finite, also as a float."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False
