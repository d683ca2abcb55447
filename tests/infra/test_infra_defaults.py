"""AgentCore's published defaults have one definition, `agentcore_rollout.runtimes.agentcore`; the
checked-in template and the Terraform variables cannot import it, so they are checked here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentcore_rollout.runtimes.agentcore.published import IDLE_TIMEOUT_S, MAX_LIFETIME_S

from .tf import load_module, snake

pytestmark = pytest.mark.unit

TEMPLATE = Path(__file__).resolve().parents[2] / "infra/template/agentcore-rollout.template.json"
DEFAULTS = {"IdleRuntimeSessionTimeout": IDLE_TIMEOUT_S, "MaxLifetime": MAX_LIFETIME_S}


@pytest.mark.parametrize(("parameter", "value"), DEFAULTS.items())
def test_the_template_and_terraform_defaults_are_agentcores(parameter: str, value: int) -> None:
    assert json.loads(TEMPLATE.read_text())["Parameters"][parameter]["Default"] == value
    assert load_module().variables[snake(parameter)]["default"] == value
