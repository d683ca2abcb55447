"""veRL 0.9.1 integration (the `[verl]` extra).

- `AgentCoreAgentLoop` (`agent_loop`): a veRL agent loop whose trajectories run as AgentCore
  sessions through one shared engine; groups below `min_group_ok` raise for every member.
- `agent_loop_outputs` (`convert`): an ok outcome -> veRL `AgentLoopOutput` rows, one per sample
  of its token trace, exactly as captured.
- `FiguresReplayBuffer`, `FiguresReplayBufferAsync` (`figures`): veRL's replay buffers, adding
  the engine's `rollout/...` figures to each step's metrics (set by the switch).
"""

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
