"""One turn, whatever API asked for it: render it to ids, sample them through a backend that
returns ids and log-probs, parse the sampled ids into an assistant message, and record the turn.

Limits end a turn the way agent loops stop on, an empty `length` answer, never a retryable error.
The backend call is not streamed: a turn must be whole to parse its tool calls and record it
atomically."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ._limits import in_pool
from .backends import Backend, Completion
from .prefixes import SharedPrefixes
from .render import (
    IncrementalRenderer,
    Parsed,
    Rendered,
    Renderer,
    RenderState,
    TextRenderer,
    fold_system_messages,
    places_system_anywhere,
)
from .resume import ResumePolicy, complete
from .sessions import Session
from .trajectory import RENDER_KINDS, Turn
from .turns import ChatTurn, ToolChoice, TurnAnswer, TurnRequest


class TurnPipeline:
    """Answers the turns of every session with `backend` (and `renderer`, which token-capture
    backends need), resuming aborted ones under `resume`, and counts what /admin/stats reports:
    how prompts were rendered, the prompt tokens reused and encoded, the fields ignored."""

    def __init__(self, backend: Backend, renderer: Renderer | None, resume: ResumePolicy) -> None:
        self.backend = backend
        self.renderer = renderer
        self.resume = resume
        # An isinstance check against a Protocol is slow: decided once, not per turn.
        self._incremental = renderer if isinstance(renderer, IncrementalRenderer) else None
        self.prefixes = SharedPrefixes[RenderState]()  # full encodes any first turn may reuse
        self.render_counts = dict.fromkeys(RENDER_KINDS, 0)
        self.prompt_tokens = {"reused": 0, "encoded": 0}
        self.ignored_fields: Counter[str] = Counter()  # per field name, the turns that sent it
        self.undelivered_turns = 0  # recorded turns whose reply the agent did not get
        self.counted_prompts = 0  # count_tokens requests answered
        # Whether the template renders a system message past the first (Claude Code sends them
        # mid-conversation): if it drops or refuses one, its text joins a user turn (below).
        self._system_anywhere = renderer is None or places_system_anywhere(renderer)

    def stats(self) -> dict[str, Any]:
        return {
            "turns": sum(self.render_counts.values()),
            "render": dict(self.render_counts),
            "prompt_tokens": dict(self.prompt_tokens),
            "ignored_fields": dict(self.ignored_fields),
            "undelivered_turns": self.undelivered_turns,
            "count_tokens": self.counted_prompts,
        }

    async def answer(
        self, session: Session, turn: ChatTurn, pool: ThreadPoolExecutor | None = None
    ) -> TurnAnswer:
        """Render, sample, parse and record one turn of `session`. Past the session's turn
        limit the turn ends at once as `length` (what agent loops stop on), unrecorded."""
        self._place_system(turn)
        self.ignored_fields.update(turn.ignored)
        # Render before reserving a turn: a malformed request is a 400 and costs no turn.
        prompt_ids, render, reused = await self._render(session, turn.messages, turn.tools, pool)
        index = session.begin_turn()
        if index is None:
            message = {"role": "assistant", "content": ""}
            return TurnAnswer(uuid.uuid4().hex, message, "length", len(prompt_ids or ()))
        recorded: Turn | None = None
        try:
            request = dataclasses.replace(
                turn,
                sampling=dict(turn.sampling),  # its max_tokens may be capped to the context
                prompt_ids=prompt_ids,
                stop_token_ids=self.renderer.stop_token_ids if self.renderer else (),
            )
            recorded, completion, parsed = await self._sample(session, index, request, pool)
            recorded.render, recorded.reused_prompt_tokens = render, reused
            recorded.ignored = list(turn.ignored)
        finally:
            session.end_turn(recorded)
        return TurnAnswer(
            id=recorded.rid,
            message=parsed.message,
            finish_reason=recorded.finish_reason,
            prompt_tokens=recorded.prompt_tokens or 0,
            completion_tokens=recorded.completion_tokens or 0,
            logprobs=self._logprobs(completion) if turn.logprobs else None,
            stop_sequence=completion.stop_sequence,
        )

    async def _render(
        self,
        session: Session,
        messages: Any,
        tools: list[dict[str, Any]] | None,
        pool: ThreadPoolExecutor | None,
    ) -> tuple[list[int] | None, str | None, int]:
        """Prompt ids, how they were rendered (one of RENDER_KINDS; None without a renderer),
        and how many of them were reused from an earlier render of the session; in `pool`
        (None: here), one render of a session at a time (each starts from the states the last
        one left)."""
        if self.renderer is None:
            return None, None, 0
        async with session.cpu:
            if self._incremental is None:
                ids = await in_pool(pool, self.renderer.render, messages, tools)
                render, reused = "full", 0
            else:
                states = list(session.render_states)
                rendered: Rendered = await in_pool(
                    pool, self._incremental.render_from, messages, tools, states, self.prefixes
                )
                ids, reused = rendered.ids, rendered.reused
                render = _render_kind(rendered, bool(states))
                session.remember_render(rendered)
        self.render_counts[render] += 1
        self.prompt_tokens["reused"] += reused
        self.prompt_tokens["encoded"] += len(ids) - reused
        return ids, render, reused

    async def count(
        self, session: Session, turn: ChatTurn, pool: ThreadPoolExecutor | None = None
    ) -> int:
        """The prompt tokens `turn` renders to (Anthropic's count_tokens): in `pool`, in the
        session's turn of it, recorded nowhere."""
        assert self.renderer is not None
        self._place_system(turn)
        async with session.cpu:
            ids = await in_pool(pool, self.renderer.render, turn.messages, turn.tools)
        self.counted_prompts += 1
        return len(ids)

    def _place_system(self, turn: ChatTurn) -> None:
        """A system message past the first, where the template renders none (it drops or
        refuses one there): its text joins the user turn before it (after it, if none is
        before), so the model sees it as the template allows, and the trace names it
        (`messages:system-in-user-turn`)."""
        if self._system_anywhere or not isinstance(turn.messages, list):
            return
        folded = fold_system_messages(turn.messages)
        if folded is not turn.messages:
            turn.messages = folded
            turn.ignored.add(
                "messages:system-in-user-turn",
                "the chat template renders no system message past the first: its text is "
                "in the nearest user turn",
            )

    def undelivered(self, session: Session, rid: str) -> None:
        """Mark the recorded turn `rid` as not delivered: its reply never reached the agent."""
        for turn in reversed(session.trajectory.turns):
            if turn.rid == rid:
                if turn.delivered:
                    turn.delivered = False
                    self.undelivered_turns += 1
                return

    async def _sample(
        self, session: Session, index: int, request: TurnRequest, pool: ThreadPoolExecutor | None
    ) -> tuple[Turn, Completion, Parsed]:
        started = time.perf_counter()
        prompt_ids = request.prompt_ids
        context_limited = False
        if prompt_ids is not None and session.max_context is not None:
            budget = session.max_context - len(prompt_ids)
            context_limited = budget <= 0
            if not context_limited:
                cap = request.sampling.get("max_tokens")
                request.sampling["max_tokens"] = budget if cap is None else min(cap, budget)
        if context_limited:
            completion = Completion("length", [], [], prompt_tokens=len(prompt_ids or []))
        else:
            completion = await complete(
                self.backend,
                request,
                self.resume,
                decode=self._decode,
                live=lambda: not session.closed,
            )
        parsed = await in_pool(pool, self._parse, completion, request)
        finish = completion.finish_reason
        if parsed.tool_calls and finish == "stop":
            finish = "tool_calls"
        n_prompt = completion.prompt_tokens
        turn = Turn(
            index=index,
            rid=request.rid,
            prompt_ids=prompt_ids,
            output_ids=completion.output_ids,
            logprobs=completion.logprobs,
            finish_reason=finish,
            ill_formed=parsed.ill_formed,
            error=parsed.error,
            weight_version=completion.weight_version,
            context_limited=context_limited,
            latency=time.perf_counter() - started,
            prompt_tokens=len(prompt_ids) if n_prompt is None and prompt_ids else n_prompt,
            completion_tokens=completion.completion_tokens
            if completion.output_ids is None
            else len(completion.output_ids),
            version_runs=completion.version_runs,
            resumed=completion.resumed,
        )
        return turn, completion, parsed

    def _parse(self, completion: Completion, request: TurnRequest) -> Parsed:
        """The assistant message of a completion, held to the request's tool rules: a turn
        that breaks them is the model's text, ill-formed (see `turns`)."""
        if completion.output_ids is None or self.renderer is None:
            return Parsed(completion.message or {"role": "assistant", "content": ""})
        choice = request.tool_choice
        tools_enabled = bool(request.tools) and choice.mode != "none"
        parsed = self.renderer.parse(completion.output_ids, tools_enabled=tools_enabled)
        broken = _broken_rule(parsed, choice, request.parallel_tool_calls)
        if broken is None or parsed.ill_formed:
            return parsed
        text = self.renderer.parse(completion.output_ids, tools_enabled=False).message
        return Parsed(text, ill_formed=True, error=broken)

    def _decode(self, ids: Sequence[int]) -> str:
        """The text of sampled ids, for stop strings across a resumed turn's seam."""
        if isinstance(self.renderer, TextRenderer):
            return self.renderer.decode(ids)
        assert self.renderer is not None  # only token backends resume: they need a renderer
        return "".join(map(self.renderer.token_text, ids))

    def _logprobs(self, completion: Completion) -> list[dict[str, Any]] | None:
        """OpenAI chat log-prob entries for the sampled tokens (and their top alternatives)."""
        if completion.logprob_entries is not None:
            return completion.logprob_entries
        if completion.output_ids is None or self.renderer is None:
            return None
        text = self.renderer.token_text
        tops = completion.top_logprobs or [()] * len(completion.output_ids)
        pairs = zip(completion.output_ids, completion.logprobs or [], tops, strict=True)
        entry = _logprob_entry
        return [
            {**entry(text(t), lp), "top_logprobs": [entry(text(i), x) for i, x in alt]}
            for t, lp, alt in pairs
        ]


def _render_kind(rendered: Rendered, had_states: bool) -> str:
    if rendered.reused:
        return "shared" if rendered.shared else "incremental"
    return "fallback" if had_states else "full"


def _broken_rule(parsed: Parsed, choice: ToolChoice, parallel: bool) -> str | None:
    """Which of the request's tool rules a parsed turn breaks, if any (one line)."""
    calls = parsed.tool_calls
    if choice.mode == "required" and not calls:
        return f"tool_choice {choice} asked for a tool call; the model wrote none"
    if choice.name is not None and any(c["function"]["name"] != choice.name for c in calls):
        return f"tool_choice {choice} allows only that tool; the model called another"
    if not parallel and len(calls) > 1:
        return f"parallel_tool_calls is false; the model made {len(calls)} calls"
    return None


def _logprob_entry(text: str, logprob: float) -> dict[str, Any]:
    return {"token": text, "logprob": logprob, "bytes": list(text.encode())}
