"""Incremental rendering: every prompt the gateway sends is, token for token, what a full render of
the agent's messages gives, whether it reused an earlier render's ids or fell back to encoding it
all; hits and fallbacks are counted per turn (trace) and per gateway (/admin/stats).

Through real HTTP where it is a feature (agent -> gateway -> worker, the worker recording the ids
it was sent); the anchor rules and a randomized chain of renders without HTTP.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from typing import Any

import aiohttp
import pytest
from tokenizers import AddedToken, Tokenizer, models

from agentcore_rollout.gateway import Gateway, GatewayAdmin, GatewayError, HFRenderer, SGLangBackend
from agentcore_rollout.gateway.render import (
    PROBE_CHAT,
    AnchoredRenderer,
    IncrementalRenderer,
    Parsed,
    RenderState,
    hf_anchors,
)
from agentcore_rollout.gateway.sessions import Session
from agentcore_rollout.local.policy import CharRenderer, PolicyServer

from .gateway_support import TOKENIZER_DIR, ScriptedWorker, exactness_conversation, hf_renderer
from .test_gateway import TOOLS, agent, recorded

pytestmark = pytest.mark.component

OTHER_TOOLS = [{"type": "function", "function": {"name": "mul", "parameters": {}}}]


def reply_ids(text: str) -> list[int]:
    tok = hf_renderer().tokenizer
    return [*tok.encode(text, add_special_tokens=False), tok.eos_token_id]


async def chat(client: Any, messages: list[dict[str, Any]], tools: Any = None) -> dict[str, Any]:
    """One turn; the assistant message as the agent would append it."""
    kwargs = {"tools": tools} if tools else {}
    reply = await client.chat.completions.create(model="m", messages=messages, **kwargs)
    return reply.choices[0].message.model_dump(exclude_none=True, exclude={"refusal"})


# -- through the gateway ------------------------------------------------------------------------


async def test_char_policy_conversations_render_incrementally_and_exactly() -> None:
    """The router exactness test's conversations (user, tool and user observations), against a
    real sampling policy: each prompt a worker saw equals a full render of what the agent sent."""
    async with (
        PolicyServer(seed=0, record=True) as policy,
        Gateway(SGLangBackend(policy.url), CharRenderer()) as gateway,
        GatewayAdmin(gateway.admin_url, gateway.admin_token) as admin,
    ):
        sent: dict[str, list[list[dict[str, Any]]]] = {}

        async def rollout(i: int) -> dict[str, Any]:
            sampling, messages, observations = exactness_conversation(i)
            session = await admin.create_session(f"req-{i}", sampling=sampling)
            client = agent(gateway, session.api_key)
            sent[f"req-{i}"] = []
            for observation in observations:
                sent[f"req-{i}"].append(list(messages))
                messages += [await chat(client, messages), observation]
            await client.close()
            return await admin.finish_session(session.session_id)

        traces = [await rollout(i) for i in range(6)]
        stats = await admin.stats()
        by_rid = {r["rid"]: r for r in await recorded(policy.url)}
    full = CharRenderer()
    for trace in traces:
        turns = trace["turns"]
        for turn, messages in zip(turns, sent[trace["request_id"]], strict=True):
            assert by_rid[turn["rid"]]["input_ids"] == full.render(messages, None)
        assert [t["render"] for t in turns] == ["full", "incremental", "incremental"]
        assert trace["render"] == {"incremental": 2, "shared": 0, "fallback": 0, "full": 1}
        assert all(t["reused_prompt_tokens"] > 0 for t in turns[1:])
        total = sum(t["reused_prompt_tokens"] for t in turns)  # the trace's total, for cost
        assert trace["usage"]["reused_prompt_tokens"] == total > 0
    assert stats["render"] == {"incremental": 12, "shared": 0, "fallback": 0, "full": 6}
    assert stats["turns"] == 18 and stats["sessions"] == 0
    reused = sum(t["reused_prompt_tokens"] for tr in traces for t in tr["turns"])
    assert stats["prompt_tokens"]["reused"] == reused
    total = sum(t["prompt_tokens"] for tr in traces for t in tr["turns"])
    assert stats["prompt_tokens"]["reused"] + stats["prompt_tokens"]["encoded"] == total


async def test_hf_tool_calls_drift_and_fallbacks_are_exact_and_counted() -> None:
    """One session through the fixture tokenizer: tool calls and their results, a reply whose
    sampled ids are not what re-tokenizing its text gives, an agent that edits the reply it got,
    then an edited history, changed tools, and a branch (fallbacks), and back to the main line."""
    tok = hf_renderer().tokenizer
    call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    drift = [tok.convert_tokens_to_ids(c) for c in "hello"] + [tok.eos_token_id]
    scripts = [
        reply_ids(call),
        reply_ids("The answer is 5."),
        drift,
        reply_ids("Sure."),
        *[reply_ids(f"Reply {i}.") for i in range(5)],
    ]
    async with ScriptedWorker(scripts) as worker:
        gateway = Gateway(SGLangBackend(worker.url), hf_renderer())
        await gateway.start()
        async with GatewayAdmin(gateway.admin_url, gateway.admin_token) as admin:
            session = await admin.create_session("hf")
            client = agent(gateway, session.api_key)
            sent: list[tuple[list[dict[str, Any]], Any]] = []

            async def turn(messages: list[dict[str, Any]], tools: Any = TOOLS) -> dict[str, Any]:
                sent.append((list(messages), tools))
                return await chat(client, messages, tools)

            main: list[dict[str, Any]] = [
                {"role": "system", "content": "Use tools."},
                {"role": "user", "content": "What is 2 + 3?"},
            ]
            called = await turn(main)  # 0 full
            assert called["tool_calls"][0]["function"]["name"] == "add"
            main += [called, {"role": "tool", "tool_call_id": "x", "content": "5"}]
            main += [await turn(main), {"role": "user", "content": "Say hello"}]  # 1 incremental
            hello = await turn(main)  # 2 incremental; sampled ids are not canonical
            assert hello["content"] == "hello"
            main += [hello, {"role": "user", "content": " And  again?\n"}]
            edited_reply = {"role": "assistant", "content": "Sure!!"}  # not what was returned
            main += [await turn(main)]  # 3 incremental
            main[-1] = edited_reply
            main.append({"role": "user", "content": "Go on."})
            await turn(main)  # 4 incremental: the edit is after the last anchor it reuses
            edited = [main[0], {"role": "user", "content": "What is 2 + 4?"}, *main[2:]]
            await turn(edited)  # 5 shared: an earlier message changed; turn 0's start is kept
            await turn(main, OTHER_TOOLS)  # 6 fallback: other tools, another system header
            await turn([{"role": "user", "content": "Summarize: 2 + 3 = 5."}])  # 7 fallback
            await turn([*main, {"role": "assistant", "content": "Ok."}, main[-1]])  # 8 main again
            trace = await admin.finish_session(session.session_id)
            stats = await admin.stats()
            await client.close()
        await gateway.stop()
    renderer = hf_renderer()
    assert len(worker.calls) == len(sent) == 9
    for call_, (messages, tools) in zip(worker.calls, sent, strict=True):
        assert call_["input_ids"] == renderer.render(messages, tools)
    kinds = [t["render"] for t in trace["turns"]]
    assert kinds == ["full", *["incremental"] * 4, "shared", "fallback", "fallback", "incremental"]
    assert trace["render"] == {"incremental": 5, "shared": 1, "fallback": 2, "full": 1}
    assert stats["render"] == trace["render"]
    # Exact ids change nothing about merging: the drifted and the edited replies end samples.
    assert [s["turns"] for s in trace["samples"]][:2] == [[0, 1, 2], [3]]
    assert trace["samples"][0]["response_ids"][-len(drift) :] == drift


async def test_a_renderer_without_the_capability_gets_full_renders() -> None:
    """The Renderer protocol as it was (render, parse, token_text) still plugs in."""

    class PlainRenderer:
        name = "plain"

        def __init__(self) -> None:
            self.inner = hf_renderer()
            self.stop_token_ids = self.inner.stop_token_ids

        def render(self, messages: Any, tools: Any) -> list[int]:
            return self.inner.render(messages, tools)

        def parse(self, output_ids: Sequence[int], *, tools_enabled: bool) -> Parsed:
            return self.inner.parse(output_ids, tools_enabled=tools_enabled)

        def token_text(self, token_id: int) -> str:
            return self.inner.token_text(token_id)

    plain = PlainRenderer()
    assert not isinstance(plain, IncrementalRenderer)
    async with (
        ScriptedWorker([reply_ids("One."), reply_ids("Two.")]) as worker,
        Gateway(SGLangBackend(worker.url), plain) as gateway,
        GatewayAdmin(gateway.admin_url, gateway.admin_token) as admin,
    ):
        session = await admin.create_session("plain")
        client = agent(gateway, session.api_key)
        messages = [{"role": "user", "content": "Count."}]
        messages += [await chat(client, messages), {"role": "user", "content": "More."}]
        await chat(client, messages)
        trace = await admin.finish_session(session.session_id)
        await client.close()
    assert [t["render"] for t in trace["turns"]] == ["full", "full"]
    assert [t["reused_prompt_tokens"] for t in trace["turns"]] == [0, 0]
    assert [s["turns"] for s in trace["samples"]] == [[0, 1]]
    assert worker.calls[1]["input_ids"] == hf_renderer().render(messages, None)


async def test_stats_need_the_admin_token() -> None:
    async with (
        Gateway(SGLangBackend("http://127.0.0.1:9"), CharRenderer()) as gateway,
        GatewayAdmin(gateway.admin_url, "not-the-admin-token") as stranger,
        GatewayAdmin(gateway.admin_url, gateway.admin_token) as admin,
    ):
        with pytest.raises(GatewayError) as denied:
            await stranger.stats()
        assert denied.value.status == 401
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"{gateway.admin_url}/admin/stats") as r,
        ):
            assert r.status == 401
        assert await admin.stats() == {
            "sessions": 0,
            "turns": 0,
            "render": {"incremental": 0, "shared": 0, "fallback": 0, "full": 0},
            "prompt_tokens": {"reused": 0, "encoded": 0},
            "ignored_fields": {},
            "undelivered_turns": 0,
            "count_tokens": 0,
        }


# -- without HTTP -----------------------------------------------------------------------------


WORDS = [
    "What",
    " is",
    "2",
    " + ",
    "3",
    "?",
    "\n",
    "  ",
    " ",
    "hello",
    "<|im_start|>",
    "<|im_end|>",
]
WORDS += ["<tool_call>", "é", "\t", "ok.", '{"a": 1}', "</tool_call>", "", "\n\n"]


def random_chat(rng: random.Random, turns: int) -> list[dict[str, Any]]:
    """A conversation whose texts put spaces, newlines, special-token strings and non-ASCII
    right at message boundaries, where a tokenizer is most likely to merge across a split."""

    def text() -> str:
        return "".join(rng.choice(WORDS) for _ in range(rng.randint(0, 6)))

    chat_: list[dict[str, Any]] = (
        [{"role": "system", "content": text()}] if rng.random() < 0.5 else []
    )
    for _ in range(turns):
        chat_.append({"role": rng.choice(["user", "tool"]), "content": text()})
        chat_.append({"role": "assistant", "content": text()})
    return chat_


@pytest.mark.parametrize("renderer", [hf_renderer(), CharRenderer()], ids=["hf", "char"])
def test_random_conversations_render_incrementally_to_the_full_ids(
    renderer: AnchoredRenderer,
) -> None:
    """Conversations that grow, and sometimes edit an earlier message, retry from an earlier
    point, or switch tools, with a session's render states: every render equals a full one."""
    rng = random.Random(12)
    hits = fallbacks = 0
    for _ in range(30):
        chat_ = random_chat(rng, 6)
        tools = rng.choice([None, TOOLS])
        session = Session("s", "r", {}, None, None)
        for end in range(1, len(chat_) + 1):
            if chat_[end - 1]["role"] == "assistant":
                continue
            messages, use = chat_[:end], tools
            twist = rng.random()
            if twist < 0.15:  # an edited earlier message
                i = rng.randrange(len(messages))
                messages = [*messages[:i], {**messages[i], "content": "edited"}, *messages[i + 1 :]]
            elif twist < 0.25:  # a retry from an earlier point
                messages = messages[: rng.randrange(1, len(messages) + 1)]
            elif twist < 0.3:
                use = OTHER_TOOLS
            rendered = renderer.render_from(messages, use, session.render_states)
            assert rendered.ids == renderer.render(messages, use)
            base = rendered.base
            assert base is None or rendered.ids[: rendered.reused] == base.ids[: rendered.reused]
            hits += rendered.reused > 0
            fallbacks += rendered.reused == 0 and bool(session.render_states)
            session.remember_render(rendered)
    assert hits > 60 and fallbacks > 5  # both paths were taken


