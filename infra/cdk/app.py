"""Synthesize the rollout stack to a plain CloudFormation template, with no CDK CLI.

    python -m infra.cdk.app            # rewrite infra/template/agentcore-rollout.template.json
    python -m infra.cdk.app --out DIR  # write the template into DIR instead
    python -m infra.cdk.app --check    # exit 1 if the checked-in template is stale

The template is self-contained: no bootstrap stack, no assets, no CDK metadata, so users without
Node or CDK deploy it with ``aws cloudformation deploy`` (or the console).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import aws_cdk as cdk

from infra.cdk.parameters import RolloutStackProps
from infra.cdk.stack import AgentCoreRolloutStack

STACK_NAME = "AgentCoreRollout"
TEMPLATE_NAME = "agentcore-rollout.template.json"
TEMPLATE_PATH = Path(__file__).resolve().parents[1] / "template" / TEMPLATE_NAME


def build_stack(
    outdir: str | Path, props: RolloutStackProps | None = None
) -> AgentCoreRolloutStack:
    """The stack in a fresh app that adds nothing beyond the template (no bootstrap, no metadata).

    ``outdir`` receives the cloud assembly; the caller owns (and removes) it.
    """
    app = cdk.App(
        analytics_reporting=False,
        builtin_cloud_formation_validation=False,
        outdir=str(outdir),
        context={"aws:cdk:enable-path-metadata": False},
    )
    return AgentCoreRolloutStack(app, STACK_NAME, props, synthesizer=cdk.BootstraplessSynthesizer())


def synthesize(props: RolloutStackProps | None = None) -> dict[str, Any]:
    """The CloudFormation template of the stack, as a dict."""
    with tempfile.TemporaryDirectory(prefix="agentcore-rollout-cdk-") as outdir:
        app = build_stack(outdir, props).node.root
        assert isinstance(app, cdk.App)
        return app.synth().get_stack_by_name(STACK_NAME).template


def render(template: dict[str, Any]) -> str:
    """The checked-in text form: stable across runs, so staleness is a plain string compare."""
    return json.dumps(template, indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write (or, with --check, verify) the synthesized template."""
    parser = argparse.ArgumentParser(prog="python -m infra.cdk.app", description=__doc__)
    parser.add_argument("--out", type=Path, help="directory to write the template into")
    parser.add_argument("--check", action="store_true", help="fail if the template is stale")
    args = parser.parse_args(argv)
    text = render(synthesize())
    target = (args.out / TEMPLATE_NAME) if args.out else TEMPLATE_PATH
    if args.check:
        if not target.is_file() or target.read_text() != text:
            print(f"{target} is stale: run `python -m infra.cdk.app`", file=sys.stderr)
            return 1
        print(f"{target} is up to date")
        return 0
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
