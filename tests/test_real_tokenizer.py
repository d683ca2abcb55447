"""A real byte-level BPE tokenizer (SmolLM2-135M-Instruct's, from its GGUF file: tests/smollm2.py)
under the Hugging Face renderer: exact renders, incremental renders equal to full ones across
boundaries where BPE merges would cross (a message ending in a space, one starting with a
non-ASCII character), sound anchors; and each model family's chat template (tests/fixtures/
templates) rendering a tool call, parsing the family's answer, and re-rendering it as history.
"""

# ruff: noqa: RUF001  (DeepSeek's markers are written with full-width bars)
from __future__ import annotations

import json
import random
from typing import Any

import openai
import pytest

from agentcore_rollout.gateway import Gateway, GatewayAdmin, HFRenderer, SGLangBackend
from agentcore_rollout.gateway.render import RenderState, hf_anchors

from .gateway_support import ADD_TOOL, ScriptedWorker
from .smollm2 import LOAD_SECONDS, family_renderer, family_tokenizer, smollm2

pytestmark = pytest.mark.component

TOOLS = [ADD_TOOL]
# Boundaries that BPE merges would cross if the renderer cut there: trailing and leading spaces,
# newlines, non-ASCII first characters, digits, emoji.
TRICKY = [
    "Hello ",
    " world",
    "été à Zürich",
    "  two spaces\n\n",
    "日本語のテキスト",
    "12345 + 678",
    "emoji 🙂 end 🙂",
    "\n",
    "tab\tand 'quotes' \"double\"",
    "ends with punctuation!!!",
]


@pytest.fixture(scope="module")
def renderer() -> HFRenderer:
    return HFRenderer(smollm2(), name="smollm2")


