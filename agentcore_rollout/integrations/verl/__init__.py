"""veRL 0.9.1 integration (the `[verl]` extra).

So far: `convert` turns an ok outcome into veRL `AgentLoopOutput` rows, one per sample of its
token trace. The agent loop, the gateway backend through veRL's server manager and the
`rollout.mode=agentcore` switch are not built yet.
"""

from .convert import ConversionError, agent_loop_outputs

__all__ = ["ConversionError", "agent_loop_outputs"]
