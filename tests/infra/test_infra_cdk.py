"""The CDK stack's security properties, asserted on the synthesized template.

Variants change parameter defaults only (the template is the same shape), so each is one
cached synthesis: default (no runtime, PUBLIC), runtime enabled, and VPC.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from aws_cdk.assertions import Match, Template

from infra.cdk.parameters import MAX_RUNTIME_ENDPOINTS, RolloutStackProps

from .cfn import (
    actions,
    as_list,
    one_resource,
    policy_documents,
    references,
    resources_of_type,
    statements,
    synth,
)

pytestmark = pytest.mark.component

RUNTIME_ROLE_ACTIONS = {
    "s3:PutObject",
    "s3:GetObject",  # a separate verifier's: only what agents handed over (*.artifacts.tar.gz)
    "sqs:SendMessage",
    "ecr:BatchGetImage",
    "ecr:GetDownloadUrlForLayer",
    "ecr:GetAuthorizationToken",
    "logs:CreateLogGroup",
    "logs:DescribeLogStreams",
    "logs:CreateLogStream",
    "logs:PutLogEvents",
}
TRAINER_ACTIONS = {
    "bedrock-agentcore:InvokeAgentRuntime",
    "bedrock-agentcore:StopRuntimeSession",
    "sqs:ReceiveMessage",
    "sqs:DeleteMessage",
    "sqs:ChangeMessageVisibility",
    "sqs:GetQueueAttributes",
    "s3:GetObject",
    "s3:ListBucket",
    "servicequotas:ListServiceQuotas",
}
# Actions that take no resource but "*" (no resource-level permissions).
UNSCOPED = (["ecr:GetAuthorizationToken"], ["servicequotas:ListServiceQuotas"])
PREFIX_SLASH = {"Fn::Join": ["", [{"Ref": "ResultPrefix"}, "/"]]}
VPC_PROPS = RolloutStackProps(
    network_mode="VPC",
    subnet_ids=("subnet-0123456789abcdef0", "subnet-0fedcba9876543210"),
    security_group_ids=("sg-0123456789abcdef0",),
)
RUNTIME_PROPS = RolloutStackProps(deploy_runtime=True, image_tag="v1")


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    return synth()


@pytest.fixture(scope="module")
def template(raw: dict[str, Any]) -> Template:
    return Template.from_json(raw)


def _bucket_name(raw: dict[str, Any]) -> Any:
    return one_resource(raw, "AWS::S3::Bucket")[1]["Properties"]["BucketName"]


def _bucket_arn(raw: dict[str, Any]) -> dict[str, Any]:
    return {"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, ":s3:::", _bucket_name(raw)]]}


def _tls_deny(resources: Any) -> dict[str, Any]:
    return {
        "Effect": "Deny",
        "Principal": {"AWS": "*"},
        "Condition": {"Bool": {"aws:SecureTransport": "false"}},
        "Resource": resources,
    }


def _document_actions(raw: dict[str, Any], where: str) -> set[str]:
    docs = dict(policy_documents(raw))
    return {a for s in statements(docs[where]) for a in actions(s)}


def test_bucket_is_encrypted_private_and_owner_enforced(template: Template) -> None:
    template.has_resource_properties(
        "AWS::S3::Bucket",
        {
            "BucketEncryption": {
                "ServerSideEncryptionConfiguration": [
                    {"ServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}
                ]
            },
            "PublicAccessBlockConfiguration": {
                "BlockPublicAcls": True,
                "BlockPublicPolicy": True,
                "IgnorePublicAcls": True,
                "RestrictPublicBuckets": True,
            },
            "OwnershipControls": {"Rules": [{"ObjectOwnership": "BucketOwnerEnforced"}]},
        },
    )


def test_bucket_policy_denies_every_request_without_tls(
    template: Template, raw: dict[str, Any]
) -> None:
    bucket_id = one_resource(raw, "AWS::S3::Bucket")[0]
    bucket_arn = {"Fn::GetAtt": [bucket_id, "Arn"]}
    objects = {"Fn::Join": ["", [bucket_arn, "/*"]]}
    template.has_resource_properties(
        "AWS::S3::BucketPolicy",
        {
            "Bucket": {"Ref": bucket_id},
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [Match.object_like({**_tls_deny([bucket_arn, objects]), "Action": "s3:*"})]
                )
            },
        },
    )


def test_results_expire_under_the_prefix_only(template: Template) -> None:
    template.has_resource_properties(
        "AWS::S3::Bucket",
        {
            "LifecycleConfiguration": {
                "Rules": Match.array_with(
                    [
                        {
                            "Id": "ExpireRolloutResults",
                            "Prefix": PREFIX_SLASH,
                            "ExpirationInDays": {"Ref": "ResultExpirationDays"},
                            "Status": "Enabled",
                        },
                        Match.object_like(
                            {"AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1}}
                        ),
                    ]
                )
            }
        },
    )
    template.has_parameter("ResultExpirationDays", {"Type": "Number", "Default": 7})


def test_queues_are_encrypted_and_redrive_to_the_dlq(template: Template) -> None:
    template.resource_properties_count_is("AWS::SQS::Queue", {"SqsManagedSseEnabled": True}, 2)
    template.has_resource_properties(
        "AWS::SQS::Queue",
        {
            "RedrivePolicy": {
                "deadLetterTargetArn": {"Fn::GetAtt": ["DeadLetterQueue", "Arn"]},
                "maxReceiveCount": {"Ref": "MaxReceiveCount"},
            }
        },
    )
    template.has_parameter("MaxReceiveCount", {"Default": 5, "MinValue": 1})


def test_only_this_bucket_in_this_account_may_send_to_the_queue(
    template: Template, raw: dict[str, Any]
) -> None:
    queue_arn = {"Fn::GetAtt": ["NotificationQueue", "Arn"]}
    template.has_resource_properties(
        "AWS::SQS::QueuePolicy",
        {
            "Queues": [{"Ref": "NotificationQueue"}],
            "PolicyDocument": {
                "Statement": [
                    {**_tls_deny(queue_arn), "Action": "sqs:*"},
                    {
                        "Sid": Match.any_value(),
                        "Effect": "Allow",
                        "Principal": {"Service": "s3.amazonaws.com"},
                        "Action": "sqs:SendMessage",
                        "Resource": queue_arn,
                        "Condition": {
                            "ArnEquals": {"aws:SourceArn": _bucket_arn(raw)},
                            "StringEquals": {"aws:SourceAccount": {"Ref": "AWS::AccountId"}},
                        },
                    },
                ]
            },
        },
    )
    dlq_arn = {"Fn::GetAtt": ["DeadLetterQueue", "Arn"]}
    template.has_resource_properties(
        "AWS::SQS::QueuePolicy",
        {"PolicyDocument": {"Statement": [{**_tls_deny(dlq_arn), "Action": "sqs:*"}]}},
    )


def test_notification_is_on_the_bucket_filtered_to_prefix_and_json(
    template: Template, raw: dict[str, Any]
) -> None:
    template.has_resource_properties(
        "AWS::S3::Bucket",
        {
            "NotificationConfiguration": {
                "QueueConfigurations": [
                    {
                        "Event": "s3:ObjectCreated:*",
                        "Queue": {"Fn::GetAtt": ["NotificationQueue", "Arn"]},
                        "Filter": {
                            "S3Key": {
                                "Rules": [
                                    {"Name": "prefix", "Value": PREFIX_SLASH},
                                    {"Name": "suffix", "Value": ".json"},
                                ]
                            }
                        },
                    }
                ]
            }
        },
    )
    # No Lambda-backed BucketNotifications custom resource, no Lambda at all.
    types = {r["Type"] for r in raw["Resources"].values()}
    assert not {t for t in types if t.startswith("Custom::") or "Lambda" in t}
    # S3 validates the destination when the configuration is set: the policy must exist first.
    bucket = one_resource(raw, "AWS::S3::Bucket")[1]
    queue_policy_ids = {
        k
        for k, v in resources_of_type(raw, "AWS::SQS::QueuePolicy").items()
        if v["Properties"]["Queues"] == [{"Ref": "NotificationQueue"}]
    }
    assert queue_policy_ids <= set(as_list(bucket["DependsOn"]))


def test_repository_has_explicit_name_scan_on_push_and_immutable_tags(template: Template) -> None:
    template.has_resource_properties(
        "AWS::ECR::Repository",
        {
            "RepositoryName": {"Ref": "RepositoryName"},
            "ImageScanningConfiguration": {"ScanOnPush": True},
            "ImageTagMutability": "IMMUTABLE",
        },
    )
    template.has_parameter("RepositoryName", {"Default": "agentcore-rollout"})


def test_runtime_role_is_trusted_by_agentcore_in_this_account_only(template: Template) -> None:
    template.has_resource_properties(
        "AWS::IAM::Role",
        {
            "AssumeRolePolicyDocument": {
                "Statement": [
                    {
                        "Effect": "Allow",
                        "Action": "sts:AssumeRole",
                        "Principal": {"Service": "bedrock-agentcore.amazonaws.com"},
                        "Condition": {
                            "StringEquals": {"aws:SourceAccount": {"Ref": "AWS::AccountId"}},
                            "ArnLike": {"aws:SourceArn": Match.any_value()},
                        },
                    }
                ]
            }
        },
    )


def test_runtime_role_reads_only_handed_artifacts(raw: dict[str, Any]) -> None:
    """Agents' sessions write results and never read them: the one read is a separate
    verifier's, of the objects agents' sessions put beside their results."""
    reads = [
        s
        for where, doc in policy_documents(raw)
        if where.startswith("RuntimeRole")
        for s in doc["Statement"]
        if "s3:GetObject" in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
    ]
    assert [s["Sid"] for s in reads] == ["ReadHandedArtifacts"]
    assert json.dumps(reads[0]["Resource"]).endswith('"/*.artifacts.tar.gz"]]}')


def test_runtime_role_and_trainer_policy_have_exactly_the_needed_actions(
    raw: dict[str, Any],
) -> None:
    assert _document_actions(raw, "RuntimeRole.rollout-runtime") == RUNTIME_ROLE_ACTIONS
    assert _document_actions(raw, "TrainerPolicy") == TRAINER_ACTIONS
    assert {where for where, _ in policy_documents(raw) if where.startswith("RuntimeRole")} == {
        "RuntimeRole.trust",
        "RuntimeRole.rollout-runtime",
    }, "the runtime role has no other policy"
    for resource in resources_of_type(raw, "AWS::IAM::Role").values():
        assert "ManagedPolicyArns" not in resource["Properties"]


def test_no_policy_allows_a_wildcard_action_or_an_unscoped_resource(raw: dict[str, Any]) -> None:
    for where, document in policy_documents(raw):
        for statement in statements(document):
            if statement["Effect"] == "Deny":
                # Broad denies are only the TLS guards.
                assert statement["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
                continue
            for action in actions(statement):
                assert "*" not in action, f"{where}: wildcard action {action}"
            if "*" in as_list(statement.get("Resource", [])):
                assert actions(statement) in UNSCOPED, where


def test_results_are_written_and_read_under_the_prefix_only(raw: dict[str, Any]) -> None:
    docs = dict(policy_documents(raw))
    by_action = {
        a: s
        for where in ("RuntimeRole.rollout-runtime", "TrainerPolicy")
        for s in statements(docs[where])
        for a in actions(s)
    }
    for action in ("s3:PutObject", "s3:GetObject"):
        parts = by_action[action]["Resource"]["Fn::Join"][1]
        assert parts[-3:] == ["/", {"Ref": "ResultPrefix"}, "/*"], action
    listing = by_action["s3:ListBucket"]
    assert listing["Condition"]["StringLike"]["s3:prefix"] == [
        PREFIX_SLASH,
        {"Fn::Join": ["", [{"Ref": "ResultPrefix"}, "/*"]]},
    ]


def test_runtime_log_permissions_are_scoped_to_its_own_log_group(raw: dict[str, Any]) -> None:
    docs = dict(policy_documents(raw))
    for statement in statements(docs["RuntimeRole.rollout-runtime"]):
        if actions(statement)[0].startswith("logs:"):
            parts = statement["Resource"]["Fn::Join"][1]
            assert ":log-group:/aws/bedrock-agentcore/runtimes/" in parts
            assert {"Ref": "RuntimeName"} in parts


def test_runtime_is_conditional_and_configured_from_parameters(template: Template) -> None:
    template.has_condition("RuntimeEnabled", {"Fn::Equals": [{"Ref": "DeployRuntime"}, "true"]})
    template.has_parameter(
        "DeployRuntime", {"Default": "false", "AllowedValues": ["true", "false"]}
    )
    template.has_resource(
        "AWS::BedrockAgentCore::Runtime",
        {
            "Condition": "RuntimeEnabled",
            "Properties": {
                "AgentRuntimeName": {"Ref": "RuntimeName"},
                "RoleArn": {"Fn::GetAtt": ["RuntimeRole", "Arn"]},
                "NetworkConfiguration": {
                    "NetworkMode": {"Ref": "NetworkMode"},
                    "NetworkModeConfig": {
                        "Fn::If": [
                            "UseVpc",
                            {
                                "SecurityGroups": {"Ref": "SecurityGroupIds"},
                                "Subnets": {"Ref": "SubnetIds"},
                            },
                            {"Ref": "AWS::NoValue"},
                        ]
                    },
                },
                "LifecycleConfiguration": {
                    "IdleRuntimeSessionTimeout": {"Ref": "IdleRuntimeSessionTimeout"},
                    "MaxLifetime": {"Ref": "MaxLifetime"},
                },
                "EnvironmentVariables": {
                    "AGENTCORE_ROLLOUT_BUCKET": {"Ref": "ResultsBucket"},
                    "AGENTCORE_ROLLOUT_PREFIX": {"Ref": "ResultPrefix"},
                    "AGENTCORE_ROLLOUT_QUEUE_URL": {"Ref": "NotificationQueue"},
                    "AGENTCORE_ROLLOUT_LLM__BASE_URL": {
                        "Fn::If": ["HasGatewayUrl", {"Ref": "GatewayUrl"}, {"Ref": "AWS::NoValue"}]
                    },
                },
            },
        },
    )


def test_runtime_image_comes_from_this_repository(raw: dict[str, Any]) -> None:
    runtime = one_resource(raw, "AWS::BedrockAgentCore::Runtime")[1]["Properties"]
    uri = runtime["AgentRuntimeArtifact"]["ContainerConfiguration"]["ContainerUri"]
    parts = uri["Fn::Join"][1]
    assert parts[-2:] == [":", {"Ref": "ImageTag"}]
    assert {"Ref": "AgentRepository"} in parts
    rule = raw["Rules"]["ImageTagRequired"]
    assert rule["RuleCondition"] == {"Fn::Equals": [{"Ref": "DeployRuntime"}, "true"]}


def test_nothing_uses_the_runtime_outside_its_condition(raw: dict[str, Any]) -> None:
    """The stack must deploy with DeployRuntime=false: every use sits under RuntimeEnabled."""
    runtime_id = one_resource(raw, "AWS::BedrockAgentCore::Runtime")[0]
    # RuntimeEnabled, or a condition holding only with it (an endpoint: And(RuntimeEnabled, ..))
    guards = {"RuntimeEnabled"} | {
        name
        for name, expression in raw["Conditions"].items()
        if {"Condition": "RuntimeEnabled"} in expression.get("Fn::And", [])
    }
    uses = 0
    for section in ("Resources", "Outputs"):
        for logical_id, element in raw[section].items():
            if logical_id == runtime_id:
                continue
            for target, path in references(element):
                if target != runtime_id:
                    continue
                uses += 1
                guarded = element.get("Condition") in guards or any(
                    step == "Fn::If" and _if_branch(element, path[: i + 1]) == "RuntimeEnabled"
                    for i, step in enumerate(path)
                )
                assert guarded, f"{section}.{logical_id} uses the runtime at {path}"
    assert uses >= 2, "expected the RuntimeArn output and the trainer policy to use it"


def _if_branch(element: dict[str, Any], path: tuple[Any, ...]) -> str | None:
    """The condition of the Fn::If at ``path``, if the reference is in its true branch."""
    node: Any = element
    for step in path:
        node = node[step]
    return node[0] if isinstance(node, list) else None


def test_trainer_invokes_this_runtime_or_the_runtime_of_that_name(raw: dict[str, Any]) -> None:
    docs = dict(policy_documents(raw))
    invoke = next(
        s for s in statements(docs["TrainerPolicy"]) if "InvokeAgentRuntime" in str(s["Action"])
    )
    condition, with_runtime, without = invoke["Resource"]["Fn::If"]
    assert condition == "RuntimeEnabled"
    assert with_runtime[0] == {"Fn::GetAtt": ["Runtime", "AgentRuntimeArn"]}
    assert with_runtime[1]["Fn::Join"][1][-1] == "/runtime-endpoint/*"
    assert without[0]["Fn::Join"][1][-3:] == [":runtime/", {"Ref": "RuntimeName"}, "-*"]


def test_outputs(template: Template, raw: dict[str, Any]) -> None:
    assert set(raw["Outputs"]) == {
        "BucketName",
        "ResultPrefix",
        "QueueUrl",
        "DeadLetterQueueUrl",
        "RepositoryUri",
        "RuntimeArn",
        "RoleArn",
        "TrainerPolicyArn",
        *(f"RuntimeEndpoint{k}Arn" for k in range(1, MAX_RUNTIME_ENDPOINTS + 1)),
    }
    template.has_output(
        "RuntimeArn",
        {"Condition": "RuntimeEnabled", "Value": {"Fn::GetAtt": ["Runtime", "AgentRuntimeArn"]}},
    )
    template.has_output("TrainerPolicyArn", {"Value": {"Ref": "TrainerPolicy"}})
    template.has_output("ResultPrefix", {"Value": {"Ref": "ResultPrefix"}})
    template.has_parameter("ResultPrefix", {"Default": "rollouts"})


def test_template_is_self_contained(raw: dict[str, Any]) -> None:
    """No bootstrap version parameter or rule, no CDK metadata resource, no assets."""
    assert "BootstrapVersion" not in raw["Parameters"]
    assert "CheckBootstrapVersion" not in raw.get("Rules", {})
    assert not resources_of_type(raw, "AWS::CDK::Metadata")


def test_runtime_enabled_variant() -> None:
    raw = synth(RUNTIME_PROPS)
    assert raw["Parameters"]["DeployRuntime"]["Default"] == "true"
    assert raw["Parameters"]["ImageTag"]["Default"] == "v1"
    assert raw["Resources"]["Runtime"]["Condition"] == "RuntimeEnabled"


def test_vpc_variant() -> None:
    raw = synth(VPC_PROPS)
    params = raw["Parameters"]
    assert params["NetworkMode"]["Default"] == "VPC"
    assert params["SubnetIds"] == {
        **params["SubnetIds"],
        "Type": "CommaDelimitedList",
        "Default": ",".join(VPC_PROPS.subnet_ids),
    }
    assert params["SecurityGroupIds"]["Default"] == "sg-0123456789abcdef0"
    assert raw["Conditions"]["UseVpc"] == {"Fn::Equals": [{"Ref": "NetworkMode"}, "VPC"]}
    for rule in ("VpcSubnetsRequired", "VpcSecurityGroupsRequired"):
        assert raw["Rules"][rule]["RuleCondition"] == raw["Conditions"]["UseVpc"]
    # Only the defaults differ from the PUBLIC template.
    assert raw["Resources"] == synth()["Resources"]


def test_props_set_prefix_and_expiry_defaults() -> None:
    raw = synth(RolloutStackProps(result_prefix="exp/rl", result_expiration_days=3))
    assert raw["Parameters"]["ResultPrefix"]["Default"] == "exp/rl"
    assert raw["Parameters"]["ResultExpirationDays"]["Default"] == 3


def test_runtime_endpoints_exist_from_the_first_to_the_count_asked(raw: dict[str, Any]) -> None:
    """`rollout_k` exists when the runtime does and RuntimeEndpoints >= k."""
    parameter = raw["Parameters"]["RuntimeEndpoints"]
    assert (parameter["Default"], parameter["MinValue"]) == (0, 0)
    assert parameter["MaxValue"] == MAX_RUNTIME_ENDPOINTS
    for k in range(1, MAX_RUNTIME_ENDPOINTS + 1):
        endpoint = raw["Resources"][f"RuntimeEndpoint{k}"]
        assert endpoint["Properties"]["Name"] == f"rollout_{k}"
        assert endpoint["Properties"]["AgentRuntimeId"] == {
            "Fn::GetAtt": ["Runtime", "AgentRuntimeId"]
        }
        condition = raw["Conditions"][endpoint["Condition"]]["Fn::And"]
        assert condition[0] == {"Condition": "RuntimeEnabled"}
        below = condition[1]["Fn::Not"][0]
        counts = below.get("Fn::Or", [below])
        assert [c["Fn::Equals"][1] for c in counts] == [str(n) for n in range(k)]
        assert raw["Outputs"][f"RuntimeEndpoint{k}Arn"]["Condition"] == endpoint["Condition"]
