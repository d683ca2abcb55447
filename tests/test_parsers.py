"""Tool-call and reasoning parsing per model family (`gateway.parsers`), on text: each family's
syntax back to an OpenAI assistant message, malformed calls as one-line errors (never raised),
choosing the family by name or from a chat template, and multimodal parts refused."""

# ruff: noqa: RUF001  (DeepSeek's markers are written with full-width bars)
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agentcore_rollout.gateway import HFRenderer, load_renderer
from agentcore_rollout.gateway.parsers import FAMILIES, detect_family, family
from agentcore_rollout.gateway.render import normalize_messages

from .gateway_support import TOKENIZER_DIR

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = ROOT / "tests" / "fixtures" / "templates"
ADD = {"a": 2, "b": 3}

# family -> (sampled text, content, reasoning, [(name, arguments)])
SAMPLES: dict[str, tuple[str, str | None, str | None, list[tuple[str, Any]]]] = {
    "hermes": (
        'On it.\n<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>',
        "On it.",
        None,
        [("add", ADD)],
    ),
    "qwen3": (
        "<think>\nTwo numbers: add them.\n</think>\n\nOn it.\n<tool_call>\n"
        '{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>\n<tool_call>\n'
        '{"name": "say", "arguments": {"text": "Zürich"}}\n</tool_call>',
        "On it.",
        "Two numbers: add them.",
        [("add", ADD), ("say", {"text": "Zürich"})],
    ),
    "llama3": (
        '{"name": "add", "parameters": {"a": 2, "b": 3}}; {"name": "say", "parameters": {}}',
        None,
        None,
        [("add", ADD), ("say", {})],
    ),
    "mistral": (
        '[THINK]Add.[/THINK]On it.[TOOL_CALLS]add[ARGS]{"a": 2, "b": 3}'
        '[TOOL_CALLS]say[CALL_ID]a1b2c3d4e[ARGS]{"text": "hi"}',
        "On it.",
        "Add.",
        [("add", ADD), ("say", {"text": "hi"})],
    ),
    "deepseek_v3": (
        "On it.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n"
        '{"a": 2, "b": 3}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>say'
        '\n```json\n{"text": "hi"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        "On it.",
        None,
        [("add", ADD), ("say", {"text": "hi"})],
    ),
    "glm45": (
        "\n<think>Add them.</think>\nOn it.\n<tool_call>add\n<arg_key>a</arg_key>\n"
        "<arg_value>2</arg_value>\n<arg_key>b</arg_key>\n<arg_value>3</arg_value>\n</tool_call>"
        "\n<tool_call>say\n<arg_key>text</arg_key>\n<arg_value>hello there</arg_value>\n"
        "</tool_call>",
        "On it.",
        "Add them.",
        [("add", ADD), ("say", {"text": "hello there"})],
    ),
    "harmony": (
        "<|channel|>analysis<|message|>Add them.<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.add <|constrain|>json<|message|>{"a": 2, "b": 3}',
        None,
        "Add them.",
        [("add", ADD)],
    ),
}


def calls_of(message: dict[str, Any]) -> list[tuple[str, Any]]:
    calls = message.get("tool_calls") or []
    for call in calls:
        assert call["type"] == "function" and call["id"]
        assert isinstance(call["function"]["arguments"], str)  # OpenAI's shape: a JSON string
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_each_family_parses_its_calls_and_reasoning(name: str) -> None:
    text, content, reasoning, calls = SAMPLES[name]
    parsed = family(name).parse(text, tools_enabled=True)
    assert not parsed.ill_formed, parsed.error
    assert parsed.message["content"] == content
    assert parsed.message.get("reasoning_content") == parsed.reasoning == reasoning
    assert calls_of(parsed.message) == calls


def test_more_syntaxes_of_the_families() -> None:
    mistral_v3 = '[TOOL_CALLS][{"name": "add", "arguments": {"a": 2, "b": 3}, "id": "abcdefghi"}]'
    parsed = family("mistral").parse(mistral_v3, tools_enabled=True)
    assert calls_of(parsed.message) == [("add", ADD)]
    assert parsed.tool_calls[0]["id"] == "abcdefghi"  # Mistral's own call id is kept
    tagged = '<|python_tag|>{"name": "add", "parameters": {"a": 2, "b": 3}}'
    assert calls_of(family("llama3").parse(tagged, tools_enabled=True).message) == [("add", ADD)]
    # gpt-oss may put the recipient in the role header; final and preambles are content
    harmony = (
        "<|channel|>commentary<|message|>Let me add.<|end|><|start|>assistant to=functions.add"
        '<|channel|>commentary json<|message|>{"a": 2, "b": 3}'
    )
    parsed = family("harmony").parse(harmony, tools_enabled=True)
    assert parsed.message["content"] == "Let me add." and calls_of(parsed.message) == [("add", ADD)]
    final = "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final"
    final += "<|message|>5"
    parsed = family("harmony").parse(final, tools_enabled=False)
    assert parsed.message == {"role": "assistant", "content": "5", "reasoning_content": "Easy."}
    # DeepSeek-R1's template opens <think> in the prompt: the sample holds only its end
    parsed = family("deepseek_v3").parse("Hmm.</think>\n\n5", tools_enabled=True)
    assert parsed.message == {"role": "assistant", "content": "5", "reasoning_content": "Hmm."}


