"""The agents a Harbor task can be rolled out with, as the wrapper (`app.py`) starts them and
the task's image installs them (`HarborAgent.install`).

`oracle` runs the task's `solution/solve.sh` and `nop` does nothing, as in Harbor: neither
calls the model, which is how a pipeline is tested (every task 1.0, every task 0.0). The
coding agents (`clis.py`) run headless, pointed at the gateway (`ctx.llm`) by base URL, key
and model name alone."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..contract import LLMSettings

AGENT_ENV = "AGENTCORE_ROLLOUT_HARBOR_AGENT"
"""The image's agent (its layer sets it): the wrapper runs this one."""
ENVIRONMENT_ENV = "AGENTCORE_ROLLOUT_HARBOR_ENVIRONMENT"
"""The image's environment id (its layer sets it): a payload for another is refused."""


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
    calls_model: bool = True
    """False: it never calls the policy; its rollouts end with an empty trace."""
    needs_solution: bool = False


def _oracle(run: AgentRun) -> Launch:
    return Launch(["bash", str(run.solution / "solve.sh")], dict(run.solution_env))


def _nop(run: AgentRun) -> Launch:
    return Launch(["true"])


ORACLE = HarborAgent("oracle", _oracle, calls_model=False, needs_solution=True)
NOP = HarborAgent("nop", _nop, calls_model=False)


def agents() -> dict[str, HarborAgent]:
    """Every agent, by name."""
    from .clis import CLI_AGENTS

    return {a.name: a for a in (ORACLE, NOP, *CLI_AGENTS)}


def agent_named(name: str) -> HarborAgent:
    """The agent `name`, or a one-line `ValueError` naming the ones there are."""
    known = agents()
    if name not in known:
        raise ValueError(f"no Harbor agent {name!r}: one of {', '.join(sorted(known))}")
    return known[name]
