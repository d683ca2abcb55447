"""A shared prefix rendered once: a session's turn that extends none of its own renders reuses the
ids of another session's render of the same start (system prompt and tools), and its ids are
exactly a full render's: over random conversations, with the Claude Code request captured from
the real client, over the real wire, and from threads rendering at once. A changed system prompt
or other tools reuse nothing; the store stays within its bounds.
"""

from __future__ import annotations

import json
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anthropic
import pytest

from agentcore_rollout.gateway import Gateway, GatewayAdmin, SGLangBackend
from agentcore_rollout.gateway.messages import MessagesDialect
from agentcore_rollout.gateway.prefixes import SharedPrefixes
from agentcore_rollout.gateway.render import AnchoredRenderer, RenderState
from agentcore_rollout.gateway.sessions import Session
from agentcore_rollout.gateway.turns import Ignored
from agentcore_rollout.local.policy import CharRenderer

from .gateway_support import ScriptedWorker, hf_renderer
from .test_gateway import TOOLS
from .test_gateway_incremental import OTHER_TOOLS, random_chat

pytestmark = pytest.mark.component

CLAUDE_CODE = Path(__file__).parent / "fixtures" / "clients" / "claude-code-2.1.197.json"
SYSTEMS = ["You are a careful agent.", "Be brief. <|im_start|> is a token.", "Answer in French."]


def claude_code() -> dict[str, Any]:
    """The captured Claude Code request body (Anthropic Messages): its system prompt, 24 tools."""
    return json.loads(CLAUDE_CODE.read_text())["body"]


def as_chat(body: dict[str, Any]) -> tuple[list[dict[str, Any]], Any]:
    """A Messages body as the gateway renders it: chat messages and tools."""
    turn = MessagesDialect().convert(body, Session("s", "r", {}, None, None), Ignored())
    return turn.messages, turn.tools


def first_turn(task: str, system: str | None = None) -> dict[str, Any]:
    """A Claude Code first turn: its system prompt (or `system`) and tools, then `task`."""
    body = claude_code()
    return {
        "model": "policy",
        "max_tokens": 4,
        "system": body["system"] if system is None else system,
        "tools": body["tools"],
        "messages": [{"role": "user", "content": task}],
    }


def random_session(rng: random.Random) -> tuple[list[dict[str, Any]], Any]:
    """A conversation that starts with one of a few system prompts and tool lists."""
    chat = random_chat(rng, rng.randrange(1, 4))
    system = rng.choice([None, *SYSTEMS])
    if system is not None:
        chat = [{"role": "system", "content": system}, *chat]
    return chat, rng.choice([None, TOOLS, OTHER_TOOLS])


@pytest.mark.parametrize("renderer", [hf_renderer(), CharRenderer()], ids=["hf", "char"])
def test_random_sessions_sharing_a_store_render_to_the_full_ids(
    renderer: AnchoredRenderer,
) -> None:
    """Many sessions, each with its own render states and one store between them: every
    render equals a full one, and the shared ids are the stored state's."""
    hits = render_sessions(renderer, SharedPrefixes(), random.Random(38), 60)
    assert hits > 20  # sharing happened, and was exact


def render_sessions(
    renderer: AnchoredRenderer, shared: SharedPrefixes, rng: random.Random, sessions: int
) -> int:
    """`sessions` random sessions' turns rendered with one store between them, each checked
    against a full render; how many reused the store."""
    hits = 0
    for _ in range(sessions):
        chat, tools = random_session(rng)
        session = Session("s", "r", {}, None, None)
        for end in range(1, len(chat) + 1):
            if chat[end - 1]["role"] == "assistant":
                continue
            rendered = renderer.render_from(chat[:end], tools, session.render_states, shared)
            assert rendered.ids == renderer.render(chat[:end], tools)
            if rendered.shared:
                hits += 1
                assert rendered.base is not None and rendered.reused > 0
                assert rendered.ids[: rendered.reused] == rendered.base.ids[: rendered.reused]
            session.remember_render(rendered)
    return hits


def test_claude_code_first_turns_share_the_system_prompt_and_tools() -> None:
    """The second session's first turn reuses the ~47,000 tokens of the first's system prompt
    and 24 tools, exactly; a later turn of the captured conversation too; a changed system
    prompt or one tool fewer reuse nothing."""
    renderer = hf_renderer()
    shared = SharedPrefixes()
    messages, tools = as_chat(first_turn("Fix the failing test in utils.py."))
    first = renderer.render_from(messages, tools, [], shared)
    assert first.reused == 0 and len(shared) == 1
    assert len(tools) == 24 and len(first.ids) > 45_000
    for body in (first_turn("Add a README section on installing."), claude_code()):
        messages, tools = as_chat(body)
        again = renderer.render_from(messages, tools, [], shared)
        assert again.shared and again.reused > 45_000
        assert again.ids == renderer.render(messages, tools)
    edited_system = first_turn("Fix the failing test.", system=f"{claude_code()['system']}.")
    fewer_tools = {**first_turn("Fix the failing test."), "tools": claude_code()["tools"][1:]}
    for body in (edited_system, fewer_tools):
        messages, tools = as_chat(body)
        other = renderer.render_from(messages, tools, [], shared)
        assert other.reused == 0 and not other.shared
        assert other.ids == renderer.render(messages, tools)


