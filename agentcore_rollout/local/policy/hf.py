"""HFPolicy: a Hugging Face causal LM on CPU (torch) behind PolicyServer, continuously batched.

A forward pass takes too long for the event loop, and concurrent requests should share passes, so
one scheduler thread owns the model and a running batch, admitting, aborting and retiring
requests between decode steps. A weight load waits for the batch to drain (as SGLang's does), so
no answer mixes versions. Threads: one by default, since on cores shared with other processes
OpenMP's threads spin at every barrier for a core they do not get (two threads: 6 tokens/s
against 57 for one, measured on 2 busy cores); pass `threads=2` on idle cores. Where the time
goes: docs/benchmarks.md. torch and transformers are imported here only."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, GenerationConfig
from transformers.cache_utils import DynamicLayer
from transformers.utils import logging as hf_logging

from .model import Generation
from .sampling import SamplingParams, draw, sampling_logprobs
from .tokenizer import CharTokenizer

ABORTED = {"type": "abort", "message": "aborted"}
MAX_BATCH = 64  # rows decoded together; more wait for a free one


def load_causal_lm(model_dir: str | PathLike[str]) -> tuple[Path, Any]:
    """A local model directory's causal LM in float32, in eval mode (no dropout: the server's
    and the trainer's forward passes are the same); never the hub."""
    path = Path(model_dir)
    if not path.is_dir():
        raise ValueError(f"model dir {model_dir!s} does not exist")
    # A load or save takes under a second; its bars would only break up the CLI's own.
    hf_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
    return path, model.eval()


