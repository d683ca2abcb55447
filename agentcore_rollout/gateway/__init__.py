"""Token-capture gateway: the OpenAI-compatible endpoint rollout agents call for the policy.

    backend = SGLangBackend(router.url)                  # or a worker URL; OpenAIBackend(url)
    async with Gateway(backend, HFRenderer.from_pretrained(path)) as gateway:
        async with GatewayAdmin(gateway.url, gateway.admin_token) as admin:
            session = await admin.create_session("req-1", sampling={"temperature": 1.0})
            # the agent: OpenAI(base_url=f"{gateway.url}/v1", api_key=session.api_key)
            trace = await admin.finish_session(session.session_id)

Modules, one concept each: `server` (the aiohttp app and its routes), `sessions` (per-session
keys, limits, expiry), `render` (messages <-> token ids, tool-call parsing), `backends` (SGLang
/generate with log-probs; OpenAI pass-through), `sampling` (which sampling fields pass, and how),
`trajectory` (turns -> training samples with loss masks), `router` (sglang-router as a managed
subprocess), `client` (the engine's admin client, and the trace's JSON shape).

Needs the [gateway] extra for the Hugging Face renderer (transformers, tokenizers) and the router
(sglang-router); the server itself needs only aiohttp.
"""

from .backends import Backend, BackendError, Completion, OpenAIBackend, SGLangBackend, TurnRequest
from .client import GatewayAdmin, GatewayError, GatewaySession
from .render import CharRenderer, HFRenderer, Parsed, Renderer
from .router import RouterError, SGLangRouter
from .server import Gateway
from .trajectory import Sample, Trajectory, Turn

__all__ = [
    "Backend",
    "BackendError",
    "CharRenderer",
    "Completion",
    "Gateway",
    "GatewayAdmin",
    "GatewayError",
    "GatewaySession",
    "HFRenderer",
    "OpenAIBackend",
    "Parsed",
    "Renderer",
    "RouterError",
    "SGLangBackend",
    "SGLangRouter",
    "Sample",
    "Trajectory",
    "Turn",
    "TurnRequest",
]
