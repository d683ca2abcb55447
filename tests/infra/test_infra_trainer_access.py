"""Can the least-privilege trainer role make every call the engine makes, and nothing more?

The table below is the one place that says which calls the trainer role must be allowed (and
a few it must not be). Each is checked, with the small evaluator in `iam_eval`, against the
trainer policy plus the bucket's and queues' policies, as the synthesized template and the
Terraform module write them, resolved for concrete deployments: two result prefixes (one
nested), each with and without the runtime in the stack.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import pytest

from agentcore_rollout.contract import result_key

from .cfn import Resolver, Template, as_list, statements, synth
from .iam_eval import (
    Decision,
    Document,
    Outcome,
    Request,
    ResourcePolicy,
    Unsupported,
    evaluate,
    statement_applies,
)
from .tf import Module, evaluate_hcl, load_module, policy_json

pytestmark = pytest.mark.component


@dataclass(frozen=True)
class World:
    """One concrete deployment: the values the policies' intrinsics/expressions resolve to."""

    prefix: str = "rollouts"
    runtime_enabled: bool = False
    partition: str = "aws"
    region: str = "us-east-1"
    account: str = "123456789012"
    runtime_name: str = "agentcore_rollout"  # the RuntimeName / runtime_name default
    stack_uuid: str = "1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d"

    @property
    def bucket(self) -> str:  # the template's naming; Terraform's is arbitrary, so the same
        return f"agentcore-rollout-{self.account}-{self.stack_uuid.split('-')[0]}"

    def _sqs(self, name: str) -> tuple[str, str]:
        return (
            f"arn:{self.partition}:sqs:{self.region}:{self.account}:{name}",
            f"https://sqs.{self.region}.amazonaws.com/{self.account}/{name}",
        )

    @property
    def queue(self) -> tuple[str, str]:  # (ARN, URL)
        return self._sqs("agentcore-rollout-notifications")

    @property
    def dead_letter_queue(self) -> tuple[str, str]:
        return self._sqs("agentcore-rollout-dlq")

    def runtime_arn(self, name: str | None = None) -> str:
        """A runtime's ARN: AgentCore makes its id from the name and ten random characters."""
        runtime_id = f"{name or self.runtime_name}-Ab12Cd34Ef"
        where = f"{self.partition}:bedrock-agentcore:{self.region}:{self.account}"
        return f"arn:{where}:runtime/{runtime_id}"

    @property
    def trainer(self) -> str:
        return f"arn:{self.partition}:iam::{self.account}:role/trainer"

    def fill(self, text: str) -> str:
        return text.format(
            bucket_arn=f"arn:{self.partition}:s3:::{self.bucket}",
            prefix=self.prefix,
            key=result_key(self.prefix, "exp1", 3, "req-1"),
            queue_arn=self.queue[0],
            dlq_arn=self.dead_letter_queue[0],
            runtime_arn=self.runtime_arn(),
            other_runtime_arn=self.runtime_arn("other_agent"),
            longer_name_runtime_arn=self.runtime_arn(f"{self.runtime_name}_v2"),
            region=self.region,
            account=self.account,
        )


@dataclass(frozen=True)
class Call:
    """An API call as IAM authorizes it: action, resource and request context.

    ``{placeholders}`` are filled from a `World`. Every call carries ``aws:SecureTransport``
    "true" (boto3 speaks HTTPS) unless its context says otherwise.
    """

    api: str
    action: str
    resource: str
    context: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    expected: Decision = Decision.ALLOW

    def request(self, world: World) -> Request:
        context = {"aws:SecureTransport": "true"} | {
            k: world.fill(v) for k, v in self.context.items()
        }
        return Request(world.trainer, self.action, world.fill(self.resource), context)


NO_TLS = {"aws:SecureTransport": "false"}

