"""Resumed turns: a generation the backend aborted (a weight update) goes on where it stopped, and
the agent never knows.

Answering 503 would end the rollout and lose its work, so the gateway keeps the tokens sampled so
far and asks again for the prompt plus those tokens, each token keeping the log-prob and weight
version that sampled it. The continuation's request, the waits, the give-ups and stop strings
across the seam: docs/gateway.md#weight-updates-lose-no-turns."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .backends import Backend, BackendError, Completion, TurnRequest
from .trajectory import VersionRuns, add_run


@dataclass(frozen=True)
class ResumePolicy:
    """How long an aborted turn may wait for its backend, and how often it may be aborted
    without progress, before it ends with a 503."""

    max_idle_aborts: int = 3
    max_wait: float = 300.0
    first_backoff: float = 0.05
    max_backoff: float = 2.0


def continuation_seed(seed: int, sampled: int) -> int:
    """The seed of a continuation after `sampled` tokens: fixed by the turn's seed (so a seeded
    turn is reproducible) and different from it (so the draws are not the first call's again)."""
    digest = hashlib.blake2b(f"{seed}:{sampled}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") >> 1


async def complete(
    backend: Backend,
    request: TurnRequest,
    policy: ResumePolicy,
    *,
    decode: Callable[[Sequence[int]], str] | None = None,
    live: Callable[[], bool] = lambda: True,
) -> Completion:
    """The backend's completion of `request`, resumed after every abort (see the module)."""
    first = await backend.complete(request)
    if first.output_ids is None or first.logprobs is None:
        return first  # a pass-through backend: nothing to resume
    out = _Output(first)
    last, idle = first, 0
    deadline = time.monotonic() + policy.max_wait
    while last.finish_reason == "abort":
        if request.json_schema is not None:
            raise BackendError(
                "the backend aborted a turn constrained by response_format, which cannot be "
                "resumed",
                503,
            )
        idle = 0 if last.output_ids else idle + 1
        if idle > policy.max_idle_aborts:
            raise BackendError(
                f"the backend aborted this turn {idle} times in a row without a new token", 503
            )
        limit = request.sampling.get("max_tokens")
        if limit is not None and len(out.ids) >= limit:
            last = dataclasses.replace(last, finish_reason="length")
            break
        if idle:
            await _wait(policy.first_backoff * 2 ** (idle - 1), policy, deadline, live, None)
        seam = len(out.ids)
        last = await _call(backend, _continuation(request, out, limit), policy, deadline, live)
        out.add(last)
        stops = request.sampling.get("stop")
        if stops and decode is not None:
            hit = stop_cut(out.ids, [stops] if isinstance(stops, str) else stops, seam, decode)
            if hit is not None:
                out.cut(hit[0])
                last = dataclasses.replace(last, finish_reason="stop", stop_sequence=hit[1])
    return out.completion(last)


def stop_cut(
    ids: Sequence[int], stops: Sequence[str], seam: int, decode: Callable[[Sequence[int]], str]
) -> tuple[int, str] | None:
    """(n, stop): the fewest tokens, more than `seam`, whose text holds a stop string, and the
    string (the one whose first match ends first); None if the text holds none."""
    text = decode(ids)
    hits = [(i + len(s), s) for s in stops if (i := text.find(s)) >= 0]
    if not hits:
        return None
    stop = min(hits)[1]
    low, high = seam + 1, len(ids)  # a prefix's text only grows with it: bisect
    while low < high:
        middle = (low + high) // 2
        if stop in decode(ids[:middle]):
            high = middle
        else:
            low = middle + 1
    return low, stop


class _Output:
    """The tokens of a turn's calls so far, with their log-probs and versions."""

    def __init__(self, first: Completion) -> None:
        self.first = first
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.tops: list[list[tuple[int, float]]] | None = [] if first.top_logprobs else None
        self.runs: VersionRuns = []
        self.calls = 0
        self.add(first)

    def add(self, part: Completion) -> None:
        ids, logprobs = part.output_ids or [], part.logprobs or []
        if len(ids) != len(logprobs):
            raise BackendError("the backend returned a log-prob count unlike its token count")
        self.ids += ids
        self.logprobs += logprobs
        if self.tops is not None:
            self.tops = self.tops + part.top_logprobs if part.top_logprobs is not None else None
        add_run(self.runs, part.weight_version, len(ids))
        self.calls += 1

    def cut(self, n: int) -> None:
        del self.ids[n:], self.logprobs[n:]
        if self.tops is not None:
            del self.tops[n:]
        runs: VersionRuns = []
        for version, count in self.runs:
            add_run(runs, version, min(count, n - sum(c for _, c in runs)))
        self.runs = runs

    def completion(self, last: Completion) -> Completion:
        if self.calls == 1:
            return dataclasses.replace(last, version_runs=self.runs)
        return dataclasses.replace(
            last,
            output_ids=self.ids,
            logprobs=self.logprobs,
            top_logprobs=self.tops,
            prompt_tokens=self.first.prompt_tokens,
            completion_tokens=len(self.ids),
            version_runs=self.runs,
            resumed=self.calls - 1,
        )


def _continuation(request: TurnRequest, out: _Output, limit: int | None) -> TurnRequest:
    sampling = dict(request.sampling)
    if limit is not None:
        sampling["max_tokens"] = limit - len(out.ids)
    if sampling.get("seed") is not None:
        sampling["seed"] = continuation_seed(sampling["seed"], len(out.ids))
    assert request.prompt_ids is not None  # a token backend answered: the prompt was rendered
    return dataclasses.replace(
        request,
        prompt_ids=request.prompt_ids + out.ids,
        sampling=sampling,
        rid=f"{request.rid}.{out.calls}",
    )


async def _call(
    backend: Backend,
    request: TurnRequest,
    policy: ResumePolicy,
    deadline: float,
    live: Callable[[], bool],
) -> Completion:
    """One continuation call, retried with backoff while the backend is away (retryable)."""
    backoff = policy.first_backoff
    while True:
        try:
            return await backend.complete(request)
        except BackendError as exc:
            if not exc.retryable:
                raise
            await _wait(backoff, policy, deadline, live, exc)
            backoff = min(backoff * 2, policy.max_backoff)


async def _wait(
    delay: float,
    policy: ResumePolicy,
    deadline: float,
    live: Callable[[], bool],
    cause: BackendError | None,
) -> None:
    delay = min(delay, policy.max_backoff)
    if not live():
        raise BackendError("the session ended while its aborted turn waited to resume", 503)
    if time.monotonic() + delay > deadline:
        why = f": {cause}" if cause else ""
        raise BackendError(
            f"an aborted turn could not be resumed within {policy.max_wait:g}s{why}", 503
        )
    await asyncio.sleep(delay)
