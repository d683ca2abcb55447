"""A small IAM policy evaluator for the features this project's policies use, and no others.

Modelled:

* ``Effect`` Allow and Deny; an explicit Deny in any applicable policy wins;
* ``Action`` and ``Resource`` as a string or a list, with ``*`` (any run of characters, ``/``
  and ``:`` included, or none) and ``?`` (one character); actions match case-insensitively,
  resources case-sensitively;
* ``Principal`` in resource policies: ``"*"``, ``{"AWS": "*" | arn | [...]}``; a ``Service``
  (or any other kind of) principal never matches the IAM role that makes the request;
* ``Condition`` operators ``StringEquals`` (exact, ``*`` is a literal), ``StringLike``
  (wildcards as above) and ``Bool``. Values under one key are OR-ed; keys and operators are
  AND-ed; a key the request context does not carry makes the condition false (as it does for
  every operator without ``...IfExists``).

Anything else (NotAction, NotResource, NotPrincipal, another operator, ``...IfExists``,
``ForAnyValue:``/``ForAllValues:``, policy variables, an unresolved ``${...}``) raises
`Unsupported`, so a policy that starts using a feature this evaluator does not model fails the
tests loudly instead of being judged wrongly.

Not modelled: SCPs, permission boundaries, session policies, ACLs, VPC endpoint policies and
cross-account rules. The decision is the one for a role in the account that owns the bucket
and queue: explicit Deny in the identity policy or the resource's policy -> denied; otherwise
an Allow in either (the resource policy's only for a matching principal) -> allowed; otherwise
implicitly denied.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Document = Mapping[str, Any]


class Unsupported(ValueError):
    """The policy uses an IAM feature this evaluator does not model."""


class Decision(enum.Enum):
    ALLOW = "allow"
    EXPLICIT_DENY = "explicit deny"
    IMPLICIT_DENY = "implicit deny"


@dataclass(frozen=True)
class Request:
    """One authorization request: what IAM sees of an API call."""

    principal: str  # the caller's role ARN
    action: str
    resource: str
    context: Mapping[str, str] = field(default_factory=dict)  # condition keys -> value


@dataclass(frozen=True)
class ResourcePolicy:
    """A bucket or queue policy, and the ARN of the bucket or queue it is attached to."""

    attached_to: str
    document: Document

    def governs(self, resource: str) -> bool:
        """The bucket's policy governs the bucket and its objects; a queue's, the queue."""
        return resource == self.attached_to or resource.startswith(f"{self.attached_to}/")


@dataclass(frozen=True)
class Outcome:
    decision: Decision
    because: tuple[str, ...] = ()  # where the deciding statements sit

    @property
    def allowed(self) -> bool:
        return self.decision is Decision.ALLOW

    def __str__(self) -> str:
        return f"{self.decision.value} ({', '.join(self.because) or 'no statement applies'})"


_UNSUPPORTED_ELEMENTS = ("NotAction", "NotResource", "NotPrincipal")


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def wildcard_match(pattern: str, value: str, *, ignore_case: bool = False) -> bool:
    """IAM's ``*``/``?`` matching (used for Action, Resource and ``StringLike``)."""
    if "${" in pattern:
        raise Unsupported(f"policy variable or unresolved interpolation in {pattern!r}")
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    flags = re.DOTALL | (re.IGNORECASE if ignore_case else 0)
    return re.fullmatch(regex, value, flags) is not None


def _string_equals(expected: str, actual: str) -> bool:
    if "${" in expected:
        raise Unsupported(f"policy variable or unresolved interpolation in {expected!r}")
    return expected == actual


def _bool(expected: str, actual: str) -> bool:
    return str(expected).lower() == str(actual).lower()


_OPERATORS = {
    "StringEquals": _string_equals,
    "StringLike": wildcard_match,
    "Bool": _bool,
}


def _condition_holds(
    condition: Mapping[str, Mapping[str, Any]], context: Mapping[str, str]
) -> bool:
    by_key = {k.lower(): v for k, v in context.items()}  # condition keys are case-insensitive
    for operator, keys in condition.items():
        if operator not in _OPERATORS:
            raise Unsupported(f"condition operator {operator}")
        test = _OPERATORS[operator]
        for key, values in keys.items():
            actual = by_key.get(key.lower())
            if actual is None:
                return False
            if not any(test(str(expected), actual) for expected in _as_list(values)):
                return False
    return True


def _principal_matches(principal: Any, caller: str) -> bool:
    if principal == "*":
        return True
    if not isinstance(principal, Mapping):
        raise Unsupported(f"principal {principal!r}")
    return any(ident in ("*", caller) for ident in _as_list(principal.get("AWS", [])))


def statement_applies(
    statement: Mapping[str, Any], request: Request, *, resource_policy: bool = False
) -> bool:
    """Whether ``statement`` (either effect) matches ``request``."""
    for element in _UNSUPPORTED_ELEMENTS:
        if element in statement:
            raise Unsupported(element)
    if statement.get("Effect") not in ("Allow", "Deny"):
        raise Unsupported(f"effect {statement.get('Effect')!r}")
    if resource_policy:
        if not _principal_matches(statement.get("Principal"), request.principal):
            return False
    elif "Principal" in statement:
        raise Unsupported("Principal in an identity policy")
    if not any(
        wildcard_match(a, request.action, ignore_case=True) for a in _as_list(statement["Action"])
    ):
        return False
    if not any(wildcard_match(r, request.resource) for r in _as_list(statement["Resource"])):
        return False
    return _condition_holds(statement.get("Condition", {}), request.context)


def _statements(document: Document) -> list[Mapping[str, Any]]:
    return _as_list(document["Statement"])


def _label(statement: Mapping[str, Any], where: str, index: int) -> str:
    return f"{where}:{statement.get('Sid', index)}"


def evaluate(
    request: Request,
    identity: Iterable[Document],
    resource_policies: Sequence[ResourcePolicy] = (),
) -> Outcome:
    """The decision for ``request`` under the caller's identity policies and the resource's."""
    allows: list[str] = []
    denies: list[str] = []
    candidates: list[tuple[Mapping[str, Any], str, bool]] = []
    for n, document in enumerate(identity):
        candidates += [
            (s, _label(s, f"identity[{n}]", i), False) for i, s in enumerate(_statements(document))
        ]
    for policy in resource_policies:
        if policy.governs(request.resource):
            where = f"policy of {policy.attached_to}"
            candidates += [
                (s, _label(s, where, i), True) for i, s in enumerate(_statements(policy.document))
            ]
    for statement, label, on_resource in candidates:
        if statement_applies(statement, request, resource_policy=on_resource):
            (denies if statement["Effect"] == "Deny" else allows).append(label)
    if denies:
        return Outcome(Decision.EXPLICIT_DENY, tuple(denies))
    if allows:
        return Outcome(Decision.ALLOW, tuple(allows))
    return Outcome(Decision.IMPLICIT_DENY)