def test_a_cut_is_used_only_where_the_new_text_has_an_anchor_too() -> None:
    """A template that is plain concatenation: the new text agrees with the old one up to where
    the old had `<|im_start|>`, but continues there with "e", which BPE merges with "Th"."""

    class Concatenation(HFRenderer):
        def render_text(self, messages: list[dict[str, Any]], tools: Any) -> str:
            return "".join(m["content"] for m in messages)

    renderer = Concatenation(hf_renderer().tokenizer)
    first = renderer.render_from([{"role": "user", "content": "Th<|im_start|>x"}], None, [])
    assert first.state is not None and first.state.cuts[0][0] == 2
    messages = [{"role": "user", "content": "The cat"}]
    again = renderer.render_from(messages, None, [first.state])
    assert again.reused == 0 and again.ids == renderer.render(messages, None)
    tok = renderer.tokenizer
    assert tok.convert_ids_to_tokens(again.ids)[0] == "The"  # a split at 2 would give T, h, e


def test_hf_anchors_are_the_added_tokens_that_split_text_exactly() -> None:
    """Only tokens matched on raw text, with no strip or word rule reaching across the split
    and no added token overlapping them, are anchors."""
    backend = Tokenizer(models.WordLevel({"[unk]": 0}, unk_token="[unk]"))
    backend.add_special_tokens(
        [
            AddedToken("<|start|>", normalized=False),  # an anchor
            AddedToken("<|lstrip|>", lstrip=True, normalized=False),
            AddedToken("<|word|>", single_word=True, normalized=False),
            AddedToken(" <|space|>", normalized=False),
            AddedToken("word>", normalized=False),  # starts with a word character
            AddedToken("<a>", normalized=False),
            AddedToken("x<a", normalized=False),  # ends with the start of <a>: <a> is no anchor
            AddedToken("<b>", normalized=False),
            AddedToken("<b>c", normalized=False),  # starts with <b>: <b> is no anchor
        ]
    )

    class Fast:
        backend_tokenizer = backend

    anchors = hf_anchors(Fast())
    assert set(anchors) == {"<|start|>", "<b>c"}
    assert anchors["<|start|>"] == backend.token_to_id("<|start|>")
    assert hf_anchors(hf_renderer().tokenizer) == {
        "<|endoftext|>": 0,
        "<|im_start|>": 1,
        "<|im_end|>": 2,
        "<tool_call>": 700,
        "</tool_call>": 701,
    }


