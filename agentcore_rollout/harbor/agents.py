"""The agents a Harbor task can be rolled out with, as the wrapper (`app`) starts them and the
task's image installs them. `oracle` and `nop` never call the model, as in Harbor: how a pipeline
is tested (every task 1.0, every task 0.0); the coding agents (`clis`) run headless, pointed at
the gateway by base URL, key and model name alone."""

from __future__ import annotations

from .clis import CLI_AGENTS
from .launch import AgentRun, HarborAgent, Launch

__all__ = ["AgentRun", "HarborAgent", "Launch", "agent_named", "agents"]

AGENT_ENV = "AGENTCORE_ROLLOUT_HARBOR_AGENT"
"""The image's agent (its layer sets it): the wrapper runs this one."""
ENVIRONMENT_ENV = "AGENTCORE_ROLLOUT_HARBOR_ENVIRONMENT"
"""The image's environment id (its layer sets it): a payload for another is refused."""


def _oracle(run: AgentRun) -> Launch:
    return Launch(["bash", str(run.solution / "solve.sh")], dict(run.solution_env))


def _nop(run: AgentRun) -> Launch:
    return Launch(["true"])


ORACLE = HarborAgent("oracle", _oracle, calls_model=False, needs_solution=True)
NOP = HarborAgent("nop", _nop, calls_model=False)


def agents() -> dict[str, HarborAgent]:
    """Every agent, by name."""
    return {a.name: a for a in (ORACLE, NOP, *CLI_AGENTS)}


def agent_named(name: str) -> HarborAgent:
    """The agent `name`, or a one-line `ValueError` naming the ones there are."""
    known = agents()
    if name not in known:
        raise ValueError(f"no Harbor agent {name!r}: one of {', '.join(sorted(known))}")
    return known[name]
