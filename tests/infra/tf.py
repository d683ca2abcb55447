"""Reading the Terraform module with python-hcl2, and putting it side by side with the template.

CloudFormation intrinsics are resolved into Terraform's own expressions (``${var.x}``,
``${aws_s3_bucket.results.arn}``), and Terraform locals are expanded, so a policy statement
of either form reduces to the same comparable signature.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hcl2

from .cfn import Resolver, Template, actions, as_list

MODULE_DIR = Path(__file__).resolve().parents[2] / "infra" / "terraform"
_OPTIONS = hcl2.SerializationOptions(
    strip_string_quotes=True, explicit_blocks=False, with_comments=True
)

# The template's resources and their Terraform twins.
COUNTERPARTS = {
    "ResultsBucket": "aws_s3_bucket.results",
    "NotificationQueue": "aws_sqs_queue.notifications",
    "DeadLetterQueue": "aws_sqs_queue.dead_letter",
    "AgentRepository": "aws_ecr_repository.agent",
    "RuntimeRole": "aws_iam_role.runtime",
    "TrainerPolicy": "aws_iam_policy.trainer",
    "Runtime": "aws_bedrockagentcore_agent_runtime.this",
}
# Stand-in for AWS::StackId: its UUID makes the bucket name, which Terraform generates instead.
_STACK_ID = "arn:aws:cloudformation:r:a:stack/s/STACKUUID-0000"


@dataclass
class Module:
    """The blocks of all ``*.tf`` files, keyed the Terraform way."""

    resources: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    data: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    variables: dict[str, dict[str, Any]] = field(default_factory=dict)
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    locals: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)

    def resource(self, address: str) -> dict[str, Any]:
        kind, name = address.split(".")
        return self.resources[kind][name]

    def policy(self, name: str) -> list[dict[str, Any]]:
        return self.data["aws_iam_policy_document"][name]["statement"]

    def expand(self, value: Any) -> Any:
        """Replace ``${local.x}`` by the local's expression until none is left."""
        if isinstance(value, list):
            return [self.expand(v) for v in value]
        if not isinstance(value, str):
            return value
        while match := re.search(r"\$\{local\.(\w+)\}", value):
            value = value.replace(match.group(0), str(self.locals[match.group(1)]), 1)
        return value


def load_module(directory: Path = MODULE_DIR) -> Module:
    module = Module()
    for path in sorted(directory.glob("*.tf")):
        with path.open() as handle:
            parsed = hcl2.load(handle, serialization_options=_OPTIONS)
        for block in parsed.get("resource", []):
            for kind, named in block.items():
                module.resources.setdefault(kind, {}).update(named)
        for block in parsed.get("data", []):
            for kind, named in block.items():
                module.data.setdefault(kind, {}).update(named)
        for block in parsed.get("variable", []):
            module.variables.update(block)
        for block in parsed.get("output", []):
            module.outputs.update(block)
        for block in parsed.get("locals", []):
            module.locals.update({k: v for k, v in block.items() if k != "__comments__"})
        for block in parsed.get("terraform", []):
            module.settings.update(block)
    return module


def snake(name: str) -> str:
    """``ResultExpirationDays`` -> ``result_expiration_days`` (CFN parameter -> TF variable)."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def cfn_resolver(template: Template) -> Resolver:
    """Resolves the template into Terraform expressions (with the runtime disabled)."""
    refs: dict[str, Any] = {name: f"${{var.{snake(name)}}}" for name in template["Parameters"]}
    refs |= {
        "AWS::Partition": "${data.aws_partition.current.partition}",
        "AWS::Region": "${data.aws_region.current.region}",
        "AWS::AccountId": "${data.aws_caller_identity.current.account_id}",
        "AWS::URLSuffix": "amazonaws.com",
        "AWS::StackId": _STACK_ID,
        "ResultsBucket": "${aws_s3_bucket.results.id}",
        "NotificationQueue": "${aws_sqs_queue.notifications.id}",
        "DeadLetterQueue": "${aws_sqs_queue.dead_letter.id}",
    }
    attrs = {
        (logical_id, "Arn"): f"${{{address}.arn}}" for logical_id, address in COUNTERPARTS.items()
    }
    conditions = {"RuntimeEnabled": False, "UseVpc": False, "HasGatewayUrl": False}
    return Resolver(refs, attrs, conditions)


def cfn_bucket_arn(template: Template) -> str:
    """What the template's bucket ARN resolves to, so it can be named as Terraform names it."""
    name = template["Resources"]["ResultsBucket"]["Properties"]["BucketName"]
    return f"arn:${{data.aws_partition.current.partition}}:s3:::{cfn_resolver(template)(name)}"


Signature = tuple[str, frozenset[str], frozenset[tuple[str, str]], frozenset[tuple[str, str]], Any]


def cfn_signature(statement: dict[str, Any], resolve: Resolver, bucket_arn: str) -> Signature:
    """(effect, actions, principals, condition keys, resources) of a template statement."""
    principal = statement.get("Principal", {})
    principals = frozenset(
        (kind, ident) for kind, idents in principal.items() for ident in as_list(idents)
    )
    conditions = frozenset(
        (op, key) for op, keys in statement.get("Condition", {}).items() for key in keys
    )
    resources = frozenset(
        str(r).replace(bucket_arn, "${aws_s3_bucket.results.arn}")
        for r in as_list(resolve(statement.get("Resource", [])))
    )
    return (statement["Effect"], frozenset(actions(statement)), principals, conditions, resources)


def tf_signature(statement: dict[str, Any], module: Module) -> Signature:
    """The same signature for an ``aws_iam_policy_document`` statement block."""
    principals = frozenset(
        (p["type"], ident) for p in statement.get("principals", []) for ident in p["identifiers"]
    )
    conditions = frozenset((c["test"], c["variable"]) for c in statement.get("condition", []))
    raw = statement.get("resources", [])
    # A conditional expression (the trainer's runtime ARNs) stays an expression.
    resources = frozenset(module.expand(raw)) if isinstance(raw, list) else module.expand(raw)
    return (
        statement.get("effect", "Allow"),
        frozenset(statement["actions"]),
        principals,
        conditions,
        resources,
    )
