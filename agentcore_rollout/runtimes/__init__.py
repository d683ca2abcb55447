"""The sandbox seam: where sessions run. `SandboxRuntime` is what the engine needs of one;
AgentCore's (`agentcore.py`) and an in-process one implement it."""

from .base import RuntimeLimits, SandboxRuntime, SessionCallError
from .inprocess import InProcessRuntime

__all__ = [
    "InProcessRuntime",
    "RuntimeLimits",
    "SandboxRuntime",
    "SessionCallError",
]
