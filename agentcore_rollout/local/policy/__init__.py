"""A small CPU policy server for demos and tests: char tokenizer, numpy policy, HTTP server.

Real runs point the gateway at SGLang or vLLM; this package lets the whole system run on a laptop
without a GPU, with true sampling log-probs and real (CPU) policy-gradient updates:

    async with PolicyServer(seed=0) as server:   # SGLang /generate + OpenAI APIs on server.url
        ...

    python -m agentcore_rollout.local.policy --port 30000 [--params FILE] [--seed S] [--record]

See `model` for what the policy is (and is not), `sampling` for what the log-probs mean,
`server` (and `openai_api`) for the endpoints, `worker` for how generations, weight loads and
aborts run, and `render` for `CharRenderer`, the gateway's renderer for it.
"""

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
