"""agentcore-rollout: a decoupled rollout engine for RL training of LLM agents.

The trainer hands `RolloutEngine` a batch of `RolloutRequest`s; each runs as its own
AgentCore Runtime session; results come back through S3 and SQS as a `RolloutBatch`.
"""

from ._buffer import Delivery, RolloutBuffer
from ._dispatcher import RequestDispatcher, SubmitFailed
from .config import Config, ConfigError, EngineConfig, load_config
from .contract import ContractError, Outcome, RolloutControl, RolloutResult
from .engine import RolloutBatch, RolloutEngine, RolloutHandle, RolloutOutcome, RolloutRequest
from .sandbox import AgentCoreRuntime, SandboxRuntime, SessionCallError

__version__ = "0.1.0"

__all__ = [
    "AgentCoreRuntime",
    "Config",
    "ConfigError",
    "ContractError",
    "Delivery",
    "EngineConfig",
    "Outcome",
    "RequestDispatcher",
    "RolloutBatch",
    "RolloutBuffer",
    "RolloutControl",
    "RolloutEngine",
    "RolloutHandle",
    "RolloutOutcome",
    "RolloutRequest",
    "RolloutResult",
    "SandboxRuntime",
    "SessionCallError",
    "SubmitFailed",
    "load_config",
]
