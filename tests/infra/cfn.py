"""Helpers to read CloudFormation templates: policy statements, references, intrinsics.

Shared by the template, moto and Terraform-parity tests so each reads policies the same way.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from infra.cdk.app import synthesize
from infra.cdk.parameters import RolloutStackProps

Template = dict[str, Any]
Statement = dict[str, Any]


@functools.cache
def _synth_cached(props: RolloutStackProps | None) -> Template:
    return synthesize(props)


def synth(props: RolloutStackProps | None = None) -> Template:
    """The synthesized template for ``props``, synthesized once per test session."""
    return _synth_cached(props)


def as_list(value: Any) -> list[Any]:
    """CloudFormation allows a scalar where a list is meant (Action, Resource, ...)."""
    return value if isinstance(value, list) else [value]


def policy_documents(template: Template) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every IAM policy document the template writes, with where it sits."""
    for logical_id, resource in template["Resources"].items():
        props = resource.get("Properties", {})
        if "PolicyDocument" in props:
            yield logical_id, props["PolicyDocument"]
        if "AssumeRolePolicyDocument" in props:
            yield f"{logical_id}.trust", props["AssumeRolePolicyDocument"]
        for policy in props.get("Policies", []):
            yield f"{logical_id}.{policy['PolicyName']}", policy["PolicyDocument"]


def statements(document: Mapping[str, Any]) -> list[Statement]:
    return as_list(document["Statement"])


def actions(statement: Statement) -> list[str]:
    return as_list(statement.get("Action", []))


def resources_of_type(template: Template, resource_type: str) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in template["Resources"].items() if v["Type"] == resource_type}


def one_resource(template: Template, resource_type: str) -> tuple[str, dict[str, Any]]:
    """The only resource of ``resource_type`` (fails the test if there are more or none)."""
    found = resources_of_type(template, resource_type)
    assert len(found) == 1, f"expected one {resource_type}, found {sorted(found)}"
    return next(iter(found.items()))


def references(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[str, tuple[Any, ...]]]:
    """(logical id, path) of every Ref / Fn::GetAtt in ``value``; path includes Fn::If steps."""
    if isinstance(value, dict):
        if "Ref" in value and isinstance(value["Ref"], str):
            yield value["Ref"], path
        if "Fn::GetAtt" in value:
            target = value["Fn::GetAtt"]
            yield (target[0] if isinstance(target, list) else target.split(".")[0]), path
        for key, child in value.items():
            yield from references(child, (*path, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from references(child, (*path, index))


class Resolver:
    """Evaluates the intrinsics this template uses, the way CloudFormation would.

    ``refs`` maps parameters, pseudo parameters and logical ids to values; ``attrs`` maps
    (logical id, attribute) to values. Used to apply what moto's CloudFormation skips.
    """

    def __init__(
        self,
        refs: Mapping[str, Any],
        attrs: Mapping[tuple[str, str], Any],
        conditions: Mapping[str, bool],
    ) -> None:
        self.refs, self.attrs, self.conditions = refs, attrs, conditions
        self._functions: dict[str, Callable[[Any], Any]] = {
            "Ref": lambda arg: self.refs[arg],
            "Fn::GetAtt": lambda arg: self.attrs[tuple(arg)],
            "Fn::Join": lambda arg: arg[0].join(self(arg[1])),
            "Fn::Split": lambda arg: self(arg[1]).split(arg[0]),
            "Fn::Select": lambda arg: self(arg[1])[int(arg[0])],
            "Fn::If": lambda arg: self(arg[1] if self.conditions[arg[0]] else arg[2]),
        }

    def __call__(self, value: Any) -> Any:
        if isinstance(value, dict):
            if len(value) == 1:
                ((name, arg),) = value.items()
                if name in self._functions:
                    return self._functions[name](arg)
            return {k: self(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self(v) for v in value]
        return value
