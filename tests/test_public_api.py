"""The public face: what `agentcore_rollout` exports, and that nothing meant for users (README,
docs, examples, the CLI) reaches into the internals."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

import agentcore_rollout
import agentcore_rollout.agent
import agentcore_rollout.training

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "agentcore_rollout"

TRAINER_API = {
    "ConfigError",
    "ContractError",
    "EngineConfig",
    "EngineStats",
    "LateResult",
    "Outcome",
    "RolloutBatch",
    "RolloutTally",
    "RolloutCost",
    "RolloutEngine",
    "RolloutHandle",
    "RolloutOutcome",
    "RolloutRequest",
    "RolloutStart",
    "SandboxRuntime",
    "SessionCallError",
    "load_config",
}
AGENT_API = {
    "AgentTimeout",
    "ResultWriter",
    "RolloutApp",
    "RolloutContext",
    "RolloutOutput",
    "VerifierError",
}
TRAINING_API = {
    "Group",
    "GroupPolicy",
    "GroupRollout",
    "GroupStatus",
    "TrainingSample",
    "collect_groups",
    "group_samples",
    "grpo_advantages",
    "outcome_samples",
    "training_samples",
    "within_staleness",
    "staleness_report",
}


def test_the_package_exports_the_trainer_api_and_nothing_else():
    assert set(agentcore_rollout.__all__) == TRAINER_API
    assert all(getattr(agentcore_rollout, name) for name in TRAINER_API)
    assert set(agentcore_rollout.agent.__all__) == AGENT_API
    assert set(agentcore_rollout.training.__all__) == TRAINING_API


def test_engine_exposes_no_internals():
    public = {n for n in vars(agentcore_rollout.RolloutEngine) if not n.startswith("_")}
    assert public == {
        "aclose",
        "reclaim",
        "resume",
        "rollout",
        "set_step",
        "start",
        "stats",
        "step",
        "stream",
        "submit",
        "take_late",
        "warm",
    }


def test_readme_docs_and_examples_use_only_the_public_api():
    pages = [ROOT / "README.md", *sorted(ROOT.glob("docs/*.md"))]
    texts = {p: p.read_text() for p in [*pages, *ROOT.glob("examples/**/*.py")]}
    for path, text in texts.items():
        assert not re.search(r"agentcore_rollout\._|agentcore_rollout\.(engine|buffer)\b", text), (
            path
        )
        assert not re.search(r"\bengine\._?(dispatcher|buffer)\b|\bbuffer\.(late|step)\b", text), (
            path
        )


def test_cli_imports_only_the_public_api():
    imported, texts = set(), []
    for path in sorted((PACKAGE / "cli").glob("*.py")):
        texts.append(path.read_text())
        for node in ast.walk(ast.parse(texts[-1])):
            if isinstance(node, ast.ImportFrom) and node.level:
                relative = "." * node.level + (node.module or "")
                imported.add(importlib.util.resolve_name(relative, "agentcore_rollout.cli"))
            elif isinstance(node, ast.Import):
                imported |= {a.name for a in node.names if a.name.startswith("agentcore_rollout")}
    # As seen from the package: `.` is the trainer API, `.cli.*` the CLI's own modules.
    imported = {"." + name.removeprefix("agentcore_rollout").lstrip(".") for name in imported}
    imported = {name for name in imported if name != ".cli" and not name.startswith(".cli.")}
    # The local stack serves the CLI's own subcommands (`local up`, `run` on the embedded
    # stack), not the engine. `train` runs the local trainer (`.local.trainer`, `.training`).
    allowed = {".", ".contract", ".local.stack", ".local.trainer", ".training"}
    # Its config file: read by the core's loader, its `local` and `train` sections the stack's.
    allowed |= {".config", ".local.config"}
    allowed |= {".local.containers"}  # `local build`: the agent's image
    allowed |= {".integrations.verl.switch"}  # `verl`: veRL's main_ppo, the switch translated
    allowed |= {
        ".runtimes.agentcore.published"
    }  # `deploy`'s defaults: AgentCore's published ones, once
    allowed |= {".harbor.tasks", ".harbor.agents", ".harbor.images"}  # Harbor tasks, their images
    assert imported <= allowed, imported
    assert not any(re.search(r"\._(dispatcher|buffer|stats|batch)\b", text) for text in texts)
