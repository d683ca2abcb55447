"""The sandbox seam: where sessions run. `SandboxRuntime` is what the engine needs of one;
AgentCore's (`agentcore.py`), this machine's containers and an in-process one implement it."""

from .base import RuntimeLimits, SandboxRuntime, SessionCallError
from .containers import ContainerRuntime
from .inprocess import InProcessRuntime

__all__ = [
    "ContainerRuntime",
    "InProcessRuntime",
    "RuntimeLimits",
    "SandboxRuntime",
    "SessionCallError",
]