class HFTokenizer:
    """The slice of a Hugging Face tokenizer that PolicyServer calls (CharTokenizer's shape)."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        self.hf = tokenizer
        self.vocab_size = vocab_size  # the model's embedding rows: the ids it can read

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return str(self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def token_text(self, token_id: int) -> str:
        return self.decode([token_id])

    check_ids = CharTokenizer.check_ids  # the same check, over this vocabulary

    def apply_chat_template(self, messages: Any) -> list[int]:
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages must be a non-empty list")
        text = self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return self.encode(text)


@dataclass(eq=False)
class _Request:
    prompt: list[int]
    sp: SamplingParams
    top_n: int
    rid: str
    rng: np.random.Generator
    stop_ids: frozenset[int]
    future: cf.Future[Generation] = field(default_factory=cf.Future)
    out: Generation = field(default_factory=lambda: Generation([], [], "", {}))
    aborted: bool = False
    position: int = 0  # the position of the next input token (= tokens in this row's cache)


@dataclass(eq=False)
class _Load:
    path: str
    label: str | None
    abort_all: bool
    future: cf.Future[str] = field(default_factory=cf.Future)


class HFPolicy:
    """A causal LM from a local model dir; `generate_async` from any event loop, `close` at end.

    Counters for tests and benches: `decode_steps` (batched forward passes of one token per
    row), `prefills`, `tokens` (sampled).
    """

    def __init__(self, model_dir: str | PathLike[str], *, threads: int | None = None) -> None:
        self.model_dir, self.model = load_causal_lm(model_dir)
        path = self.model_dir
        config = self.model.config
        self.tokenizer = HFTokenizer(
            AutoTokenizer.from_pretrained(path, local_files_only=True), config.vocab_size
        )
        self.eos_ids = frozenset(_eos_ids(path, config))
        self.context_length = int(getattr(config, "max_position_embeddings", 0) or 32768)
        self.name = path.name
        self.threads = threads or 1  # see the module docstring
        self.version = 0
        self.weight_version = "0"
        self.decode_steps = self.prefills = self.tokens = 0
        self._lock = threading.Condition()
        self._waiting: deque[_Request] = deque()
        self._loads: deque[_Load] = deque()
        self._aborts: list[str | None] = []  # rids; None: all
        self._running: list[_Request] = []
        self._cache: DynamicCache | None = None
        self._mask = torch.zeros(0, 0, dtype=torch.long)
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="hf-policy", daemon=True)
        self._thread.start()

    # -- the caller's side (any thread) -------------------------------------------------------

    async def generate_async(
        self, prompt: Sequence[int], sp: SamplingParams, top_n: int, rid: str, seed: int | None
    ) -> Generation:
        """One generation, queued for the scheduler thread (`weight_version` set)."""
        if not prompt:
            raise ValueError("the prompt must hold at least one token")
        self.tokenizer.check_ids(prompt, "input_ids entry")
        self.tokenizer.check_ids(sp.stop_token_ids, "stop_token_ids entry")
        stops = frozenset(sp.stop_token_ids) | (frozenset() if sp.ignore_eos else self.eos_ids)
        rng = np.random.default_rng(seed)
        request = _Request(list(prompt), sp, top_n, rid, rng, stops)
        request.out.finish_reason = {"type": "length", "length": sp.max_new_tokens}
        self._put(lambda: self._waiting.append(request))
        try:
            return await asyncio.shield(asyncio.wrap_future(request.future))
        except asyncio.CancelledError:  # the client went away: free its batch row
            self._put(lambda: self._aborts.append(rid))
            raise

    def abort(self, rid: str | None) -> None:
        """End the generation(s) with this rid (None: all) before the next decode step; each
        answers with the tokens sampled so far and finish_reason {"type": "abort"}."""
        self._put(lambda: self._aborts.append(rid))

    def submit_load(
        self, path: str | PathLike[str], weight_version: str | None = None, abort_all: bool = False
    ) -> cf.Future[str]:
        """Load a model dir's safetensors once the batch is empty; resolves to the new version."""
        load = _Load(str(path), weight_version, abort_all)
        self._put(lambda: self._loads.append(load))
        return load.future

    def close(self) -> None:
        self._put(lambda: setattr(self, "_closed", True))
        self._thread.join()

    def _put(self, change: Any) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("the policy is closed")
            change()
            self._lock.notify()

    # -- the scheduler thread -----------------------------------------------------------------

    def _loop(self) -> None:
        # The thread count is set in this thread: OpenMP's settings are per thread, and a pool
        # left at the main thread's size measured 5x slower here on 2 shared cores.
        torch.set_num_threads(self.threads)
        with torch.inference_mode():
            while True:
                with self._lock:
                    while not (self._closed or self._waiting or self._loads or self._aborts):
                        if self._running:
                            break
                        self._lock.wait()
                    if self._closed:
                        break
                    aborts, self._aborts = self._aborts, []
                try:
                    self._step(aborts)
                except Exception as exc:  # a failed forward fails its batch, not the server
                    for request in self._running:
                        if not request.future.done():
                            request.future.set_exception(exc)
                    self._running, self._cache = [], None
        error = RuntimeError("the policy was closed")
        for request in [*self._running, *self._waiting]:
            if not request.future.done():
                request.future.set_exception(error)
        for load in self._loads:
            load.future.set_exception(error)

    def _step(self, aborts: list[str | None]) -> None:
        with self._lock:
            abort_all = None in aborts or any(load.abort_all for load in self._loads)
            for request in [*self._running, *self._waiting]:
                if abort_all or request.rid in aborts:
                    request.aborted = True
            for request in [r for r in self._waiting if r.aborted]:
                self._waiting.remove(request)
                self._finish(request, ABORTED)
        if any(r.aborted for r in self._running):
            self._retire([r for r in self._running if r.aborted], ABORTED)
        if self._loads:
            if not self._running:
                with self._lock:
                    load = self._loads.popleft()
                self._apply(load)
            else:
                self._decode()  # drain the batch first; new requests wait behind the load
            return
        admitted = []
        with self._lock:
            while self._waiting and len(self._running) + len(admitted) < MAX_BATCH:
                admitted.append(self._waiting.popleft())
        for request in admitted:
            self._prefill(request)
        if self._running:
            self._decode()

    def _prefill(self, request: _Request) -> None:
        request.out.weight_version = self.weight_version
        if request.sp.max_new_tokens == 0:
            self._finish(request, request.out.finish_reason)
            return
        cache = DynamicCache()
        cache.layer_class_to_replicate = _GrowingLayer  # its layers are made on first use
        ids = torch.tensor([request.prompt])
        logits = self.model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        self.prefills += 1
        request.position = len(request.prompt)
        if self._sample([request], logits.logits[:, -1]):
            return
        self._join(request, cache)

    def _join(self, request: _Request, cache: DynamicCache) -> None:
        """Add a prefilled row to the batch: both caches left-padded to one width."""
        length = request.position
        if self._cache is None or not self._running:
            self._cache, self._mask = cache, torch.ones(1, length, dtype=torch.long)
        else:
            width = max(self._mask.shape[1], length)
            for old, new in zip(self._cache.layers, cache.layers, strict=True):
                old.keys = torch.cat([_left_pad(old.keys, width), _left_pad(new.keys, width)])
                old.values = torch.cat([_left_pad(old.values, width), _left_pad(new.values, width)])
            row = torch.ones(1, length, dtype=torch.long)
            self._mask = torch.cat([_left_pad(self._mask, width), _left_pad(row, width)])
        self._running.append(request)

    def _decode(self) -> None:
        batch = self._running
        ids = torch.tensor([[r.out.output_ids[-1]] for r in batch])
        positions = torch.tensor([[r.position] for r in batch])
        self._mask = torch.cat([self._mask, torch.ones(len(batch), 1, dtype=torch.long)], dim=1)
        logits = self.model(
            input_ids=ids,
            attention_mask=self._mask,
            position_ids=positions,
            past_key_values=self._cache,
            use_cache=True,
        ).logits[:, -1]
        self.decode_steps += 1
        for request in batch:
            request.position += 1
        if done := self._sample(batch, logits):
            self._retire(done, None)

    def _sample(self, batch: list[_Request], logits: torch.Tensor) -> list[_Request]:
        """Draw each row's next token into its `out`; the requests now done (and answered)."""
        tokens, logprobs, tops = _draw_rows(batch, logits)
        done = []
        for i, request in enumerate(batch):
            out = request.out
            out.output_ids.append(tokens[i])
            out.logprobs.append(logprobs[i])
            if request.top_n:
                out.top_logprobs.append(tops[i])
            self.tokens += 1
            if self._ended(request):
                done.append(request)
        return done

    def _ended(self, request: _Request) -> bool:
        """Answer the request if its last token ends it (stop id or string, length, context)."""
        sp, out = request.sp, request.out
        token = out.output_ids[-1]
        if token in request.stop_ids:
            self._finish(request, {"type": "stop", "matched": token})
        elif sp.stop and (hit := self._stop_string(out.output_ids, sp)) is not None:
            self._finish(request, {"type": "stop", "matched": hit[1]}, cut=hit[0])
        elif len(out.output_ids) >= sp.max_new_tokens:
            self._finish(request, out.finish_reason)
        elif request.position >= self.context_length:
            self._finish(request, {"type": "length", "length": len(out.output_ids)})
        else:
            return False
        return True

    def _stop_string(self, ids: list[int], sp: SamplingParams) -> tuple[int, str] | None:
        text = self.tokenizer.decode(ids, sp.skip_special_tokens)
        hits = [(i, stop) for stop in sp.stop if (i := text.find(stop)) >= 0]
        return min(hits) if hits else None

    def _retire(self, done: list[_Request], reason: dict[str, Any] | None) -> None:
        keep = [i for i, r in enumerate(self._running) if r not in done]
        self._running = [self._running[i] for i in keep]
        for request in done:
            if reason is not None:
                self._finish(request, reason)
        if not keep or self._cache is None:
            self._cache = None
            return
        index = torch.tensor(keep)
        mask = self._mask[index]
        first = int(mask.any(dim=0).nonzero()[0])  # columns that are padding in every row go
        self._mask = mask[:, first:]
        for layer in self._cache.layers:
            layer.keys = layer.keys[index, :, first:]
            layer.values = layer.values[index, :, first:]

    def _finish(self, request: _Request, reason: Mapping[str, Any], cut: int = -1) -> None:
        out, sp = request.out, request.sp
        out.finish_reason = dict(reason)
        if out.weight_version is None:
            out.weight_version = self.weight_version
        shown = out.output_ids
        if reason.get("type") == "stop" and isinstance(reason.get("matched"), int):
            shown = shown if sp.no_stop_trim else shown[:-1]
        out.text = self.tokenizer.decode(shown, sp.skip_special_tokens)
        if cut >= 0 and not sp.no_stop_trim:
            out.text = out.text[:cut]
        if request.future.set_running_or_notify_cancel():
            request.future.set_result(out)

    def _apply(self, load: _Load) -> None:
        if not load.future.set_running_or_notify_cancel():
            return
        try:
            _load_weights(self.model, Path(load.path))
        except ValueError as exc:
            load.future.set_exception(exc)
            return
        self.version += 1
        self.weight_version = load.label or str(self.version)
        load.future.set_result(self.weight_version)


