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


# Evaluating the module's expressions for one concrete deployment (the IAM evaluation tests).


class HclUnsupported(ValueError):
    """An expression outside the small subset `evaluate_hcl` understands."""


def _split_interpolations(text: str) -> list[tuple[bool, str]]:
    """``"a${x}b"`` -> ``[(False, "a"), (True, "x"), (False, "b")]`` (nesting-aware)."""
    parts: list[tuple[bool, str]] = []
    literal_start = i = 0
    while (start := text.find("${", i)) != -1:
        depth, j = 0, start + 1
        for j in range(start + 1, len(text)):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            if depth == 0:
                break
        else:
            raise HclUnsupported(f"unbalanced interpolation in {text!r}")
        if start > literal_start:
            parts.append((False, text[literal_start:start]))
        parts.append((True, text[start + 2 : j]))
        literal_start = i = j + 1
    if literal_start < len(text) or not parts:
        parts.append((False, text[literal_start:]))
    return parts


def _split_top(text: str, separator: str) -> list[str]:
    """Split on ``separator`` outside brackets, parentheses, braces and string literals."""
    parts, depth, in_string, start = [], 0, False, 0
    for i, char in enumerate(text):
        if char == '"':
            in_string = not in_string
        elif in_string:
            continue
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif depth == 0 and text.startswith(separator, i):
            parts.append(text[start:i])
            start = i + len(separator)
    parts.append(text[start:])
    return [p.strip() for p in parts]


def _flatten(value: Any) -> list[Any]:
    if not isinstance(value, list):
        return [value]
    return [item for element in value for item in _flatten(element)]


_REFERENCE = re.compile(r"[A-Za-z_][\w-]*(?:\.[\w-]+|\[\*\])*")


def evaluate_hcl(value: Any, refs: dict[str, Any], module: Module) -> Any:
    """Evaluate an hcl2-serialized value for concrete ``refs`` (``"var.x"``, ``"aws_s3_bucket
    .results.arn"``, ...), expanding ``local.*`` from the module.

    The subset this module's policies use: strings with ``${...}`` interpolations, references,
    string literals, lists, ``cond ? a : b``, ``flatten(...)`` and ``[for x in xs : body]``.
    Anything else raises `HclUnsupported`, as does a reference missing from ``refs``.
    """
    return _Hcl(refs, module).value(value, {})


@dataclass
class _Hcl:
    refs: dict[str, Any]
    module: Module

    def value(self, value: Any, scope: dict[str, Any]) -> Any:
        if isinstance(value, list):
            return [self.value(v, scope) for v in value]
        if isinstance(value, str):
            return self.template(value, scope)
        return value

    def template(self, text: str, scope: dict[str, Any]) -> Any:
        parts = _split_interpolations(text)
        if len(parts) == 1 and parts[0][0]:
            return self.expr(parts[0][1], scope)  # "${expr}": the value itself, lists included
        return "".join(str(self.expr(p, scope)) if is_expr else p for is_expr, p in parts)

    def expr(self, text: str, scope: dict[str, Any]) -> Any:
        text = text.strip()
        if len(question := _split_top(text, "?")) == 2:
            branches = _split_top(question[1], ":")
            if len(branches) != 2:
                raise HclUnsupported(text)
            condition = self.expr(question[0], scope)
            if not isinstance(condition, bool):
                raise HclUnsupported(f"condition {question[0]!r} is {condition!r}, not a bool")
            return self.expr(branches[0] if condition else branches[1], scope)
        if text.startswith("flatten(") and text.endswith(")"):
            return _flatten(self.expr(text[len("flatten(") : -1], scope))
        if text.startswith("[") and text.endswith("]"):
            inner = text[1:-1].strip()
            if inner.startswith("for "):
                head, _, rest = inner[4:].partition(" in ")
                collection_body = _split_top(rest, ":")
                if not head.strip().isidentifier() or len(collection_body) != 2:
                    raise HclUnsupported(text)
                collection, body = collection_body
                return [
                    self.expr(body, {**scope, head.strip(): item})
                    for item in self.expr(collection, scope)
                ]
            return [self.expr(item, scope) for item in _split_top(inner, ",") if item]
        if text.startswith('"') and text.endswith('"'):
            return self.template(text[1:-1], scope)
        if text in ("true", "false"):
            return text == "true"
        if _REFERENCE.fullmatch(text):
            return self.reference(text, scope)
        raise HclUnsupported(text)

    def reference(self, name: str, scope: dict[str, Any]) -> Any:
        if name in scope:
            return scope[name]
        if name.startswith("local."):
            return self.template(str(self.module.locals[name.removeprefix("local.")]), scope)
        if name not in self.refs:
            raise HclUnsupported(f"no value given for {name}")
        return self.refs[name]


def policy_json(module: Module, name: str, refs: dict[str, Any]) -> dict[str, Any]:
    """The JSON policy ``data.aws_iam_policy_document.<name>`` renders, for concrete ``refs``."""
    rendered = []
    for statement in module.policy(name):
        for element in ("not_actions", "not_resources", "not_principals"):
            if element in statement:
                raise HclUnsupported(f"{name}: {element}")
        out: dict[str, Any] = {
            "Effect": statement.get("effect", "Allow"),
            "Action": evaluate_hcl(statement["actions"], refs, module),
            "Resource": _flatten(evaluate_hcl(statement["resources"], refs, module)),
        }
        if "sid" in statement:
            out["Sid"] = statement["sid"]
        for principal in statement.get("principals", []):
            identifiers = evaluate_hcl(principal["identifiers"], refs, module)
            if principal["type"] == "*":
                out["Principal"] = "*"
            else:
                out.setdefault("Principal", {}).setdefault(principal["type"], []).extend(
                    identifiers
                )
        for condition in statement.get("condition", []):
            keys = out.setdefault("Condition", {}).setdefault(condition["test"], {})
            if condition["variable"] in keys:
                raise HclUnsupported(f"{name}: two {condition['test']} blocks on one key")
            keys[condition["variable"]] = evaluate_hcl(condition["values"], refs, module)
        rendered.append(out)
    return {"Version": "2012-10-17", "Statement": rendered}
