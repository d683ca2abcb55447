"""Sampling parameters and the exact next-token distribution they define: temperature, then top_k,
top_p and min_p, each renormalised. The reported log-prob is that of the distribution a token was
actually drawn from; SGLang's leaves top_k and min_p out (sgl-project/sglang#2664), so the two
agree whenever those are off. Greedy (temperature < 1e-5) reports log_softmax of the raw logits,
as SGLang does: a point mass's 0 would be useless."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from ...gateway.sampling import finite_number

# Below this temperature decoding is greedy (vLLM's cut). SGLang maps such temperatures to
# top_k=1 at temperature 1: the same argmax, and the same reported log_softmax(logits).
GREEDY_TEMPERATURE = 1e-5

# Knobs a real server honours that this one does not: accepted at their neutral value, rejected
# otherwise, so a client never silently gets a different distribution from the one it asked for.
_NEUTRAL_ONLY = {
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_new_tokens": 0,
    "n": 1,
}
_ABSENT_ONLY = ("regex", "json_schema", "ebnf", "structural_tag", "logit_bias")


@dataclass(frozen=True)
class SamplingParams:
    """What a request asks of the sampler; invalid values raise ValueError on construction."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: off
    min_p: float = 0.0
    max_new_tokens: int = 128
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False  # if set, <|im_end|> and <|endoftext|> do not end generation
    skip_special_tokens: bool = True  # in the returned text (and for stop-string matching)
    no_stop_trim: bool = False  # keep a matched stop string in the returned text
    seed: int | None = None  # per-request RNG seed; None draws from the server's RNG

    def __post_init__(self) -> None:
        checks = (
            (self.temperature >= 0.0, "temperature must be >= 0"),
            (0.0 < self.top_p <= 1.0, "top_p must be in (0, 1]"),
            (self.top_k == -1 or self.top_k >= 1, "top_k must be -1 (off) or >= 1"),
            (0.0 <= self.min_p < 1.0, "min_p must be in [0, 1)"),
            (self.max_new_tokens >= 0, "max_new_tokens must be >= 0"),
            (self.seed is None or self.seed >= 0, "seed must be >= 0"),
            (all(self.stop), "stop strings must be non-empty"),
        )
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        # stop_token_ids are checked against the serving model's vocabulary by the server

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE

    @classmethod
    def from_json(cls, raw: Mapping[str, Any] | None, **defaults: Any) -> SamplingParams:
        """Parse SGLang-style `sampling_params`. A null or missing field takes `defaults` or the
        class default; unknown fields are ignored (routers add their own); SGLang's
        `sampling_seed` is accepted as `seed`; top_k 0 means off, as in vLLM."""
        raw = {} if raw is None else raw
        if not isinstance(raw, Mapping):
            raise ValueError("sampling_params must be an object")
        _reject_unsupported(raw)
        values: dict[str, Any] = dict(defaults)
        for f in fields(cls):
            key = "sampling_seed" if f.name == "seed" and raw.get("seed") is None else f.name
            if raw.get(key) is not None:
                values[f.name] = _coerce(key, raw[key], f.default)
        if values.get("top_k") == 0:
            values["top_k"] = -1
        return cls(**values)


def _coerce(key: str, value: Any, default: Any) -> Any:
    """Type-check one JSON value against the field's default (bools are not numbers here)."""
    if key == "stop":
        value = [value] if isinstance(value, str) else value
        if isinstance(value, list) and all(isinstance(s, str) for s in value):
            return tuple(value)
        raise ValueError("stop must be a string or a list of strings")
    if key == "stop_token_ids":
        if isinstance(value, list):
            return tuple(value)  # entries are checked against the vocabulary on construction
        raise ValueError("stop_token_ids must be a list of token ids")
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, float):
        ok = finite_number(value)
    else:  # int fields, and seed (default None)
        ok = isinstance(value, int) and not isinstance(value, bool)
    if not ok:
        kind = "a finite number" if isinstance(default, float) else type(default or 0).__name__
        raise ValueError(f"{key} must be {kind}, got {value!r:.40}")
    return float(value) if isinstance(default, float) else value


def _reject_unsupported(raw: Mapping[str, Any]) -> None:
    for key, neutral in _NEUTRAL_ONLY.items():
        if raw.get(key) not in (None, neutral):
            raise ValueError(f"{key}={raw[key]!r} is not supported by this server")
    for key in _ABSENT_ONLY:
        if raw.get(key):
            raise ValueError(f"{key} is not supported by this server")


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max()
    return shifted - np.log(np.exp(shifted).sum())


def sampling_logprobs(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Log-probabilities of the distribution the next token is drawn from (-inf off its support;
    for greedy decoding, log_softmax of the raw logits, see the module docstring)."""
    if params.greedy:
        return log_softmax(logits)
    scaled = log_softmax(logits / params.temperature)
    if params.top_k == -1 and params.top_p >= 1.0 and params.min_p == 0.0:
        return scaled  # nothing to truncate (the common RL setting): skip the sort
    probs = np.exp(scaled)
    order = np.argsort(-probs, kind="stable")
    head = probs[order[: params.top_k]] if params.top_k > 0 else probs[order]
    head = head / head.sum()
    in_nucleus = (np.cumsum(head) - head) < params.top_p  # mass before a token; a prefix
    kept = order[: int(np.count_nonzero(in_nucleus))]
    kept = kept[probs[kept] >= params.min_p * probs[kept].max()]
    truncated = np.zeros_like(probs)
    truncated[kept] = probs[kept]
    with np.errstate(divide="ignore"):
        return np.log(truncated / truncated.sum())


def draw(logprobs: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    """One token from `sampling_logprobs(...)` output: argmax if greedy, else an inverse-CDF draw
    (a zero-probability token owns an empty CDF interval, so it can never be drawn)."""
    if params.greedy:
        return int(np.argmax(logprobs))
    cdf = np.cumsum(np.exp(logprobs))
    return min(int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right")), cdf.size - 1)
