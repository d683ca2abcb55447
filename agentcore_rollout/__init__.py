"""agentcore-rollout: a decoupled rollout engine for RL training of LLM agents.

This module is the trainer's API: `RolloutEngine` runs each `RolloutRequest` as its own sandbox
session and gives back a `RolloutOutcome` per request. Agent authors use
`agentcore_rollout.agent`; the wire contract is `agentcore_rollout.contract`. Modules whose
names start with `_` are internal."""

from ._batch import (
    LateResult,
    RolloutBatch,
    RolloutOutcome,
    RolloutRequest,
    RolloutStart,
    RolloutTally,
)
from ._cost import RolloutCost
from ._engine.engine import RolloutEngine, RolloutHandle
from ._stats import EngineStats
from .config import ConfigError, EngineConfig, load_config
from .contract import ContractError, Outcome
from .runtimes.base import SandboxRuntime, SessionCallError

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "ContractError",
    "EngineConfig",
    "EngineStats",
    "LateResult",
    "Outcome",
    "RolloutBatch",
    "RolloutCost",
    "RolloutEngine",
    "RolloutHandle",
    "RolloutOutcome",
    "RolloutRequest",
    "RolloutStart",
    "RolloutTally",
    "SandboxRuntime",
    "SessionCallError",
    "load_config",
]
