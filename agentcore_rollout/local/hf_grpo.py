"""GRPO on a Hugging Face causal LM in torch on CPU: `grpo.grpo_update`'s objective, token for
token, then one AdamW step; a full fine-tune (LoRA would save memory, not the passes that
dominate a step, and each push still needs the whole weights on disk).

Exactness: `logp_now` must be the log-prob of the distribution the server drew from, so the
logits are cast to float64 and put through the server's own transform (`sampling_logprobs`), the
kept set taken from it without gradient. Greedy samples are refused: theirs is no sampling
probability. torch and transformers are imported here only."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from os import PathLike
from pathlib import Path

import numpy as np
import torch

from ..training import TrainingSample
from .grpo import UpdateStats, UpdateTally
from .policy.hf import load_causal_lm
from .policy.sampling import SamplingParams, sampling_logprobs

_WEIGHT_FILES = ("*.safetensors", "*.safetensors.index.json", "config.json")
OPTIMIZER = "optimizer.pt"  # the AdamW state, beside the weights it goes with
MAX_GRAD_NORM = 1.0
# One thread: on 2 cores shared with the policy workers (load average 5-6), SmolLM2's forward
# + backward of a 58-token sample took 1.8 s on one thread and 6-28 s on two.
THREADS = 1


class HFLearner:
    """The trainer's copy of a model dir's weights, its AdamW state, and `update` / `save`."""

    def __init__(
        self,
        model_dir: str | PathLike[str],
        *,
        lr: float,
        clip: float = 0.2,
        sampling: SamplingParams | None = None,
    ) -> None:
        sampling = sampling or SamplingParams()
        if sampling.greedy:
            raise ValueError(
                "greedy samples report log_softmax of the raw logits, not the probability they "
                "were drawn with: train on samples drawn at temperature > 0"
            )
        self.model_dir, self.model = load_causal_lm(model_dir)
        self.sampling = sampling
        self.clip = clip
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.0)

    def token_logprobs(self, sample: TrainingSample) -> torch.Tensor:
        """The current weights' log-prob (float64, differentiable) of each sampled token of
        `sample`, in order, under the sampling transform the server used."""
        positions = [t for t, m in enumerate(sample.loss_mask) if m]
        if not positions:
            return torch.zeros(0, dtype=torch.float64)
        if not sample.prompt_ids:
            raise ValueError(f"request {sample.request_id}: a sample needs a prompt")
        ids = [*sample.prompt_ids, *sample.response_ids[: positions[-1]]]
        # the logits that predicted response token t sit at position len(prompt) - 1 + t
        keep = torch.tensor([len(sample.prompt_ids) - 1 + t for t in positions])
        logits = self.model(input_ids=torch.tensor([ids]), logits_to_keep=keep).logits[0]
        tokens = torch.tensor([sample.response_ids[t] for t in positions])
        return _transform(logits.double(), tokens, self.sampling)

    def update(self, samples: Sequence[TrainingSample], *, weight_version: str) -> UpdateStats:
        """One AdamW step of the clipped objective over `samples` (gradients accumulated a
        sample at a time, so memory holds one sequence's activations). `weight_version` labels
        the weights held now: samples all of whose turns it sampled are on-policy."""
        torch.set_num_threads(THREADS)  # per thread: the caller may be a worker thread
        tokens = sum(sum(s.loss_mask) for s in samples)
        tally = UpdateTally()
        self.optimizer.zero_grad(set_to_none=True)
        for sample in samples:
            tally.on_policy += (fresh := sample.on_policy(weight_version))
            now = self.token_logprobs(sample)
            if not len(now):
                continue
            behaviour = torch.tensor(
                [lp for lp, m in zip(sample.logprobs, sample.loss_mask, strict=True) if m],
                dtype=torch.float64,
            )
            ratio = torch.exp(now - behaviour)
            a = sample.advantage
            surrogate = torch.minimum(ratio * a, ratio.clamp(1 - self.clip, 1 + self.clip) * a)
            (-surrogate.sum() / tokens).backward()
            diff = float((now.detach() - behaviour).abs().max()) if fresh else None
            tally.add_run(ratio.detach().numpy(), a, self.clip, diff)
        grad_norm = 0.0
        if tokens:
            params = [p for p in self.model.parameters() if p.grad is not None]
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, MAX_GRAD_NORM))
            self.optimizer.step()
        return tally.stats(len(samples), grad_norm)

    def load_optimizer(self) -> None:
        """Take the AdamW state `save` wrote beside the weights this learner started from."""
        state = torch.load(self.model_dir / OPTIMIZER, weights_only=True)
        self.optimizer.load_state_dict(state)

    def save(self, out: str | PathLike[str]) -> Path:
        """Write the weights as a model dir at `out` (safetensors, config, and the source dir's
        tokenizer files, so it also serves as `local.policy`): what HFPolicy's
        `/update_weights_from_disk` loads. Written beside it and renamed into place, so a
        worker never reads half a file."""
        target = Path(out).resolve()
        work = target.with_name(f".{target.name}.tmp")
        shutil.rmtree(work, ignore_errors=True)
        self.model.save_pretrained(work, safe_serialization=True)
        torch.save(self.optimizer.state_dict(), work / OPTIMIZER)  # for `train --resume`
        weights = {p for pattern in _WEIGHT_FILES for p in self.model_dir.glob(pattern)}
        for file in self.model_dir.iterdir():
            if file.is_file() and file not in weights and not (work / file.name).exists():
                shutil.copy(file, work / file.name)
        shutil.rmtree(target, ignore_errors=True)
        work.rename(target)
        return target


def _transform(logits: torch.Tensor, tokens: torch.Tensor, sp: SamplingParams) -> torch.Tensor:
    """log p(token) per row of float64 `logits` under `sampling_logprobs`' transform."""
    scaled = torch.log_softmax(logits / sp.temperature, dim=-1)
    picked = scaled.gather(1, tokens[:, None])[:, 0]
    if sp.top_k == -1 and sp.top_p >= 1.0 and sp.min_p == 0.0:
        return picked
    rows = logits.detach().numpy()
    kept = torch.from_numpy(np.stack([np.isfinite(sampling_logprobs(r, sp)) for r in rows]))
    norm = torch.logsumexp(scaled.masked_fill(~kept, -torch.inf), dim=-1)
    inside = kept.gather(1, tokens[:, None])[:, 0]
    return torch.where(inside, picked - norm, torch.full_like(picked, -torch.inf))