def _draw_rows(
    batch: Sequence[_Request], logits: torch.Tensor
) -> tuple[list[int], list[float], list[list[tuple[int, float]]]]:
    """Each row's token, its log-prob and top log-probs, from the batch's last-position logits.

    Rows without truncation (no top-k, top-p or min-p: the common RL setting) and greedy rows
    are done together in torch, as float64: `log_softmax(logits / temperature)` (greedy:
    temperature 1, drawn by argmax), then the inverse-CDF draw of `sampling.draw` with the row's
    own uniform number, so a row's token does not depend on its batch-mates. This is
    `sampling_logprobs` on its plain path, done for the whole batch at once (numpy per row over
    a 49k vocabulary cost more than a decode step's attention); rows that truncate go through
    `sampling_logprobs` and `draw` themselves."""
    rows = logits.double()
    plain = [
        i
        for i, r in enumerate(batch)
        if r.sp.greedy or (r.sp.top_k == -1 and r.sp.top_p >= 1.0 and r.sp.min_p == 0.0)
    ]
    tokens, values = [0] * len(batch), [0.0] * len(batch)
    logprobs = torch.empty_like(rows)
    if plain:
        index = torch.tensor(plain)
        temps = [1.0 if batch[i].sp.greedy else batch[i].sp.temperature for i in plain]
        scaled = torch.log_softmax(rows[index] / torch.tensor(temps, dtype=rows.dtype)[:, None], -1)
        logprobs[index] = scaled
        cdf = torch.cumsum(torch.exp(scaled), dim=-1)
        u = torch.tensor([batch[i].rng.random() if not batch[i].sp.greedy else 0.0 for i in plain])
        drawn = torch.searchsorted(cdf, (u.to(cdf.dtype) * cdf[:, -1])[:, None], right=True)
        drawn = drawn[:, 0].clamp(max=cdf.shape[-1] - 1)
        greedy = torch.tensor([batch[i].sp.greedy for i in plain])
        chosen = torch.where(greedy, scaled.argmax(dim=-1), drawn)
        picked = scaled.gather(1, chosen[:, None])[:, 0]
        for j, i in enumerate(plain):
            tokens[i], values[i] = int(chosen[j]), float(picked[j])
    for i in sorted(set(range(len(batch))) - set(plain)):
        sp, rng = batch[i].sp, batch[i].rng
        row = sampling_logprobs(rows[i].numpy(), sp)
        tokens[i] = draw(row, sp, rng)
        values[i] = float(row[tokens[i]])
        logprobs[i] = torch.from_numpy(row)
    tops: list[list[tuple[int, float]]] = [[] for _ in batch]
    for i, request in enumerate(batch):
        if request.top_n:
            best = torch.topk(logprobs[i], min(request.top_n, logprobs.shape[-1]))
            pairs = zip(best.indices.tolist(), best.values.tolist(), strict=True)
            tops[i] = [(t, v) for t, v in pairs if v > float("-inf")]
    return tokens, values, tops


