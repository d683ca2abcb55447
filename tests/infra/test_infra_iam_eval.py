"""The IAM evaluator and the HCL expression subset the trainer-access tests rely on.

Each case is a documented IAM rule, so a wrong evaluator cannot make those tests pass.
"""

from __future__ import annotations

from typing import Any

import pytest

from .iam_eval import Decision, Request, ResourcePolicy, Unsupported, evaluate, wildcard_match
from .tf import HclUnsupported, Module, evaluate_hcl

pytestmark = pytest.mark.unit

ROLE = "arn:aws:iam::123456789012:role/trainer"
BUCKET = "arn:aws:s3:::b"
TLS = {"aws:SecureTransport": "true"}


def _allow(action: Any, resource: Any, condition: dict[str, Any] | None = None) -> dict[str, Any]:
    statement = {"Effect": "Allow", "Action": action, "Resource": resource}
    return statement | ({"Condition": condition} if condition else {})


def _decide(
    statement: dict[str, Any],
    action: str,
    resource: str,
    context: dict[str, str] | None = None,
    resource_policies: tuple[ResourcePolicy, ...] = (),
) -> Decision:
    request = Request(ROLE, action, resource, {**TLS, **(context or {})})
    return evaluate(request, [{"Statement": [statement]}], resource_policies).decision


@pytest.mark.parametrize(
    ("pattern", "value", "matches"),
    [
        ("rollouts/*", "rollouts/", True),  # * matches nothing too
        ("rollouts/*", "rollouts/exp/1/a.json", True),  # ... and slashes
        ("rollouts/*", "rollouts", False),
        ("rollouts/*", "rollouts-old/", False),
        ("rollouts/", "rollouts/x", False),  # no wildcard: whole-value match
        ("a?c", "abc", True),
        ("a?c", "ac", False),
        ("exp.rl/*", "expXrl/a", False),  # regex characters are literal
        ("x[0]/*", "x[0]/a", True),
    ],
)
def test_wildcards(pattern: str, value: str, matches: bool) -> None:
    assert wildcard_match(pattern, value) is matches


def test_actions_match_case_insensitively_and_with_wildcards() -> None:
    assert (
        _decide(_allow("s3:Get*", f"{BUCKET}/*"), "s3:GetObject", f"{BUCKET}/k") is Decision.ALLOW
    )
    assert _decide(_allow("S3:getobject", f"{BUCKET}/*"), "s3:GetObject", f"{BUCKET}/k") is (
        Decision.ALLOW
    )
    assert _decide(_allow("s3:Get*", f"{BUCKET}/*"), "s3:PutObject", f"{BUCKET}/k") is (
        Decision.IMPLICIT_DENY
    )


def test_resources_match_case_sensitively() -> None:
    statement = _allow("s3:GetObject", f"{BUCKET}/p/*")
    assert _decide(statement, "s3:GetObject", f"{BUCKET}/P/k") is Decision.IMPLICIT_DENY
    assert _decide(statement, "s3:GetObject", BUCKET) is Decision.IMPLICIT_DENY


def test_string_like_and_string_equals_on_s3_prefix() -> None:
    like = _allow("s3:ListBucket", BUCKET, {"StringLike": {"s3:prefix": ["p/", "p/*"]}})
    equals = _allow("s3:ListBucket", BUCKET, {"StringEquals": {"s3:prefix": "p/*"}})
    for prefix, expected in (("p/", True), ("p/a/b", True), ("p", False), ("q/", False)):
        decision = _decide(like, "s3:ListBucket", BUCKET, {"s3:prefix": prefix})
        assert (decision is Decision.ALLOW) is expected, prefix
    # StringEquals takes * literally.
    assert _decide(equals, "s3:ListBucket", BUCKET, {"s3:prefix": "p/x"}) is Decision.IMPLICIT_DENY
    assert _decide(equals, "s3:ListBucket", BUCKET, {"s3:prefix": "p/*"}) is Decision.ALLOW


def test_a_key_the_request_lacks_fails_the_condition() -> None:
    """HeadBucket and an unprefixed ListObjectsV2 carry no s3:prefix: a conditioned grant is out."""
    like = _allow("s3:ListBucket", BUCKET, {"StringLike": {"s3:prefix": "*"}})
    assert _decide(like, "s3:ListBucket", BUCKET) is Decision.IMPLICIT_DENY


def test_condition_keys_and_operators_are_and_ed_values_or_ed() -> None:
    statement = _allow(
        "s3:ListBucket",
        BUCKET,
        {"StringLike": {"s3:prefix": ["a/*", "b/*"]}, "Bool": {"aws:SecureTransport": "true"}},
    )
    assert _decide(statement, "s3:ListBucket", BUCKET, {"s3:prefix": "b/x"}) is Decision.ALLOW
    plain = {"s3:prefix": "b/x", "aws:SecureTransport": "false"}
    assert _decide(statement, "s3:ListBucket", BUCKET, plain) is Decision.IMPLICIT_DENY