# Every call the engine makes as the trainer role, as IAM authorizes it: the one list of what
# the trainer policy must allow (and, with FORBIDDEN below, of what it must not). An S3
# ListObjectsV2 request's Prefix parameter is its `s3:prefix` condition value, verbatim; a
# request without one (HeadBucket, an unprefixed listing) carries no `s3:prefix` at all.
REQUIRED = (
    # Start-up check (RolloutEngine's preflight).
    Call(
        'preflight ListObjectsV2(Prefix="<prefix>/", MaxKeys=1)',
        "s3:ListBucket",
        "{bucket_arn}",
        {"s3:prefix": "{prefix}/"},
    ),
    Call('preflight GetQueueAttributes(["QueueArn"])', "sqs:GetQueueAttributes", "{queue_arn}"),
    # Consuming the results queue (RolloutBuffer).
    Call("ReceiveMessage", "sqs:ReceiveMessage", "{queue_arn}"),
    Call("DeleteMessageBatch", "sqs:DeleteMessage", "{queue_arn}"),
    Call("ChangeMessageVisibilityBatch", "sqs:ChangeMessageVisibility", "{queue_arn}"),
    Call("GetQueueAttributes", "sqs:GetQueueAttributes", "{queue_arn}"),
    # Reading a result a notification names, or looking one up directly on resume.
    Call("GetObject(<prefix>/<exp>/<step>/<id>.json)", "s3:GetObject", "{bucket_arn}/{key}"),
    # A missing key is a 404 NoSuchKey only if the caller may also s3:ListBucket, else 403.
    # AWS documents that rule but not which s3:prefix (if any) the implied check carries; this
    # row models it as the engine's design assumes, a ListBucket whose s3:prefix is the key.
    Call(
        "GetObject of a missing key answers 404 (implied ListBucket)",
        "s3:ListBucket",
        "{bucket_arn}",
        {"s3:prefix": "{key}"},
    ),
    # The AgentCore data plane, on the runtime and on its DEFAULT endpoint.
    Call("InvokeAgentRuntime", "bedrock-agentcore:InvokeAgentRuntime", "{runtime_arn}"),
    Call(
        "InvokeAgentRuntime(qualifier=DEFAULT)",
        "bedrock-agentcore:InvokeAgentRuntime",
        "{runtime_arn}/runtime-endpoint/DEFAULT",
    ),
    Call("StopRuntimeSession", "bedrock-agentcore:StopRuntimeSession", "{runtime_arn}"),
    Call(
        "StopRuntimeSession(qualifier=DEFAULT)",
        "bedrock-agentcore:StopRuntimeSession",
        "{runtime_arn}/runtime-endpoint/DEFAULT",
    ),
    # AgentCore's quotas as the account has them, read once at start-up (runtimes.agentcore.quotas).
    Call(
        'ListServiceQuotas(ServiceCode="bedrock-agentcore")', "servicequotas:ListServiceQuotas", "*"
    ),
)

