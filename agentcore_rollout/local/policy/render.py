"""CharRenderer: the gateway's renderer for the toy policy (`CharTokenizer` and its ChatML).

It lives with the policy, not in the gateway, so that the gateway knows no particular model: the
local stack plugs it in with `--renderer agentcore_rollout.local.policy.render:CharRenderer`, the
way any other model's renderer is plugged in.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ...gateway.render import TextRenderer, normalize_messages
from .tokenizer import CharTokenizer


class CharRenderer(TextRenderer):
    """The toy policy's `CharTokenizer` and its ChatML rendering (see `tokenizer`).

    Renders exactly what the policy server's own /v1/chat/completions renders, so the gateway and
    a direct call see the same prompt. That template has no tools slot: tools, if given, are
    described in the system message (Qwen's wording), prepended to an existing one.
    """

    name = "char"

    def __init__(self, tokenizer: CharTokenizer | None = None) -> None:
        self.tokenizer = tokenizer or CharTokenizer()
        self.stop_token_ids = (self.tokenizer.eos_token_id,)

    def render(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None
    ) -> list[int]:
        norm = normalize_messages(messages)
        if tools:
            block = "# Tools\n<tools>\n" + "\n".join(json.dumps(t) for t in tools) + "\n</tools>"
            if norm[0]["role"] == "system":
                norm[0] = {**norm[0], "content": f"{norm[0].get('content') or ''}\n\n{block}"}
            else:
                norm.insert(0, {"role": "system", "content": block})
        return self.tokenizer.apply_chat_template(norm, add_generation_prompt=True)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.token_text(token_id)