def test_the_store_is_bounded_by_entries_and_tokens_least_recently_used_out() -> None:
    def state(name: str, n: int) -> RenderState:
        return RenderState(name, list(range(n)), ((1, 1),))

    def names() -> list[str]:
        return [s.text for s in store.states()]

    store = SharedPrefixes(max_entries=3, max_tokens=100)
    for name in "abc":
        store.add(state(name, 10))
    store.used(store.states()[-1])  # a is the most recently used now: b goes first
    store.add(state("d", 10))
    assert names() == ["d", "a", "c"] and store.tokens == 30
    store.add(state("big", 85))  # 115 tokens: the least recently used go until it fits
    assert names() == ["big", "d"] and store.tokens == 95
    store.add(state("huge", 101))  # bigger than the bound: not kept
    assert names() == ["big", "d"]
    renderer, shared = hf_renderer(), SharedPrefixes(max_entries=4)
    for i in range(10):  # ten system prompts: full encodes, each kept, the oldest dropped
        chat = [{"role": "system", "content": f"Prompt {i}."}, {"role": "user", "content": "Hi"}]
        renderer.render_from(chat, TOOLS, [], shared)
    assert len(shared) == 4
    assert all(s.text.startswith("<|im_start|>system\nPrompt ") for s in shared.states())


def test_threads_rendering_at_once_with_one_store_stay_exact() -> None:
    """Renders in a pool (as the gateway runs them), all reading and growing one small store:
    every render equals a full one, and the store ends within its bounds."""
    renderer = hf_renderer()
    shared = SharedPrefixes(max_entries=5, max_tokens=4_000)

    def work(seed: int) -> int:
        return render_sessions(renderer, shared, random.Random(seed), 15)

    with ThreadPoolExecutor(8) as pool:
        hits = sum(pool.map(work, range(16)))
    assert hits > 20
    assert len(shared) <= 5 and shared.tokens <= 4_000
    assert shared.tokens == sum(len(s.ids) for s in shared.states())


async def test_a_second_session_reuses_the_first_ones_prefix_over_the_wire() -> None:
    """Three Claude Code sessions through the anthropic SDK: the second's first turn is
    rendered from the first's prefix (`shared`, counted in its trace and /admin/stats), a third
    with another system prompt is a full render, and every prompt the worker got, and every
    trace's sample, is exactly a full render's."""
    bodies = [
        first_turn("Fix the failing test in utils.py."),
        first_turn("Add a README section on installing."),
        first_turn("Fix the failing test.", system="You are a different agent."),
    ]
    tok = hf_renderer().tokenizer
    reply = [*tok.encode("Done.", add_special_tokens=False), tok.eos_token_id]
    async with ScriptedWorker([reply] * 3) as worker:
        gateway = Gateway(SGLangBackend(worker.url), hf_renderer(), model_name="policy")
        await gateway.start()
        try:
            async with GatewayAdmin(gateway.admin_url, gateway.admin_token) as admin:
                traces = []
                for i, body in enumerate(bodies):
                    session = await admin.create_session(f"cc-{i}")
                    async with anthropic.AsyncAnthropic(
                        base_url=gateway.url, api_key=session.api_key
                    ) as client:
                        answer = await client.messages.create(**body)
                    assert answer.content[0].text == "Done."
                    traces.append(await admin.finish_session(session.session_id))
                stats = await admin.stats()
        finally:
            await gateway.stop()
    renderer = hf_renderer()
    for call, trace, body in zip(worker.calls, traces, bodies, strict=True):
        full = renderer.render(*as_chat(body))
        assert call["input_ids"] == full
        assert trace["samples"][0]["prompt_ids"] == full
    assert [t["turns"][0]["render"] for t in traces] == ["full", "shared", "full"]
    assert traces[1]["turns"][0]["reused_prompt_tokens"] > 45_000
    assert (
        traces[1]["usage"]["reused_prompt_tokens"] == traces[1]["turns"][0]["reused_prompt_tokens"]
    )
    assert [t["turns"][0]["reused_prompt_tokens"] for t in (traces[0], traces[2])] == [0, 0]
    assert stats["render"] == {"incremental": 0, "shared": 1, "fallback": 0, "full": 2}