@pytest.mark.parametrize(
    ("name", "text", "error"),
    [
        ("qwen3", '<tool_call>\n{"name": add}\n</tool_call>', "not valid JSON"),
        ("qwen3", 'Hi <tool_call>\n{"name": "add"', "unterminated or malformed <tool_call>"),
        ("qwen3", "<tool_call>\n[1, 2]\n</tool_call>", "qwen3 tool call"),
        ("qwen3", '<tool_call>{"arguments": {}}</tool_call>', "string 'name'"),
        ("llama3", '{"name": "add", "parameters": {"a": }', "not valid JSON"),
        ("llama3", "<|python_tag|>print(1)", "unterminated or malformed"),
        ("mistral", "[TOOL_CALLS][{'name': 'add'}]", "not valid JSON"),
        ("mistral", "[TOOL_CALLS]add[ARGS]{oops", "not valid JSON"),
        (
            "deepseek_v3",
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n{}",
            "unterminated or malformed",
        ),
        ("glm45", "<tool_call>add\n<arg_key>a</arg_key>\n<arg_value>2", "unterminated"),
        ("harmony", "<|channel|>commentary to=functions.add<|message|>{a: 1}", "not valid JSON"),
        ("harmony", "<|message|>no channel", "without a channel"),
    ],
)
def test_a_malformed_call_is_content_and_a_one_line_error(name: str, text: str, error: str) -> None:
    parsed = family(name).parse(text, tools_enabled=True)
    assert parsed.ill_formed and error in (parsed.error or "")
    assert "\n" not in (parsed.error or "\n") and len(parsed.error or "") <= 300
    assert parsed.message == {"role": "assistant", "content": text}


def test_without_tools_the_calls_stay_text_and_the_reasoning_is_still_split() -> None:
    text, *_ = SAMPLES["qwen3"]
    parsed = family("qwen3").parse(text, tools_enabled=False)
    assert parsed.message["reasoning_content"] == "Two numbers: add them."
    assert parsed.message["content"].startswith("On it.\n<tool_call>") and not parsed.tool_calls


def test_the_family_comes_from_the_template_or_its_name() -> None:
    for name in FAMILIES:
        path = TEMPLATES / f"{name}.jinja"
        template = (path if path.exists() else TOKENIZER_DIR / "chat_template.jinja").read_text()
        assert detect_family(template).name == name
    assert detect_family("{{ messages }}").name == "hermes"  # nothing found: Hermes
    assert detect_family(None).name == "hermes"
    known = r"unknown parser 'qwen9': known parsers are .*harmony.*qwen3"
    with pytest.raises(ValueError, match=known):
        family("qwen9")


def test_renderers_take_a_parser_by_name() -> None:
    renderer = load_renderer(str(TOKENIZER_DIR), parser="qwen3")
    assert isinstance(renderer, HFRenderer) and renderer.parser.name == "qwen3"
    assert load_renderer(str(TOKENIZER_DIR)).parser.name == "hermes"  # detected: the fixture's
    char = load_renderer("agentcore_rollout.local.policy.render:CharRenderer", parser="glm45")
    assert char.parser.name == "glm45"  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="unknown parser 'nope'"):
        load_renderer(str(TOKENIZER_DIR), parser="nope")
    tokenizer = HFRenderer.from_pretrained(TOKENIZER_DIR).tokenizer
    assert HFRenderer(tokenizer, parser="llama3").parser.name == "llama3"


def test_the_gateway_command_line_names_the_parser(tmp_path: Path) -> None:
    run = [sys.executable, "-m", "agentcore_rollout.gateway", "--backend-url", "http://127.0.0.1:1"]
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    bad = subprocess.run(
        [*run, "--renderer", str(TOKENIZER_DIR), "--parser", "nope"],
        capture_output=True,
        text=True,
        env={**env, "AGENTCORE_GATEWAY_ADMIN_TOKEN": "x" * 32},
        timeout=120,
    )
    assert bad.returncode == 2
    assert "--parser: unknown parser 'nope': known parsers are" in bad.stderr


def test_hermes_parses_without_transformers() -> None:
    """The toy policy's stack parses Hermes calls with transformers not importable."""
    code = (
        "import sys; sys.modules['transformers'] = None\n"
        "from agentcore_rollout.gateway.parsers import parse_tool_calls\n"
        "from agentcore_rollout.local.policy import CharRenderer\n"
        'p = parse_tool_calls(\'<tool_call>{"name": "add", "arguments": {}}</tool_call>\')\n'
        "assert p.tool_calls[0]['function']['name'] == 'add'\n"
        "assert CharRenderer().parser.name == 'hermes'\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.stdout.strip() == "ok", done.stderr


# -- multimodal parts ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("part", "error"),
    [
        (
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            "messages[1].content[1] is an image_url part: the gateway's renderer is text-only",
        ),
        (
            {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
            "messages[1].content[1] is an input_audio part: the gateway's renderer is text-only",
        ),
        (
            {"type": "file", "file": {"file_id": "f"}},
            "messages[1].content[1] is a file part: the gateway's renderer is text-only",
        ),
        ("just text", "messages[1].content[1] must be an object with a 'type'"),
        ({"type": "text", "text": 3}, "messages[1].content[1].text must be a string"),
    ],
)
def test_multimodal_parts_are_refused_in_one_line(part: Any, error: str) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "What is this?"}, part]},
    ]
    with pytest.raises(ValueError) as raised:
        normalize_messages(messages)
    assert str(raised.value) == error


def test_text_parts_are_joined() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "input_text", "text": "b"}, {"text": "c"}]
    (message,) = normalize_messages([{"role": "user", "content": parts}])
    assert message["content"] == "abc"
