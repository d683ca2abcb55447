"""Exact token traces for the example agent, end to end: RolloutEngine -> emulator ->
math agent -> token-capture gateway -> sglang-router -> two policy workers. Every token the
trace marks as sampled, and its log-prob, is exactly what a worker recorded sampling, and every
prompt a worker saw is a full render of the agent's messages although the gateway rendered all
turns after the first incrementally."""

from __future__ import annotations

import aiohttp
import pytest

from agentcore_rollout import RolloutEngine, RolloutRequest
from agentcore_rollout.local.config import LocalConfig
from agentcore_rollout.local.policy import CharRenderer, CharTokenizer
from agentcore_rollout.local.stack import LocalStack

from .factories import flat_config

pytestmark = pytest.mark.e2e


def _runs(mask: list[int]) -> list[tuple[int, int]]:
    """[start, end) of each run of 1s."""
    runs, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    return runs


async def test_example_agent_traces_equal_what_the_workers_sampled():
    local = LocalConfig(
        app="examples.math_agent.app:app",
        mode="in_process",
        bucket="traces",
        queue="traces",
        record_samples=True,
        policy_workers=2,
    )
    questions = [("What is 2 + 3?", 5), ("What is 9 - 4?", 5), ("What is 7 + 1?", 8)]
    requests = [
        RolloutRequest(
            {"question": q, "answer": a, "max_turns": 3}, input_id=f"g{i}", sample_index=k
        )
        for i, (q, a) in enumerate(questions)
        for k in range(3)
    ]
    async with LocalStack(local) as stack:
        cfg = stack.engine_config(
            flat_config(exp_id="traces", start_rate=50.0, rollout_timeout=60.0)
        )
        async with RolloutEngine(cfg) as engine:
            batch = await engine.rollout(requests)
        async with aiohttp.ClientSession(headers=stack.policy_headers) as http:
            recorded = []
            for worker in stack.workers:
                async with http.get(f"{worker.url}/debug/samples") as resp:
                    recorded.append((await resp.json())["samples"])
    assert batch.counts["ok"] == len(requests), [o.error for o in batch.outcomes]
    assert all(samples for samples in recorded), "the router used both workers"
    by_prompt: dict[tuple[int, ...], list[dict]] = {}
    for samples in recorded:
        for s in samples:
            by_prompt.setdefault(tuple(s["input_ids"]), []).append(s)
    prompts = set(by_prompt)
    tokenizer, renderer = CharTokenizer(), CharRenderer()
    checked = shared = 0
    for outcome in batch.outcomes:
        trace = outcome.trace
        assert trace is not None and trace["token_capture"] is True
        messages = outcome.result.trajectory["messages"]
        assistant = [m["content"] for m in messages if m["role"] == "assistant"]
        assert trace["num_turns"] == len(assistant)
        asked = [messages[:i] for i, m in enumerate(messages) if m["role"] == "assistant"]
        assert all(tuple(renderer.render(m, None)) in prompts for m in asked)
        # A first turn reuses the system prompt (and question) another session rendered first.
        kinds = [t["render"] for t in trace["turns"]]
        assert kinds[0] in ("full", "shared") and kinds[1:] == ["incremental"] * (len(asked) - 1)
        shared += kinds[0] == "shared"
        sampled_texts = []
        for sample in trace["samples"]:
            ids, mask, lps = sample["response_ids"], sample["loss_mask"], sample["logprobs"]
            assert len(ids) == len(mask) == len(lps)
            assert all((lp is None) == (m == 0) for lp, m in zip(lps, mask, strict=True))
            for start, end in _runs(mask):
                # A worker saw exactly this prompt and sampled exactly these tokens, with these
                # log-probs; each recorded generation is matched once.
                candidates = by_prompt[tuple(sample["prompt_ids"] + ids[:start])]
                match = next(
                    c
                    for c in candidates
                    if c["output_ids"] == ids[start:end] and c["output_logprobs"] == lps[start:end]
                )
                candidates.remove(match)
                sampled_texts.append(tokenizer.decode(ids[start:end], skip_special_tokens=True))
                checked += 1
        assert sampled_texts == assistant  # what the agent saw is what was sampled
    assert checked >= len(requests)
    assert shared >= 1  # the sessions share the math agent's system prompt
    assert not any(by_prompt.values()), "every recorded generation belongs to a trace"
