"""TinyPolicy: a log-linear next-character model small enough to sample and train on a laptop CPU.

Not a language model: the logits are a sum of four table lookups,
`bias + bigram[prev_token] + position[pos] + cue[c, pos]`, the cue being the sum of the digits of
the last user message. Its initial tables answer "What is a + b?" right 15-25% of the time, so a
demo's reward has a signal from step 0 and the cue table something to learn. It is
differentiable in closed form (`logprobs_and_grad`, `apply_update`)."""

from __future__ import annotations

import zipfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from os import PathLike
from typing import Any

import numpy as np

from .sampling import SamplingParams, draw, log_softmax, sampling_logprobs
from .tokenizer import ENDOFTEXT_ID, IM_END_ID, IM_START_ID, PAD_ID, VOCAB_SIZE, CharTokenizer
from .tokenizer import char_id as _cid

NUM_POSITIONS = 8
NUM_CUES = 32
PARAM_SHAPES: dict[str, tuple[int, ...]] = {
    "bias": (VOCAB_SIZE,),
    "bigram": (VOCAB_SIZE, VOCAB_SIZE),
    "position": (NUM_POSITIONS, VOCAB_SIZE),
    "cue": (NUM_CUES, NUM_POSITIONS, VOCAB_SIZE),
}
_DIGIT_IDS = [_cid(d) for d in "0123456789"]
_ZERO_ID = _DIGIT_IDS[0]
_EOS_IDS = frozenset({IM_END_ID, ENDOFTEXT_ID})


@dataclass
class Generation:
    """One completion. `finish_reason` has SGLang's shape: {"type": "stop", "matched": token id
    or stop string} or {"type": "length", "length": max_new_tokens}. `output_ids` and `logprobs`
    include a matched stop token and the tokens of a matched stop string; `text` omits them
    (unless no_stop_trim) and omits special tokens (if skip_special_tokens). An abort (HFPolicy)
    ends it with {"type": "abort"} holding the tokens sampled so far."""

    output_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: dict[str, Any]
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    weight_version: str | None = None  # set by engines that batch (HFPolicy); else the server's


