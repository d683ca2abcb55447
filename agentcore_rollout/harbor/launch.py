"""What an agent is to the wrapper: how its process is launched (`Launch`) from a rollout's
facts (`AgentRun`), and how the task's image installs it (`HarborAgent`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..contract import LLMSettings


@dataclass(frozen=True)
class Launch:
    """What the agent's process is started with: argv, and its environment on top of the
    wrapper's own PATH and the TLS trust variables."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class AgentRun:
    """What an agent's launch is made from."""

    instruction: str
    llm: LLMSettings | None
    workdir: Path
    """The task's working directory (the image's WORKDIR): where the agent works."""
    home: Path
    """A fresh, empty directory for the agent's own configuration (its HOME)."""
    solution: Path
    """Where the task's solution was written (empty for any agent but `oracle`)."""
    solution_env: dict[str, str] = field(default_factory=dict)
    llm_headers: dict[str, str] = field(default_factory=dict)
    """Headers each call to the policy should carry: the rollout's `traceparent`, when the
    engine exports traces, so the gateway's turns join the agent's span."""


@dataclass(frozen=True)
class HarborAgent:
    """One agent: how its image layer installs it and how the wrapper starts it."""

    name: str
    launch: Callable[[AgentRun], Launch]
    version: str = ""
    """The pinned version the layer installs ("" for `oracle` and `nop`)."""
    install: tuple[str, ...] = ()
    """Dockerfile lines of the image's layer (run as root, on the task's image, after the
    wrapper's own install)."""
    shared: tuple[str, ...] = ()
    """What `install` makes that a task's layer may copy from the wrapper's image, where it
    was installed once (`harbor/images.py`); empty: the layer runs `install` itself."""
    runtime: tuple[str, ...] = ()
    """Dockerfile lines the copied install still needs on the task's image (Node for npm's)."""
    calls_model: bool = True
    """False: it never calls the policy; its rollouts end with an empty trace."""
    needs_solution: bool = False