def test_a_tokenizer_that_does_not_split_at_its_anchors_fails_the_probe(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A tokenizer whose ids of a text depend on what precedes it (here: one that starts every
    encoding with a marker, as a BOS it should not add) is caught by the probe at load time."""
    encode = HFRenderer.encode
    monkeypatch.setattr(HFRenderer, "encode", lambda self, text: [5, *encode(self, text)])
    caplog.set_level(logging.WARNING)
    renderer = HFRenderer.from_pretrained(TOKENIZER_DIR)
    assert renderer.anchors == {}
    assert "incremental rendering disagrees with full renders; disabled" in caplog.text
    states: list[RenderState] = []
    for end in (2, 4):
        rendered = renderer.render_from(list(PROBE_CHAT[:end]), None, states)
        assert rendered.ids == renderer.render(list(PROBE_CHAT[:end]), None)
        assert rendered.reused == 0 and rendered.state is None
        states = []


def test_an_anchor_that_is_not_one_token_per_occurrence_is_never_reused() -> None:
    """ "s" is merged into its neighbours by BPE: its occurrences in the text and its ids
    disagree, so renders keep no cut at it rather than a wrong one."""
    renderer = HFRenderer(hf_renderer().tokenizer)
    renderer.anchors = {"s": renderer.tokenizer.convert_tokens_to_ids("s")}
    rng = random.Random(3)
    for _ in range(10):
        chat_ = random_chat(rng, 3)
        states: list[RenderState] = []
        for end in range(1, len(chat_) + 1):
            rendered = renderer.render_from(chat_[:end], None, states)
            assert rendered.ids == renderer.render(chat_[:end], None)
            states = [rendered.state] if rendered.state else []


def test_the_probe_passes_for_both_renderers_with_and_without_tools() -> None:
    for renderer in (hf_renderer(), CharRenderer()):
        for tools in (None, TOOLS):
            assert renderer.check_incremental(PROBE_CHAT, tools)