class _GrowingLayer(DynamicLayer):
    """A KV cache layer whose keys and values are views of a buffer with spare columns, so a
    decode step writes its column in place instead of copying the whole cache (DynamicLayer's
    torch.cat, a copy per layer per step that grows with the context). When the scheduler
    replaces keys/values (a row joins or leaves), the next update copies them into a new
    buffer once."""

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        length = self.keys.shape[-2] if self.keys.numel() else 0
        end = length + key_states.shape[-2]
        buffers = getattr(self, "_buffers", None)
        if (
            buffers is None
            or buffers[0].shape[:2] != key_states.shape[:2]
            or end > buffers[0].shape[-2]
            or self.keys.data_ptr() != buffers[0].data_ptr()
            or self.values.data_ptr() != buffers[1].data_ptr()
        ):
            capacity = end + max(64, end // 2)
            buffers = tuple(
                x.new_empty((*x.shape[:2], capacity, x.shape[-1]))
                for x in (key_states, value_states)
            )
            if length:
                buffers[0][:, :, :length] = self.keys
                buffers[1][:, :, :length] = self.values
            self._buffers = buffers
        buffers[0][:, :, length:end] = key_states
        buffers[1][:, :, length:end] = value_states
        self.keys, self.values = buffers[0][:, :, :end], buffers[1][:, :, :end]
        return self.keys, self.values


def _left_pad(x: torch.Tensor, width: int) -> torch.Tensor:
    """Pad dim -2 of a cache tensor (or dim -1 of a 2-D mask) on the left to `width`."""
    if x.dim() == 2:
        return torch.nn.functional.pad(x, (width - x.shape[1], 0))
    return torch.nn.functional.pad(x, (0, 0, width - x.shape[-2], 0))


def _eos_ids(path: Path, config: Any) -> set[int]:
    """The end-of-turn ids: generation_config.json's eos_token_id (an id or a list), else the
    model config's."""
    try:
        eos = GenerationConfig.from_pretrained(path, local_files_only=True).eos_token_id
    except OSError:
        eos = None
    eos = config.eos_token_id if eos is None else eos
    return set() if eos is None else {eos} if isinstance(eos, int) else set(eos)


def _load_weights(model: torch.nn.Module, path: Path) -> None:
    """Copy a model dir's safetensors into `model`, checked first so a bad dir changes nothing.
    A tied output embedding may be absent from the files (it shares the input's tensor)."""
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else []
    if not files:
        raise ValueError(f"no *.safetensors files in {path!s}")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(file))
    own = model.state_dict()
    tied = {"lm_head.weight"} if model.config.tie_word_embeddings else set()
    missing = set(own) - set(state) - tied
    unknown = set(state) - set(own)
    wrong = [k for k in state.keys() & own.keys() if state[k].shape != own[k].shape]
    if missing or unknown or wrong:
        raise ValueError(
            f"{path!s} does not fit the model: missing {sorted(missing)[:3]}, "
            f"unexpected {sorted(unknown)[:3]}, wrong shapes {sorted(wrong)[:3]}"
        )
    with torch.no_grad():
        for key, value in state.items():
            own[key].copy_(value)
