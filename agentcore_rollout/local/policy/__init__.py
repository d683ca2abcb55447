"""A small CPU policy server for demos and tests: char tokenizer, numpy policy, HTTP server.

Real runs point the gateway at SGLang or vLLM; this lets the whole system run on a laptop without
a GPU, with true sampling log-probs and real policy-gradient updates. It serves SGLang's and
OpenAI's wire shapes (docs/local-stack.md), the toy or a Hugging Face model (`hf`)."""

from .model import Generation, TinyPolicy
from .render import CharRenderer
from .sampling import SamplingParams
from .server import PolicyServer
from .tokenizer import CharTokenizer

__all__ = [
    "CharRenderer",
    "CharTokenizer",
    "Generation",
    "PolicyServer",
    "SamplingParams",
    "TinyPolicy",
]
