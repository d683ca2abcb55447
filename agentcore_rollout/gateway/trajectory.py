"""Trajectory assembly: one session's turns become training samples with exact token ids.

The merge rule (an exact token-prefix test, never spliced) and the trace's JSON shape:
docs/gateway.md#traces. Tokens are never "healed": every sample is exactly a sequence the policy
was conditioned on and sampled from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

VersionRuns = list[tuple[str | None, int]]


def add_run(runs: VersionRuns, version: str | None, count: int) -> None:
    """Append `count` tokens sampled by `version` to `runs`, merging with the last run."""
    if count <= 0:
        return
    if runs and runs[-1][0] == version:
        runs[-1] = (version, runs[-1][1] + count)
    else:
        runs.append((version, count))


def version_bounds(runs: VersionRuns) -> dict[str, str | None]:
    """`min_weight_version` and `max_weight_version` of `runs` (None ignored): numeric if all
    are integers, else the first and the last seen; None without any."""
    seen = [v for v, _ in runs if v is not None]
    low = high = None
    if seen:
        try:
            numbers = [int(v) for v in seen]
        except ValueError:
            low, high = seen[0], seen[-1]
        else:
            low, high = seen[numbers.index(min(numbers))], seen[numbers.index(max(numbers))]
    return {"min_weight_version": low, "max_weight_version": high}


# How a turn's prompt was rendered: reusing an earlier render's ids of the session, or of
# another session (a shared system prompt and tools), fully although the session had earlier
# renders (none of which it extends), or fully with nothing to extend.
RENDER_KINDS = ("incremental", "shared", "fallback", "full")


@dataclass
class Turn:
    """One chat completion. `output_ids`/`logprobs` are None when the backend does not capture
    tokens (pass-through evaluation)."""

    index: int
    rid: str
    prompt_ids: list[int] | None
    output_ids: list[int] | None
    logprobs: list[float] | None
    finish_reason: str  # stop | length | tool_calls
    ill_formed: bool = False
    error: str | None = None
    weight_version: str | None = None
    context_limited: bool = False  # the prompt alone reached the session's max_context
    latency: float = 0.0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    sample: int | None = None  # index of the sample this turn went into
    render: str | None = None  # one of RENDER_KINDS; None without a renderer (pass-through)
    reused_prompt_tokens: int = 0  # prompt ids taken from an earlier render (shared too)
    version_runs: VersionRuns | None = None  # per output token, the version that sampled it
    resumed: int = 0  # times the gateway continued it after the backend aborted it
    ignored: list[str] = field(default_factory=list)  # request fields accepted with no effect
    delivered: bool = True  # False: the agent never got the reply (`pipeline.undelivered`)

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "rid": self.rid,
            "sample": self.sample,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "finish_reason": self.finish_reason,
            "truncated": self.truncated,
            "context_limited": self.context_limited,
            "ill_formed": self.ill_formed,
            "error": self.error,
            "weight_version": self.weight_version,
            "latency_s": round(self.latency, 6),
            "render": self.render,
            "reused_prompt_tokens": self.reused_prompt_tokens,
            "version_runs": self.version_runs,
            **version_bounds(self.version_runs or []),
            "resumed": self.resumed,
            "ignored": self.ignored,
            "delivered": self.delivered,
        }


@dataclass
class Sample:
    """One training sequence built from one or more merged turns."""

    index: int
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float | None] = field(default_factory=list)
    turns: list[int] = field(default_factory=list)
    truncated: bool = False
    ill_formed: bool = False
    finish_reason: str = "stop"
    weight_versions: list[str | None] = field(default_factory=list)
    version_runs: VersionRuns = field(default_factory=list)  # over response_ids; None unsampled
    resumed: int = 0

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    def extended_by(self, prompt: list[int]) -> bool:
        """True if `prompt` starts with this sample's full sequence (exact token prefix)."""
        n_prompt, n = len(self.prompt_ids), self.length
        return (
            len(prompt) >= n
            and prompt[:n_prompt] == self.prompt_ids
            and prompt[n_prompt:n] == self.response_ids
        )

    def append(self, turn: Turn, observation: list[int]) -> None:
        """Observation tokens (mask 0), then the turn's sampled tokens (mask 1)."""
        assert turn.output_ids is not None and turn.logprobs is not None
        self.response_ids += observation
        self.loss_mask += [0] * len(observation)
        self.logprobs += [None] * len(observation)
        add_run(self.version_runs, None, len(observation))
        self.response_ids += turn.output_ids
        self.loss_mask += [1] * len(turn.output_ids)
        self.logprobs += turn.logprobs
        for version, count in turn.version_runs or [(turn.weight_version, len(turn.output_ids))]:
            add_run(self.version_runs, version, count)
        self.turns.append(turn.index)
        self.weight_versions.append(turn.weight_version)
        self.resumed += turn.resumed
        self.mark(turn)

    def mark(self, turn: Turn) -> None:
        """Carry a turn's flags (truncated, ill-formed) and finish reason."""
        self.truncated |= turn.truncated
        self.ill_formed |= turn.ill_formed
        self.finish_reason = turn.finish_reason

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "turns": self.turns,
            "prompt_ids": self.prompt_ids,
            "response_ids": self.response_ids,
            "loss_mask": self.loss_mask,
            "logprobs": self.logprobs,
            "num_sampled": sum(self.loss_mask),
            "finish_reason": self.finish_reason,
            "truncated": self.truncated,
            "ill_formed": self.ill_formed,
            "weight_versions": self.weight_versions,
            "version_runs": self.version_runs,
            **version_bounds(self.version_runs),
            "resumed": self.resumed,
        }


class Trajectory:
    """The turns of one session and the samples they assemble into, in arrival order."""

    def __init__(self) -> None:
        self.turns: list[Turn] = []
        self.samples: list[Sample] = []

    def add(self, turn: Turn) -> Sample | None:
        """Record a finished turn; returns the sample it went into (None if it sampled nothing
        and extended nothing, or carried no token ids)."""
        self.turns.append(turn)
        if turn.prompt_ids is None or turn.output_ids is None or turn.logprobs is None:
            return None
        if len(turn.output_ids) != len(turn.logprobs):
            raise ValueError("a turn needs exactly one log-prob per sampled token")
        prompt = turn.prompt_ids
        sample = next((s for s in reversed(self.samples) if s.extended_by(prompt)), None)
        if not turn.output_ids:  # nothing sampled (context limit): flag, add no tokens
            if sample is not None:
                sample.mark(turn)
                turn.sample = sample.index
            return sample
        if sample is None:
            sample = Sample(index=len(self.samples), prompt_ids=list(prompt))
            self.samples.append(sample)
            sample.append(turn, [])
        else:
            sample.append(turn, prompt[sample.length :])
        turn.sample = sample.index
        return sample

    def to_json(self) -> dict[str, Any]:
        """Turns and samples; a sample is `delivered` when the agent got all of its turns."""
        undelivered = {t.index for t in self.turns if not t.delivered}
        samples = [
            {**s.to_json(), "delivered": undelivered.isdisjoint(s.turns)} for s in self.samples
        ]
        return {"turns": [t.to_json() for t in self.turns], "samples": samples}
