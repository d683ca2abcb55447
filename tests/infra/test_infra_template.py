"""The checked-in template: current with the CDK app, and clean under cfn-lint."""

from __future__ import annotations

from pathlib import Path

import pytest
from cfnlint.api import lint

from infra.cdk import app

from .cfn import synth

pytestmark = pytest.mark.component

REGIONS = ["us-east-1", "us-west-2"]


def test_checked_in_template_is_current() -> None:
    assert app.TEMPLATE_PATH.read_text() == app.render(synth()), (
        "infra/template is stale: run `python -m infra.cdk.app`"
    )


def test_regenerate_and_check_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(app, "synthesize", lambda props=None: synth(props))
    assert app.main(["--check", "--out", str(tmp_path)]) == 1  # nothing written yet
    assert app.main(["--out", str(tmp_path)]) == 0
    written = tmp_path / app.TEMPLATE_NAME
    assert written.read_text() == app.TEMPLATE_PATH.read_text()
    assert app.main(["--check", "--out", str(tmp_path)]) == 0
    written.write_text(written.read_text().replace("rollouts", "stale"))
    assert app.main(["--check", "--out", str(tmp_path)]) == 1


def test_cfn_lint_reports_nothing_for_the_target_regions() -> None:
    matches = lint(app.TEMPLATE_PATH.read_text(), regions=REGIONS)
    assert not matches, "\n".join(str(m) for m in matches)