IMPLICIT, EXPLICIT = Decision.IMPLICIT_DENY, Decision.EXPLICIT_DENY
# What the trainer role must not be able to do, and which kind of denial stops it.
FORBIDDEN = (
    # The engine's former preflight: HeadBucket is a ListBucket with no s3:prefix (403 on AWS).
    Call("HeadBucket (bucket-wide ListBucket)", "s3:ListBucket", "{bucket_arn}", {}, IMPLICIT),
    Call("ListObjectsV2(Prefix='')", "s3:ListBucket", "{bucket_arn}", {"s3:prefix": ""}, IMPLICIT),
    Call(
        "ListObjectsV2(Prefix='<prefix>') lists sibling prefixes too",
        "s3:ListBucket",
        "{bucket_arn}",
        {"s3:prefix": "{prefix}"},
        IMPLICIT,
    ),
    Call(
        "ListObjectsV2(Prefix='<prefix>-old/')",
        "s3:ListBucket",
        "{bucket_arn}",
        {"s3:prefix": "{prefix}-old/"},
        IMPLICIT,
    ),
    Call(
        "ListObjectsV2(Prefix='other/')",
        "s3:ListBucket",
        "{bucket_arn}",
        {"s3:prefix": "other/"},
        IMPLICIT,
    ),
    Call("GetObject outside the prefix", "s3:GetObject", "{bucket_arn}/other/x.json", {}, IMPLICIT),
    Call(
        "GetObject under a sibling prefix",
        "s3:GetObject",
        "{bucket_arn}/{prefix}-old/x.json",
        {},
        IMPLICIT,
    ),
    Call(
        "PutObject (agents write, not the trainer)",
        "s3:PutObject",
        "{bucket_arn}/{key}",
        {},
        IMPLICIT,
    ),
    Call("DeleteObject", "s3:DeleteObject", "{bucket_arn}/{key}", {}, IMPLICIT),
    Call("GetObject over plain HTTP", "s3:GetObject", "{bucket_arn}/{key}", NO_TLS, EXPLICIT),
    Call(
        "preflight ListObjectsV2 over plain HTTP",
        "s3:ListBucket",
        "{bucket_arn}",
        {**NO_TLS, "s3:prefix": "{prefix}/"},
        EXPLICIT,
    ),
    Call("ReceiveMessage over plain HTTP", "sqs:ReceiveMessage", "{queue_arn}", NO_TLS, EXPLICIT),
    Call("SendMessage to the queue", "sqs:SendMessage", "{queue_arn}", {}, IMPLICIT),
    Call("PurgeQueue", "sqs:PurgeQueue", "{queue_arn}", {}, IMPLICIT),
    Call("ReceiveMessage from the DLQ", "sqs:ReceiveMessage", "{dlq_arn}", {}, IMPLICIT),
    Call(
        "ReceiveMessage from another queue",
        "sqs:ReceiveMessage",
        "arn:aws:sqs:{region}:{account}:someone-else",
        {},
        IMPLICIT,
    ),
    Call(
        "InvokeAgentRuntime on another runtime",
        "bedrock-agentcore:InvokeAgentRuntime",
        "{other_runtime_arn}",
        {},
        IMPLICIT,
    ),
    Call(
        "InvokeAgentRuntime on a runtime whose name starts with ours",
        "bedrock-agentcore:InvokeAgentRuntime",
        "{longer_name_runtime_arn}",
        {},
        IMPLICIT,
    ),
    Call(
        "DeleteAgentRuntime (control plane)",
        "bedrock-agentcore:DeleteAgentRuntime",
        "{runtime_arn}",
        {},
        IMPLICIT,
    ),
)

WORLDS = tuple(
    World(prefix=prefix, runtime_enabled=runtime)
    for prefix in ("rollouts", "exp/rl")
    for runtime in (False, True)
)


@dataclass(frozen=True)
class Policies:
    """The trainer's identity policy and the resource policies of what it touches."""

    trainer: Document
    resources: tuple[ResourcePolicy, ...]

    def decide(self, call: Call, world: World) -> Outcome:
        return evaluate(call.request(world), [self.trainer], self.resources)


# The template, resolved for a world.


def _template_refs(template: Template, world: World) -> dict[str, Any]:
    refs: dict[str, Any] = {}
    for name, parameter in template["Parameters"].items():
        default = parameter.get("Default")
        if parameter["Type"] == "CommaDelimitedList":
            default = [v for v in str(default or "").split(",") if v]
        refs[name] = default
    assert refs["RuntimeName"] == world.runtime_name, "the world's runtime is the default one"
    refs |= {
        "ResultPrefix": world.prefix,
        "DeployRuntime": "true" if world.runtime_enabled else "false",
        "AWS::Partition": world.partition,
        "AWS::Region": world.region,
        "AWS::AccountId": world.account,
        "AWS::URLSuffix": "amazonaws.com",
        "AWS::StackId": (
            f"arn:{world.partition}:cloudformation:{world.region}:{world.account}"
            f":stack/AgentCoreRollout/{world.stack_uuid}"
        ),
        "ResultsBucket": world.bucket,
        "NotificationQueue": world.queue[1],
        "DeadLetterQueue": world.dead_letter_queue[1],
    }
    return refs


