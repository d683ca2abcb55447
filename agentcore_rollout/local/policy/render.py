"""CharRenderer: the gateway's renderer for the toy policy (`CharTokenizer` and its ChatML). It
lives with the policy, not in the gateway, so the gateway knows no particular model: the stack
plugs it in by import path, as any other model's renderer is."""

from __future__ import annotations

import json
from collections.abc import Sequence

from ...gateway.render import AnchoredRenderer, Message, Tools
from .tokenizer import IM_START, IM_START_ID, CharTokenizer, chatml


class CharRenderer(AnchoredRenderer):
    """Renders exactly what the policy server's own /v1/chat/completions renders, so the gateway
    and a direct call see the same prompt. That template has no tools slot: tools, if given, are
    described in the system message (Qwen's wording), after an existing one's content.

    Incremental renders anchor at `<|im_start|>`: the tokenizer maps each character on its own
    and splits out special tokens, none of which overlaps another, so any such split is exact.
    """

    name = "char"

    def __init__(self, tokenizer: CharTokenizer | None = None) -> None:
        self.tokenizer = tokenizer or CharTokenizer()
        self.stop_token_ids = (self.tokenizer.eos_token_id,)
        self.anchors = {IM_START: IM_START_ID}

    def render_text(self, messages: list[Message], tools: Tools) -> str:
        if tools:
            block = "# Tools\n<tools>\n" + "\n".join(json.dumps(t) for t in tools) + "\n</tools>"
            if messages[0]["role"] == "system":
                content = messages[0].get("content") or ""
                messages = [{**messages[0], "content": f"{content}\n\n{block}"}, *messages[1:]]
            else:
                messages = [{"role": "system", "content": block}, *messages]
        return chatml(messages)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.token_text(token_id)