def encode(tokenizer: Any, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_the_gguf_tokenizer_loads_once_and_is_byte_level_bpe() -> None:
    tokenizer = smollm2()
    assert smollm2() is tokenizer and LOAD_SECONDS["smollm2"] < 60
    assert type(tokenizer.backend_tokenizer.model).__name__ == "BPE"
    assert "ByteLevel" in str(tokenizer.backend_tokenizer.pre_tokenizer)
    assert len(tokenizer) == 49152 and tokenizer.eos_token_id == 2
    text = "été 🙂 x"
    assert tokenizer.decode(encode(tokenizer, text)) == text


def test_renders_are_the_tokenizers_ids_of_the_template_text(renderer: HFRenderer) -> None:
    tokenizer = renderer.tokenizer
    messages = [{"role": "user", "content": c} for c in TRICKY]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    ids = renderer.render(messages, None)
    assert ids == encode(tokenizer, text)
    assert tokenizer.decode(ids) == text


def test_chatml_anchors_are_sound_for_smollm2(renderer: HFRenderer) -> None:
    anchors = hf_anchors(renderer.tokenizer)
    assert anchors["<|im_start|>"] == 1 and anchors["<|im_end|>"] == 2
    tokenizer = renderer.tokenizer
    messages = [
        {"role": "user" if i % 2 else "assistant", "content": c} for i, c in enumerate(TRICKY)
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    ids = encode(tokenizer, text)
    cuts = [i for i in range(len(text)) if text.startswith(("<|im_start|>", "<|im_end|>"), i)]
    assert len(cuts) == 2 * len(TRICKY) + 2  # and the default system message
    for cut in cuts:  # the anchor property: the ids of each side, concatenated
        assert encode(tokenizer, text[:cut]) + encode(tokenizer, text[cut:]) == ids
    # ... which a plain BPE boundary does not have: this is why cuts are only at anchors
    inside = text.index("punctuation") + len("punct")
    assert encode(tokenizer, text[:inside]) + encode(tokenizer, text[inside:]) != ids


def test_incremental_renders_equal_full_ones_turn_after_turn(renderer: HFRenderer) -> None:
    assert renderer.anchors and renderer.check_incremental(
        [
            {"role": "user" if i % 2 == 0 else "assistant", "content": c}
            for i, c in enumerate(TRICKY)
        ]
    )
    rng = random.Random(20)
    for _ in range(20):
        messages: list[dict[str, Any]] = []
        states: list[RenderState] = []
        for turn in range(5):
            messages.append({"role": "user", "content": "".join(rng.sample(TRICKY, 2))})
            rendered = renderer.render_from(messages, None, states)
            assert rendered.ids == renderer.render(messages, None)
            assert (rendered.reused > 0) == (turn > 0)  # every later turn reuses a prefix
            states = [rendered.state] if rendered.state else []
            messages.append({"role": "assistant", "content": rng.choice(TRICKY)})


def test_incremental_renders_with_tool_calls_through_the_hermes_template() -> None:
    renderer = family_renderer("hermes")
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2}'}}
    conversation = [
        {"role": "system", "content": "Use tools. "},
        {"role": "user", "content": "été: 2 + 3? "},
        {"role": "assistant", "content": " Let me add ", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "5 "},
        {"role": "user", "content": "日本語 and 🙂"},
        {"role": "assistant", "content": None, "tool_calls": [call, call]},
        {"role": "tool", "tool_call_id": "c1", "content": "\n5"},
        {"role": "user", "content": " thanks"},
    ]
    assert renderer.check_incremental(conversation, TOOLS)
    states: list[RenderState] = []
    for end in (2, 4, 5, 7, 8):
        rendered = renderer.render_from(conversation[:end], TOOLS, states)
        assert rendered.ids == renderer.render(conversation[:end], TOOLS)
        assert rendered.reused > 0 or not states
        states = [rendered.state] if rendered.state else []


# -- the model families' templates --------------------------------------------------------------

# family -> the canonical answer of a model of that family: reasoning, a call of add(2, 3).
ANSWERS = {
    "hermes": '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>',
    "qwen3": "<think>\nTwo numbers: add them.\n</think>\n\nLet me add.\n<tool_call>\n"
    '{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>',
    "llama3": '{"name": "add", "parameters": {"a": 2, "b": 3}}',
    "mistral": 'Let me add.[TOOL_CALLS]add[ARGS]{"a": 2, "b": 3}',
    "deepseek_v3": "Let me add.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>add"
    '\n```json\n{"a": 2, "b": 3}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    "glm45": "\n<think>Two numbers: add them.</think>\nLet me add.\n<tool_call>add\n"
    "<arg_key>a</arg_key>\n<arg_value>2</arg_value>\n<arg_key>b</arg_key>\n<arg_value>3</arg_value>"
    "\n</tool_call>",
    "harmony": "<|channel|>analysis<|message|>Two numbers: add them.<|end|><|start|>assistant"
    '<|channel|>commentary to=functions.add <|constrain|>json<|message|>{"a": 2, "b": 3}',
}
REASONS = {"qwen3", "glm45", "harmony"}  # the answers above that reason
CONTENT = {"qwen3", "mistral", "deepseek_v3", "glm45"}  # ... and that say something first
# Where the sampled ids do not continue as the history's ids: Llama's answer follows "\n\n",
# which this tokenizer's GPT-2 pre-tokenizer splits differently before "{" than at the end of
# the prompt (Llama 3's own regex keeps "\n\n" whole), so the next turn is a new sample.
IDS_DIFFER = {"llama3"}
QUESTION = [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": "2 + 3?"}]


STOPS = {  # the end-of-turn token a model of the family samples after a call
    "hermes": "<|im_end|>",
    "qwen3": "<|im_end|>",
    "llama3": "<|eot_id|>",
    "mistral": "</s>",
    "deepseek_v3": "<｜end▁of▁sentence｜>",
    "glm45": "<|observation|>",
    "harmony": "<|call|>",
}


def sampled_ids(renderer: HFRenderer, name: str) -> list[int]:
    """The ids a model of the family would sample for ANSWERS[name], stop token included."""
    tokenizer = renderer.tokenizer
    return [*encode(tokenizer, ANSWERS[name]), tokenizer.convert_tokens_to_ids(STOPS[name])]


@pytest.mark.parametrize("name", sorted(ANSWERS))
def test_a_family_renders_parses_and_re_renders_its_tool_call(name: str) -> None:
    renderer = family_renderer(name)
    tokenizer = renderer.tokenizer
    assert renderer.parser.name == name  # detected from the template's markers
    prompt_text = renderer.render_text(QUESTION, TOOLS)
    prompt = renderer.render(QUESTION, TOOLS)
    assert prompt == encode(tokenizer, prompt_text)  # exact
    assert "add" in prompt_text
    assert "Add two integers." in prompt_text or name == "deepseek_v3"  # it lists parameters

    sample = sampled_ids(renderer, name)
    assert sample[-1] in renderer.stop_token_ids
    parsed = renderer.parse(sample, tools_enabled=True)
    assert not parsed.ill_formed, parsed.error
    assert parsed.message.get("reasoning_content") == (
        "Two numbers: add them." if name in REASONS else None
    )
    assert parsed.message["content"] == ("Let me add." if name in CONTENT else None)
    (call,) = parsed.tool_calls
    assert call["function"]["name"] == "add"
    assert json.loads(call["function"]["arguments"]) == {"a": 2, "b": 3}

    # the agent sends the answer back as history, with the tool's result
    result = {"role": "tool", "tool_call_id": call["id"], "content": "5"}
    history = [*QUESTION, parsed.message, result]
    text = renderer.render_text(history, TOOLS)
    stop_text = tokenizer.convert_ids_to_tokens(sample[-1])
    assert text.startswith(prompt_text + ANSWERS[name] + stop_text)  # the sampled text again
    ids = renderer.render(history, TOOLS)
    assert ids == encode(tokenizer, text)
    assert (ids[: len(prompt) + len(sample)] == prompt + sample) == (name not in IDS_DIFFER)
    rendered = renderer.render_from(
        history, TOOLS, [renderer.render_from(QUESTION, TOOLS, []).state]
    )
    assert rendered.ids == ids and rendered.reused > 0


@pytest.mark.parametrize("name", ["qwen3", "glm45", "harmony"])
def test_templates_that_drop_earlier_reasoning_render_exactly_and_reuse_less(name: str) -> None:
    """Qwen3, GLM-4.5 and gpt-oss keep the reasoning of the turns after the last user message
    only: once the user speaks again, the earlier answers render without it, so the turn's
    prompt no longer continues what was sampled (prime-rl #1334). The render stays the full
    render's ids, reusing only the prefix before the first changed answer."""
    renderer = family_renderer(name)
    parsed = renderer.parse(sampled_ids(renderer, name), tools_enabled=True)
    result = {"role": "tool", "tool_call_id": parsed.tool_calls[0]["id"], "content": "5"}
    before = [*QUESTION, parsed.message, result]
    earlier = renderer.render_from(before, TOOLS, [])
    assert earlier.state is not None
    after = [
        *before,
        {"role": "assistant", "content": "It is 5."},
        {"role": "user", "content": "Thanks!"},
    ]
    text = renderer.render_text(after, TOOLS)
    assert "Two numbers: add them." in earlier.state.text and "Two numbers" not in text
    rendered = renderer.render_from(after, TOOLS, [earlier.state])
    assert rendered.ids == renderer.render(after, TOOLS)
    changed = next(
        i for i, (a, b) in enumerate(zip(text, earlier.state.text, strict=False)) if a != b
    )
    assert rendered.reused <= len(encode(renderer.tokenizer, text[:changed]))
    assert rendered.reused == 0  # its cuts lie after the change: a fallback, counted as one
    assert rendered.ids[: len(earlier.ids)] != earlier.ids  # the gateway starts a new sample


async def test_the_gateway_answers_a_family_tool_call_with_reasoning_over_the_wire() -> None:
    """Gateway + SGLangBackend + a scripted worker sampling Qwen3's syntax, through the OpenAI
    SDK: the reply carries the parsed call and content without the reasoning text; the trace
    holds exactly what was sampled; the second prompt is the full render of what the agent
    sent."""
    renderer = HFRenderer(family_tokenizer("qwen3"), name="smollm2+qwen3")
    answer = [*encode(renderer.tokenizer, "<think>\nDone.\n</think>\n\nIt is 5."), 2]
    async with (
        ScriptedWorker([sampled_ids(renderer, "qwen3"), answer]) as worker,
        Gateway(SGLangBackend(worker.url), renderer) as gateway,
        GatewayAdmin(gateway.admin_url, gateway.admin_token) as admin,
    ):
        session = await admin.create_session("qwen3-wire")
        client = openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key=session.api_key)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "2 + 3?"}]
        first = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        reply = first.choices[0].message
        assert first.choices[0].finish_reason == "tool_calls"
        assert reply.content == "Let me add." and "<think>" not in reply.content
        assert reply.model_extra["reasoning_content"] == "Two numbers: add them."
        (call,) = reply.tool_calls or []
        assert call.function.name == "add"
        assert json.loads(call.function.arguments) == {"a": 2, "b": 3}
        messages += [
            reply.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "5"},
        ]
        second = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        assert second.choices[0].message.content == "It is 5."
        assert second.choices[0].finish_reason == "stop"
        trace = await admin.finish_session(session.session_id)
        await client.close()
    assert [c["input_ids"] for c in worker.calls] == [
        renderer.render(messages[:1], TOOLS),
        renderer.render(messages, TOOLS),
    ]
    sampled = [t for c in worker.calls for t in c["output_ids"]]
    in_trace = [
        t
        for s in trace["samples"]
        for t, m in zip(s["response_ids"], s["loss_mask"], strict=True)
        if m
    ]
    assert in_trace == sampled
    assert not any(turn["ill_formed"] for turn in trace["turns"])
    # The agent sent the reasoning back and Qwen3 keeps it after the last user message: the
    # second prompt extends the first sample.
    assert len(trace["samples"]) == 1