def _template_conditions(template: Template, refs: dict[str, Any]) -> dict[str, bool]:
    resolve = Resolver(refs, {}, {})

    def truth(expression: dict[str, Any]) -> bool:
        ((function, argument),) = expression.items()
        if function == "Fn::Equals":
            left, right = resolve(argument)
            return bool(left == right)
        if function == "Fn::Not":
            return not truth(argument[0])
        if function == "Fn::And":
            return all(truth(a) for a in argument)
        if function == "Fn::Or":
            return any(truth(a) for a in argument)
        if function == "Condition":
            return truth(template["Conditions"][argument])
        raise Unsupported(f"condition function {function}")

    return {name: truth(expression) for name, expression in template["Conditions"].items()}


def template_policies(template: Template, world: World) -> Policies:
    refs = _template_refs(template, world)
    conditions = _template_conditions(template, refs)
    assert conditions["RuntimeEnabled"] is world.runtime_enabled
    attrs = {
        ("ResultsBucket", "Arn"): f"arn:{world.partition}:s3:::{world.bucket}",
        ("NotificationQueue", "Arn"): world.queue[0],
        ("DeadLetterQueue", "Arn"): world.dead_letter_queue[0],
        ("Runtime", "AgentRuntimeArn"): world.runtime_arn(),
    }
    resolve = Resolver(refs, attrs, conditions)
    queue_arns = {
        world.queue[1]: world.queue[0],
        world.dead_letter_queue[1]: world.dead_letter_queue[0],
    }
    # The policy users attach to trainers is the one the TrainerPolicyArn output names.
    trainer_id = template["Outputs"]["TrainerPolicyArn"]["Value"]["Ref"]
    trainer = resolve(template["Resources"][trainer_id]["Properties"]["PolicyDocument"])
    resource_policies = []
    for resource in template["Resources"].values():
        props = resource.get("Properties", {})
        if resource["Type"] == "AWS::S3::BucketPolicy":
            bucket_arn = f"arn:{world.partition}:s3:::{resolve(props['Bucket'])}"
            resource_policies.append(ResourcePolicy(bucket_arn, resolve(props["PolicyDocument"])))
        elif resource["Type"] == "AWS::SQS::QueuePolicy":
            for url in resolve(props["Queues"]):
                document = resolve(props["PolicyDocument"])
                resource_policies.append(ResourcePolicy(queue_arns[url], document))
    return Policies(trainer, tuple(resource_policies))


# The Terraform module, evaluated for a world.


def _terraform_refs(world: World) -> dict[str, Any]:
    runtimes = [world.runtime_arn()] if world.runtime_enabled else []
    return {
        "var.result_prefix": world.prefix,
        "var.runtime_name": world.runtime_name,
        "var.deploy_runtime": world.runtime_enabled,
        "data.aws_partition.current.partition": world.partition,
        "data.aws_region.current.region": world.region,
        "data.aws_caller_identity.current.account_id": world.account,
        "aws_s3_bucket.results.arn": f"arn:{world.partition}:s3:::{world.bucket}",
        "aws_s3_bucket.results.id": world.bucket,
        "aws_sqs_queue.notifications.arn": world.queue[0],
        "aws_sqs_queue.notifications.id": world.queue[1],
        "aws_sqs_queue.dead_letter.arn": world.dead_letter_queue[0],
        "aws_sqs_queue.dead_letter.id": world.dead_letter_queue[1],
        "aws_bedrockagentcore_agent_runtime.this[*].agent_runtime_arn": runtimes,
    }


def _document_name(expression: str) -> str:
    """``${data.aws_iam_policy_document.NAME.json}`` -> ``NAME``."""
    head, tail = "${data.aws_iam_policy_document.", ".json}"
    assert expression.startswith(head) and expression.endswith(tail), expression
    return expression[len(head) : -len(tail)]


