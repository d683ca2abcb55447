"""Agent side: what runs inside an AgentCore session (needs the `[agent]` extra)."""

from .app import RolloutApp, RolloutContext, RolloutOutput
from .writer import ResultWriter

__all__ = ["ResultWriter", "RolloutApp", "RolloutContext", "RolloutOutput"]
