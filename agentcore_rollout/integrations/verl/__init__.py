"""veRL 0.9.1 integration (the `[verl]` extra): an agent loop whose trajectories run as AgentCore
sessions (`agent_loop`), outcomes as veRL rows (`convert`), and the engine's figures in veRL's
step metrics (`figures`). docs/verl.md is the guide."""

from .agent_loop import AgentCoreAgentLoop, AgentCoreSettings, EngineService, GroupFailed
from .convert import ConversionError, agent_loop_outputs

__all__ = [
    "AgentCoreAgentLoop",
    "AgentCoreSettings",
    "ConversionError",
    "EngineService",
    "GroupFailed",
    "agent_loop_outputs",
]
