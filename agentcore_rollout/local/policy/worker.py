"""PolicyWorker: a policy server's work below its HTTP APIs: each generation run as its policy runs
it, weight loads and aborts between them, and what was sampled recorded.

The toy runs inline on the event loop, so a weight load can never interleave with a generation;
`token_delay` paces it so its generations are in flight to abort, as a real server's are (the
gateway's resume tests need that). `hf.HFPolicy` samples off the loop, in its scheduler thread."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import dataclasses
import uuid
from collections import deque
from typing import Any, Protocol

import numpy as np

from .model import Generation, TinyPolicy
from .sampling import SamplingParams

MODEL_NAME = "tiny-char-policy"
CONTEXT_LENGTH = 32768  # the toy's; a model's own, at most this
MAX_TOP_LOGPROBS = 20


class BatchedPolicy(Protocol):
    """What PolicyWorker calls on an engine that samples off the event loop (`hf.HFPolicy`)."""

    tokenizer: Any
    version: int
    weight_version: str
    context_length: int
    name: str

    async def generate_async(
        self, prompt: list[int], sp: SamplingParams, top_n: int, rid: str, seed: int | None
    ) -> Generation: ...

    def abort(self, rid: str | None) -> None: ...

    def submit_load(
        self, path: str, weight_version: str | None = None, abort_all: bool = False
    ) -> cf.Future[str]: ...

    def close(self) -> None: ...


@dataclasses.dataclass
class _Paced:
    """One toy generation in flight: its rid, and whether an abort asked it to end."""

    rid: str
    aborted: bool = False


class PolicyWorker:
    """One policy, the toy (`TinyPolicy`) or a `BatchedPolicy`, and its generations.

    `seed` seeds the toy's parameters (when no policy is given) and the sampling RNG; a
    request's own seed makes that request reproducible on its own. With `record=True` every
    generation is kept (the last `record_limit`) for exactness tests (`samples`).
    """

    def __init__(
        self,
        policy: TinyPolicy | BatchedPolicy | None = None,
        *,
        seed: int = 0,
        token_delay: float = 0.0,
        record: bool = False,
        record_limit: int = 10_000,
    ) -> None:
        self.policy = policy if policy is not None else TinyPolicy(seed)
        self.tokenizer = self.policy.tokenizer
        if isinstance(self.policy, TinyPolicy):
            self.model_name, self.context_length = MODEL_NAME, CONTEXT_LENGTH
        else:
            self.model_name = self.policy.name
            self.context_length = min(CONTEXT_LENGTH, self.policy.context_length)
        self.worker_id = ""  # its server's, once known
        self.token_delay = token_delay
        self.record = record
        self.samples: deque[dict[str, Any]] = deque(maxlen=record_limit)
        self.recorded = 0  # since the last clear, the dropped ones included
        self._rng = np.random.default_rng(seed)
        self._paced: list[_Paced] = []  # the toy's generations in flight
        self._loads_waiting = 0
        self._pacing = asyncio.Condition()

    def check_context(self, prompt_len: int, max_new_tokens: int) -> None:
        if prompt_len >= self.context_length:
            raise ValueError(
                f"the prompt ({prompt_len} tokens) is longer than the context length "
                f"({self.context_length} tokens)"
            )
        if prompt_len + max_new_tokens > self.context_length:
            raise ValueError(
                f"{prompt_len} prompt tokens + max_new_tokens {max_new_tokens} exceed the "
                f"context length ({self.context_length} tokens)"
            )

    async def generate(
        self, prompt: list[int], sp: SamplingParams, top_n: int, rid: str, endpoint: str
    ) -> Generation:
        """One generation, recorded (with the endpoint that asked for it) when recording."""
        self.tokenizer.check_ids(sp.stop_token_ids, "stop_token_ids entry")
        if isinstance(self.policy, TinyPolicy):
            gen = await self._toy(self.policy, prompt, sp, top_n, rid)
        else:
            seed = int(self._rng.integers(2**63)) if sp.seed is None else sp.seed
            gen = await self.policy.generate_async(prompt, sp, top_n, rid, seed)
        if self.record:
            self.recorded += 1
            self.samples.append(
                {
                    "rid": rid,
                    "worker_id": self.worker_id,
                    "endpoint": endpoint,
                    "weight_version": gen.weight_version,
                    "input_ids": prompt,
                    "output_ids": gen.output_ids,
                    "output_logprobs": gen.logprobs,
                    "finish_reason": gen.finish_reason,
                    "sampling_params": dataclasses.asdict(sp),
                }
            )
        return gen

    async def _toy(
        self, policy: TinyPolicy, prompt: list[int], sp: SamplingParams, top_n: int, rid: str
    ) -> Generation:
        """The toy's generation, abortable between tokens when paced (without `token_delay`
        nothing awaits, so it runs whole); it starts only when no weight load waits, so it is
        sampled from one version."""
        rng = self._rng if sp.seed is None else np.random.default_rng(sp.seed)
        paced = _Paced(rid)
        async with self._pacing:
            await self._pacing.wait_for(lambda: not self._loads_waiting)
            self._paced.append(paced)
        reason = {"type": "length", "length": sp.max_new_tokens}
        gen = Generation([], [], "", reason, weight_version=policy.weight_version)
        try:
            for _ in policy.decode(prompt, sp, rng, top_n, gen):
                if self.token_delay:
                    await asyncio.sleep(self.token_delay)
                if paced.aborted:
                    gen.finish_reason = {"type": "abort", "message": "aborted"}
                    break
        finally:
            async with self._pacing:
                self._paced.remove(paced)
                self._pacing.notify_all()
        return gen

    async def load(self, path: str, label: str | None, abort_all: bool) -> None:
        """Weights from `path` (the toy's .npz, a model's directory), labelled `label`, once
        the generations in flight ended (aborted first with `abort_all`); ValueError if unusable."""
        if not isinstance(self.policy, TinyPolicy):  # the scheduler thread's, once drained
            await asyncio.wrap_future(self.policy.submit_load(path, label, abort_all))
            return
        async with self._pacing:
            self._loads_waiting += 1
            try:
                for paced in self._paced if abort_all else ():
                    paced.aborted = True
                await self._pacing.wait_for(lambda: not self._paced)
                self.policy.load(path, label)
            finally:
                self._loads_waiting -= 1
                self._pacing.notify_all()

    def abort(self, rid: str | None) -> None:
        """End the generation(s) with this rid (None: all) with the tokens so far."""
        if not isinstance(self.policy, TinyPolicy):
            self.policy.abort(rid)
        for paced in self._paced:
            paced.aborted |= rid is None or paced.rid == rid

    async def check_health(self) -> None:
        """One greedy token, not recorded."""
        sp = SamplingParams(temperature=0.0, max_new_tokens=1)
        if isinstance(self.policy, TinyPolicy):
            self.policy.generate([0], sp, self._rng)
        else:
            await self.policy.generate_async([0], sp, 0, "health_generate", 0)

    async def close(self) -> None:
        if not isinstance(self.policy, TinyPolicy):
            await asyncio.to_thread(self.policy.close)


def top_n(value: Any, name: str) -> int:
    """How many top log-probs a request asks for, at most MAX_TOP_LOGPROBS."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOP_LOGPROBS:
        raise ValueError(f"{name} must be an integer in [0, {MAX_TOP_LOGPROBS}]")
    return value


def request_id(value: Any) -> str:
    """A request's rid, one made up when it gives none."""
    if value is None:
        return uuid.uuid4().hex
    if not isinstance(value, str):
        raise ValueError("rid must be a string")
    return value
