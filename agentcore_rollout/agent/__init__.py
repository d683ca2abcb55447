"""Agent side: what runs inside an AgentCore session (needs the `[agent]` extra)."""

from .app import AgentTimeout, RolloutApp, RolloutContext, RolloutOutput, VerifierError
from .writer import ResultWriter

__all__ = [
    "AgentTimeout",
    "ResultWriter",
    "RolloutApp",
    "RolloutContext",
    "RolloutOutput",
    "VerifierError",
]