def terraform_policies(module: Module, world: World) -> Policies:
    refs = _terraform_refs(world)
    # The policy users attach to trainers is the one the trainer_policy_arn output names.
    output = module.outputs["trainer_policy_arn"]["value"]
    assert output.startswith("${aws_iam_policy.") and output.endswith(".arn}"), output
    trainer_policy = module.resource(output[2:-5])
    trainer = policy_json(module, _document_name(trainer_policy["policy"]), refs)
    queue_arns = {
        world.queue[1]: world.queue[0],
        world.dead_letter_queue[1]: world.dead_letter_queue[0],
    }
    resource_policies = []
    for policy in module.resources.get("aws_s3_bucket_policy", {}).values():
        bucket_arn = f"arn:{world.partition}:s3:::{evaluate_hcl(policy['bucket'], refs, module)}"
        document = policy_json(module, _document_name(policy["policy"]), refs)
        resource_policies.append(ResourcePolicy(bucket_arn, document))
    for policy in module.resources.get("aws_sqs_queue_policy", {}).values():
        queue_arn = queue_arns[evaluate_hcl(policy["queue_url"], refs, module)]
        document = policy_json(module, _document_name(policy["policy"]), refs)
        resource_policies.append(ResourcePolicy(queue_arn, document))
    return Policies(trainer, tuple(resource_policies))


# The tests.


@pytest.fixture(scope="module")
def template() -> Template:
    return synth()


@pytest.fixture(scope="module")
def module() -> Module:
    return load_module()


@pytest.fixture(scope="module", params=["template", "terraform"])
def policies(
    request: pytest.FixtureRequest, template: Template, module: Module
) -> dict[World, Policies]:
    """Each world's policies, from the synthesized template or from the Terraform module."""
    if request.param == "template":
        return {world: template_policies(template, world) for world in WORLDS}
    return {world: terraform_policies(module, world) for world in WORLDS}


def _describe(world: World) -> str:
    return f"prefix={world.prefix!r} runtime={'in stack' if world.runtime_enabled else 'by name'}"


@pytest.mark.parametrize("call", REQUIRED, ids=lambda c: c.api)
def test_trainer_may_make_every_call_the_engine_makes(
    call: Call, policies: dict[World, Policies]
) -> None:
    failures = [
        f"{_describe(world)}: {call.request(world)} -> {outcome}"
        for world, policy in policies.items()
        if not (outcome := policy.decide(call, world)).allowed
    ]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("call", FORBIDDEN, ids=lambda c: c.api)
def test_trainer_may_not_make_these_calls(call: Call, policies: dict[World, Policies]) -> None:
    failures = [
        f"{_describe(world)}: {call.request(world)} -> {outcome}, expected {call.expected.value}"
        for world, policy in policies.items()
        if (outcome := policy.decide(call, world)).decision is not call.expected
    ]
    assert not failures, "\n".join(failures)


def test_every_grant_of_the_trainer_policy_is_used_by_a_required_call(
    policies: dict[World, Policies],
) -> None:
    """Nothing more: each (action, resource) an Allow names serves at least one call above."""
    for world, policy in policies.items():
        for statement in statements(policy.trainer):
            assert statement["Effect"] == "Allow"
            for action in as_list(statement["Action"]):
                for resource in as_list(statement["Resource"]):
                    narrowed = {**statement, "Action": action, "Resource": resource}
                    assert any(
                        statement_applies(narrowed, call.request(world)) for call in REQUIRED
                    ), f"{_describe(world)}: {statement.get('Sid')} grants {action} on {resource}"


def test_resource_policies_are_in_the_evaluation(policies: dict[World, Policies]) -> None:
    """The TLS denials come from the bucket's and queues' policies: all three are read."""
    for world, policy in policies.items():
        attached = {p.attached_to for p in policy.resources}
        assert attached == {
            f"arn:{world.partition}:s3:::{world.bucket}",
            world.queue[0],
            world.dead_letter_queue[0],
        }