class TinyPolicy:
    """The toy policy: parameters, sampling, exact log-prob gradients, updates and persistence.

    `version` counts parameter changes (loads and updates) since construction; `weight_version`
    is the label a server reports, by default `str(version)`.
    """

    def __init__(self, seed: int = 0) -> None:
        self.tokenizer = CharTokenizer()
        self.params = _initial_params(seed)
        self.version = 0
        self.weight_version = "0"
        self._user_header = self.tokenizer.encode("<|im_start|>user\n")
        self._assistant_header = self.tokenizer.encode("<|im_start|>assistant\n")

    # -- model --------------------------------------------------------------------------------

    def cue(self, prompt_ids: Sequence[int]) -> int:
        """Digit sum of the last user message (or of the whole prompt), capped at NUM_CUES - 1."""
        start, header = 0, self._user_header
        for i in range(len(prompt_ids) - len(header), -1, -1):
            if prompt_ids[i] == IM_START_ID and list(prompt_ids[i : i + len(header)]) == header:
                start = i + len(header)
                break
        total = 0
        for token in prompt_ids[start:]:
            if token == IM_END_ID:
                break
            if _ZERO_ID <= token <= _ZERO_ID + 9:
                total += token - _ZERO_ID
        return min(total, NUM_CUES - 1)

    def written(self, prompt_ids: Sequence[int]) -> int:
        """Tokens of the assistant message the prompt leaves open (0 when it ends with the
        header, as a rendered turn does): where the completion's positions start. A resumed
        generation's prompt holds the tokens sampled before its abort, so its positions go on
        where they left off and the learner's recomputation of the whole turn matches it."""
        header = self._assistant_header
        for i in range(len(prompt_ids) - 1, -1, -1):
            if prompt_ids[i] == IM_END_ID:
                return 0
            if prompt_ids[i] == IM_START_ID:
                opened = list(prompt_ids[i : i + len(header)]) == header
                return len(prompt_ids) - i - len(header) if opened else 0
        return 0

    def logits(
        self, prompt_ids: Sequence[int], completion_prefix: Sequence[int] = ()
    ) -> np.ndarray:
        """Raw next-token logits after `prompt_ids + completion_prefix` (a copy)."""
        context = [*prompt_ids, *completion_prefix]
        prev = context[-1] if context else ENDOFTEXT_ID
        pos = self.written(prompt_ids) + len(completion_prefix)
        return self._logits(prev, pos, self.cue(prompt_ids))

    def _logits(self, prev: int, pos: int, cue: int) -> np.ndarray:
        p = self.params
        pos = min(pos, NUM_POSITIONS - 1)
        return p["bias"] + p["bigram"][prev] + p["position"][pos] + p["cue"][cue, pos]

    # -- sampling -----------------------------------------------------------------------------

    def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        rng: np.random.Generator,
        top_logprobs: int = 0,
    ) -> Generation:
        """Sample a completion; each log-prob is that of the sampled token under the distribution
        it was drawn from (see `sampling.sampling_logprobs`). `top_logprobs` > 0 also returns the
        most likely alternatives under that same distribution at each step."""
        out = Generation([], [], "", {"type": "length", "length": params.max_new_tokens})
        for _ in self.decode(prompt_ids, params, rng, top_logprobs, out):
            pass
        return out

    def decode(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        rng: np.random.Generator,
        top_logprobs: int,
        out: Generation,
    ) -> Iterator[None]:
        """`generate` one token at a time into `out`: yields after each token that did not end
        it, so a server can pace the toy and abort it between tokens (`PolicyServer`'s
        `token_delay`)."""
        self.tokenizer.check_ids(prompt_ids)
        stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else _EOS_IDS)
        cue, prev = self.cue(prompt_ids), (prompt_ids[-1] if prompt_ids else ENDOFTEXT_ID)
        written = self.written(prompt_ids)
        for pos in range(written, written + params.max_new_tokens):
            logprobs = sampling_logprobs(self._logits(prev, pos, cue), params)
            token = prev = draw(logprobs, params, rng)
            out.output_ids.append(token)
            out.logprobs.append(float(logprobs[token]))
            if top_logprobs > 0:
                out.top_logprobs.append(_top(logprobs, top_logprobs))
            piece = self.tokenizer.decode([token], params.skip_special_tokens)
            if token in stop_ids:
                out.text += piece if params.no_stop_trim else ""
                out.finish_reason = {"type": "stop", "matched": token}
                return
            if _append_and_match_stop(out, piece, params):
                return
            yield

    # -- training -----------------------------------------------------------------------------

    def logprobs_and_grad(
        self,
        prompt_ids: Sequence[int],
        completion_ids: Sequence[int],
        weights: Sequence[float] | None = None,
        temperature: float = 1.0,
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Per-token log-probs of `completion_ids` after `prompt_ids` under softmax(logits / T)
        (no top-k/top-p truncation: that is the differentiable training distribution), and the
        gradient of sum_t weights[t] * logprob[t] with respect to every parameter. With weights =
        advantages (0 on masked tokens) this is a REINFORCE / policy-gradient direction: pass it
        to `apply_update` with a positive lr to ascend."""
        self.tokenizer.check_ids([*prompt_ids, *completion_ids])
        w = np.ones(len(completion_ids)) if weights is None else np.asarray(weights, float)
        if w.shape != (len(completion_ids),) or temperature <= 0:
            raise ValueError("weights must have one entry per completion token; temperature > 0")
        grads = {name: np.zeros_like(value) for name, value in self.params.items()}
        cue, prev = self.cue(prompt_ids), (prompt_ids[-1] if prompt_ids else ENDOFTEXT_ID)
        logprobs = np.empty(len(completion_ids))
        start = self.written(prompt_ids)
        for t, token in enumerate(completion_ids, start=start):
            lp = log_softmax(self._logits(prev, t, cue) / temperature)
            logprobs[t - start] = lp[token]
            g = -np.exp(lp)  # d logp[token] / d logits = (onehot - p) / T
            g[token] += 1.0
            g *= w[t - start] / temperature
            pos = min(t, NUM_POSITIONS - 1)
            grads["bias"] += g
            grads["bigram"][prev] += g
            grads["position"][pos] += g
            grads["cue"][cue, pos] += g
            prev = token
        return logprobs, grads

    def apply_update(self, update: Mapping[str, np.ndarray], lr: float) -> None:
        """In place: params[name] += lr * update[name] for each given name (a subset is fine).
        Validated before anything changes, so a bad update leaves the policy untouched."""
        for name, value in update.items():
            _check_param(name, np.asarray(value))
        for name, value in update.items():
            self.params[name] += lr * np.asarray(value, dtype=np.float64)
        self._bump(None)

    # -- persistence --------------------------------------------------------------------------

    def save(self, path: str | PathLike[str]) -> None:
        """Write the parameters as an uncompressed .npz (numpy appends .npz if missing)."""
        np.savez(path, **self.params)

    def load(self, path: str | PathLike[str], weight_version: str | None = None) -> None:
        """Replace every parameter with those `save` wrote; ValueError (one line) if the file
        is unusable, checked first, so nothing changes then."""
        try:
            with np.load(path, allow_pickle=False) as data:
                state = {name: data[name] for name in data.files}
        except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
            raise ValueError(f"cannot load parameters from {path!s}: {exc}") from None
        if missing := set(PARAM_SHAPES) - set(state):
            raise ValueError(f"parameters missing: {sorted(missing)}")
        for name, value in state.items():
            _check_param(name, value)
        self.params = {name: np.array(state[name], dtype=np.float64) for name in PARAM_SHAPES}
        self._bump(weight_version)

    def _bump(self, weight_version: str | None) -> None:
        self.version += 1
        self.weight_version = weight_version or str(self.version)


def _append_and_match_stop(out: Generation, piece: str, params: SamplingParams) -> bool:
    """Append `piece` to the text; on a stop-string match record it, trim, and return True."""
    before = len(out.text)
    out.text += piece
    hits = [
        (index, stop)
        for stop in params.stop
        if (index := out.text.find(stop, max(0, before - len(stop) + 1))) >= 0
    ]
    if not hits:
        return False
    index, stop = min(hits)
    out.finish_reason = {"type": "stop", "matched": stop}
    if not params.no_stop_trim:
        out.text = out.text[:index]
    return True


def _top(logprobs: np.ndarray, n: int) -> list[tuple[int, float]]:
    best = np.argsort(-logprobs, kind="stable")[:n]
    return [(int(i), float(logprobs[i])) for i in best if np.isfinite(logprobs[i])]


def _check_param(name: str, value: np.ndarray) -> None:
    if name not in PARAM_SHAPES:
        raise ValueError(f"unknown parameter {name!r}; expected one of {sorted(PARAM_SHAPES)}")
    if value.shape != PARAM_SHAPES[name] or not np.all(np.isfinite(value)):
        raise ValueError(f"parameter {name!r} must be finite with shape {PARAM_SHAPES[name]}")


def _initial_params(seed: int) -> dict[str, np.ndarray]:
    """Deterministic from `seed`: format priors by hand, plus seeded noise on the bigram table."""
    rng = np.random.default_rng(seed)
    bias = np.full(VOCAB_SIZE, -4.0)
    bias[_DIGIT_IDS] = 1.0
    bias[[_cid(" "), _cid("-")]] = -1.0
    bias[IM_END_ID] = 0.0
    bias[[PAD_ID, ENDOFTEXT_ID, IM_START_ID]] = -12.0
    position = np.zeros((NUM_POSITIONS, VOCAB_SIZE))
    position[:, IM_END_ID] = 3.0  # about even odds of stopping after each token...
    position[0, IM_END_ID] = -4.0  # ...but never (well, rarely) an empty answer
    cue = np.zeros((NUM_CUES, NUM_POSITIONS, VOCAB_SIZE))
    for value in range(NUM_CUES):
        answer = str(value)
        for pos, char in enumerate(answer):
            cue[value, pos, _cid(char)] = 2.0
        cue[value, len(answer), IM_END_ID] = 1.5
    bigram = rng.normal(0.0, 0.5, (VOCAB_SIZE, VOCAB_SIZE))
    return {"bias": bias, "bigram": bigram, "position": position, "cue": cue}