def _tls_only(resource: str) -> ResourcePolicy:
    deny = {
        "Effect": "Deny",
        "Principal": {"AWS": "*"},
        "Action": "s3:*",
        "Resource": [resource, f"{resource}/*"],
        "Condition": {"Bool": {"aws:SecureTransport": False}},  # a JSON bool works too
    }
    return ResourcePolicy(resource, {"Statement": [deny]})


def test_an_explicit_deny_in_the_resource_policy_wins() -> None:
    statement = _allow("s3:GetObject", f"{BUCKET}/*")
    policies = (_tls_only(BUCKET),)
    assert _decide(statement, "s3:GetObject", f"{BUCKET}/k", {}, policies) is Decision.ALLOW
    plain = {"aws:SecureTransport": "false"}
    assert _decide(statement, "s3:GetObject", f"{BUCKET}/k", plain, policies) is (
        Decision.EXPLICIT_DENY
    )


def test_a_resource_policy_governs_only_its_own_resource() -> None:
    statement = _allow("s3:GetObject", "*")
    plain = {"aws:SecureTransport": "false"}
    other = (_tls_only("arn:aws:s3:::other"),)
    assert _decide(statement, "s3:GetObject", f"{BUCKET}/k", plain, other) is Decision.ALLOW
    # A bucket named like the start of ours is another bucket.
    longer = (_tls_only(f"{BUCKET}b"),)
    assert _decide(statement, "s3:GetObject", f"{BUCKET}/k", plain, longer) is Decision.ALLOW


def test_resource_policy_allows_only_a_matching_principal() -> None:
    queue = "arn:aws:sqs:us-east-1:123456789012:q"

    def grant(principal: Any) -> tuple[ResourcePolicy, ...]:
        allow = {"Effect": "Allow", "Principal": principal, "Action": "sqs:*", "Resource": queue}
        return (ResourcePolicy(queue, {"Statement": [allow]}),)

    nothing = _allow("s3:GetObject", f"{BUCKET}/*")
    for principal, expected in (
        ({"Service": "s3.amazonaws.com"}, Decision.IMPLICIT_DENY),
        ({"AWS": "arn:aws:iam::123456789012:role/other"}, Decision.IMPLICIT_DENY),
        ({"AWS": [ROLE]}, Decision.ALLOW),
        ("*", Decision.ALLOW),
    ):
        assert _decide(nothing, "sqs:ReceiveMessage", queue, {}, grant(principal)) is expected


@pytest.mark.parametrize(
    "statement",
    [
        {"Effect": "Allow", "NotAction": "s3:PutObject", "Resource": "*"},
        {"Effect": "Allow", "Action": "s3:GetObject", "NotResource": "x"},
        _allow("s3:ListBucket", BUCKET, {"StringLikeIfExists": {"s3:prefix": "p/*"}}),
        _allow("s3:ListBucket", BUCKET, {"ForAnyValue:StringLike": {"s3:prefix": "p/*"}}),
        _allow("s3:ListBucket", BUCKET, {"StringLike": {"s3:prefix": "${aws:username}/*"}}),
        _allow("s3:GetObject", "${aws_s3_bucket.results.arn}/*"),  # an unresolved expression
        {**_allow("s3:GetObject", "*"), "Principal": "*"},  # not in an identity policy
    ],
)
def test_features_it_does_not_model_raise(statement: dict[str, Any]) -> None:
    context = {"s3:prefix": "p/x"}
    with pytest.raises(Unsupported):
        _decide(
            statement,
            "s3:ListBucket" if "Condition" in statement else "s3:GetObject",
            BUCKET,
            context,
        )


# The HCL subset (tests/infra/tf.py) the Terraform side is evaluated with.

_MODULE = Module(locals={"pattern": "arn:${var.p}:x:runtime/${var.name}-*"})
_REFS: dict[str, Any] = {"var.p": "aws", "var.name": "rt", "var.on": True, "things[*].arn": ["a1"]}


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("literal", "literal"),
        ("${var.p}:${var.name}/*", "aws:rt/*"),
        ("${local.pattern}", "arn:aws:x:runtime/rt-*"),
        ("${var.on ? [var.p] : [local.pattern]}", ["aws"]),
        ('${flatten([for a in things[*].arn : [a, "${a}/e/*"]])}', ["a1", "a1/e/*"]),
        (["${var.p}", "x"], ["aws", "x"]),
    ],
)
def test_hcl_subset(expression: Any, value: Any) -> None:
    assert evaluate_hcl(expression, _REFS, _MODULE) == value


def test_hcl_ternary_takes_the_else_branch() -> None:
    refs = {**_REFS, "var.on": False}
    assert evaluate_hcl("${var.on ? [var.p] : [local.pattern]}", refs, _MODULE) == [
        "arn:aws:x:runtime/rt-*"
    ]


@pytest.mark.parametrize("expression", ["${var.missing}", "${upper(var.p)}", "${var.p ? 1 : 2}"])
def test_hcl_outside_the_subset_raises(expression: str) -> None:
    with pytest.raises(HclUnsupported):
        evaluate_hcl(expression, _REFS, _MODULE)
