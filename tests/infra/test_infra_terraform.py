"""The Terraform module: its structure, `terraform fmt`, and parity with the template.

`terraform validate`/`plan` need the aws provider from the registry, which this machine and CI
cannot reach; these tests read the module with python-hcl2 instead.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections import Counter
from typing import Any

import pytest

from .cfn import Resolver, Template, policy_documents, resources_of_type, statements, synth
from .tf import (
    COUNTERPARTS,
    MODULE_DIR,
    Module,
    cfn_bucket_arn,
    cfn_resolver,
    cfn_signature,
    load_module,
    snake,
    tf_signature,
)

pytestmark = pytest.mark.component

# CloudFormation resource types and the Terraform types that make them.
KIND_COUNTERPARTS = {
    "AWS::S3::Bucket": "aws_s3_bucket",
    "AWS::S3::BucketPolicy": "aws_s3_bucket_policy",
    "AWS::SQS::Queue": "aws_sqs_queue",
    "AWS::SQS::QueuePolicy": "aws_sqs_queue_policy",
    "AWS::ECR::Repository": "aws_ecr_repository",
    "AWS::IAM::Role": "aws_iam_role",
    "AWS::IAM::ManagedPolicy": "aws_iam_policy",
    "AWS::BedrockAgentCore::Runtime": "aws_bedrockagentcore_agent_runtime",
    "AWS::BedrockAgentCore::RuntimeEndpoint": "aws_bedrockagentcore_agent_runtime_endpoint",
}
# Template resources written once per possible copy (CloudFormation has no loops), each under its
# own condition, that Terraform writes once with a count.
COUNTED_KINDS = {"AWS::BedrockAgentCore::RuntimeEndpoint"}
# Properties CloudFormation keeps on a resource that Terraform splits into resources of their own.
PROPERTY_COUNTERPARTS = {
    ("AWS::S3::Bucket", "PublicAccessBlockConfiguration"): "aws_s3_bucket_public_access_block",
    ("AWS::S3::Bucket", "BucketEncryption"): "aws_s3_bucket_server_side_encryption_configuration",
    ("AWS::S3::Bucket", "OwnershipControls"): "aws_s3_bucket_ownership_controls",
    ("AWS::S3::Bucket", "LifecycleConfiguration"): "aws_s3_bucket_lifecycle_configuration",
    ("AWS::S3::Bucket", "NotificationConfiguration"): "aws_s3_bucket_notification",
    ("AWS::ECR::Repository", "LifecyclePolicy"): "aws_ecr_lifecycle_policy",
    ("AWS::IAM::Role", "Policies"): "aws_iam_role_policy",
}
# Template policy documents and their aws_iam_policy_document twins.
POLICY_COUNTERPARTS = {
    "RuntimeRole.trust": "runtime_trust",
    "RuntimeRole.rollout-runtime": "runtime",
    "TrainerPolicy": "trainer",
    "bucket policy": "results_bucket",
    "NotificationQueue policy": "notifications_queue",
    "DeadLetterQueue policy": "dead_letter_queue",
}


@pytest.fixture(scope="module")
def module() -> Module:
    return load_module()


@pytest.fixture(scope="module")
def template() -> Template:
    return synth()


@pytest.fixture(scope="module")
def resolve(template: Template) -> Resolver:
    return cfn_resolver(template)


def _cfn_policies(template: Template) -> dict[str, dict[str, Any]]:
    """The template's policy documents, the bucket and queue policies named by what they guard."""
    documents = dict(policy_documents(template))
    named = {k: v for k, v in documents.items() if k in POLICY_COUNTERPARTS}
    for logical_id, policy in resources_of_type(template, "AWS::S3::BucketPolicy").items():
        named["bucket policy"] = documents[logical_id]
        del documents[logical_id]
        assert policy["Properties"]["Bucket"] == {"Ref": "ResultsBucket"}
    for logical_id, policy in resources_of_type(template, "AWS::SQS::QueuePolicy").items():
        (queue,) = policy["Properties"]["Queues"]
        named[f"{queue['Ref']} policy"] = documents[logical_id]
    return named


def test_terraform_fmt_is_clean() -> None:
    terraform = shutil.which("terraform")
    if terraform is None:
        pytest.skip("terraform is not installed (no registry package ships it); fmt not checked")
    result = subprocess.run(
        [terraform, "fmt", "-check", "-diff", "-recursive", str(MODULE_DIR)],
        env={**os.environ, "CHECKPOINT_DISABLE": "1"},  # no update check over the network
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_provider_and_terraform_versions(module: Module) -> None:
    (providers,) = module.settings["required_providers"]
    assert providers["aws"]["source"] == "hashicorp/aws"
    assert providers["aws"]["version"] == ">= 6.21, < 7.0"
    assert module.settings["required_version"] == ">= 1.9"


def test_bucket_is_private_encrypted_and_expires_results(module: Module) -> None:
    block = module.resource("aws_s3_bucket_public_access_block.results")
    assert all(
        block[k] is True
        for k in (
            "block_public_acls",
            "block_public_policy",
            "ignore_public_acls",
            "restrict_public_buckets",
        )
    )
    (sse,) = module.resource("aws_s3_bucket_server_side_encryption_configuration.results")["rule"]
    assert sse["apply_server_side_encryption_by_default"][0]["sse_algorithm"] == "AES256"
    rules = {
        r["id"]: r for r in module.resource("aws_s3_bucket_lifecycle_configuration.results")["rule"]
    }
    expire = rules["ExpireRolloutResults"]
    assert module.expand(expire["filter"][0]["prefix"]) == "${var.result_prefix}/"
    assert expire["expiration"][0]["days"] == "${var.result_expiration_days}"
    assert rules["AbortIncompleteUploads"]["abort_incomplete_multipart_upload"] == [
        {"days_after_initiation": 1}
    ]


def test_notification_is_filtered_and_waits_for_the_queue_policy(module: Module) -> None:
    notification = module.resource("aws_s3_bucket_notification.results")
    (queue,) = notification["queue"]
    assert queue["events"] == ["s3:ObjectCreated:*"]
    assert queue["queue_arn"] == "${aws_sqs_queue.notifications.arn}"
    assert module.expand(queue["filter_prefix"]) == "${var.result_prefix}/"
    assert queue["filter_suffix"] == ".json"
    assert notification["depends_on"] == ["${aws_sqs_queue_policy.notifications}"]


def test_queues_are_encrypted_and_redrive(module: Module) -> None:
    queues = module.resources["aws_sqs_queue"]
    assert all(q["sqs_managed_sse_enabled"] is True for q in queues.values())
    redrive = queues["notifications"]["redrive_policy"]
    assert "deadLetterTargetArn = aws_sqs_queue.dead_letter.arn" in redrive
    assert "maxReceiveCount = var.max_receive_count" in redrive


def test_runtime_is_optional_and_configured_from_variables(module: Module) -> None:
    runtime = module.resource("aws_bedrockagentcore_agent_runtime.this")
    assert runtime["count"] == "${var.deploy_runtime ? 1 : 0}"
    (network,) = runtime["network_configuration"]
    assert network["network_mode"] == "${var.network_mode}"
    (vpc,) = network["dynamic"]
    assert vpc["network_mode_config"]["for_each"] == '${var.network_mode == "VPC" ? [1] : []}'
    (lifecycle,) = runtime["lifecycle_configuration"]
    assert lifecycle == {
        "idle_runtime_session_timeout": "${var.idle_runtime_session_timeout}",
        "max_lifetime": "${var.max_lifetime}",
    }
    assert runtime["depends_on"] == ["${aws_iam_role_policy.runtime}"]
    assert module.outputs["runtime_arn"]["value"] == (
        "${one(aws_bedrockagentcore_agent_runtime.this[*].agent_runtime_arn)}"
    )


def test_every_checkov_suppression_gives_a_reason() -> None:
    skips = re.findall(r"#\s*checkov:skip=([A-Z0-9_]+)(?::(.*))?", _module_text())
    assert skips
    for check, reason in skips:
        assert reason and len(reason.strip()) > 20, f"{check} is suppressed without a reason"


def _module_text() -> str:
    return "\n".join(p.read_text() for p in sorted(MODULE_DIR.glob("*.tf")))


def test_no_wildcard_actions_in_allow_statements(module: Module) -> None:
    for name, document in module.data["aws_iam_policy_document"].items():
        for statement in document["statement"]:
            if statement.get("effect", "Allow") == "Deny":
                assert statement["condition"][0]["variable"] == "aws:SecureTransport"
                continue
            assert not [a for a in statement["actions"] if "*" in a], name
            if statement.get("resources") == ["*"]:  # no resource-level permissions
                assert statement["actions"] in (
                    ["ecr:GetAuthorizationToken"],
                    ["servicequotas:ListServiceQuotas"],
                ), name


# Parity with the synthesized template.


def test_same_resource_kinds_and_counts(template: Template, module: Module) -> None:
    cfn_kinds = Counter(r["Type"] for r in template["Resources"].values())
    unmapped = set(cfn_kinds) - set(KIND_COUNTERPARTS)
    assert not unmapped, f"template resource types with no Terraform counterpart: {unmapped}"
    expected = Counter(
        {KIND_COUNTERPARTS[k]: 1 if k in COUNTED_KINDS else n for k, n in cfn_kinds.items()}
    )
    for (kind, prop), tf_kind in PROPERTY_COUNTERPARTS.items():
        expected[tf_kind] += sum(
            prop in r.get("Properties", {}) for r in resources_of_type(template, kind).values()
        )
    actual = Counter({kind: len(named) for kind, named in module.resources.items()})
    assert actual == expected


def test_counterpart_addresses_exist(module: Module, template: Template) -> None:
    for logical_id, address in COUNTERPARTS.items():
        assert logical_id in template["Resources"]
        module.resource(address)


def test_same_policy_statements(template: Template, module: Module, resolve: Resolver) -> None:
    """Effect, actions, principals, condition keys and resources of every statement."""
    bucket_arn = cfn_bucket_arn(template)
    cfn_policies = _cfn_policies(template)
    assert set(cfn_policies) == set(POLICY_COUNTERPARTS)
    runtime_pattern = module.expand("${local.runtime_arn_pattern}")
    for cfn_name, tf_name in POLICY_COUNTERPARTS.items():
        cfn = {cfn_signature(s, resolve, bucket_arn) for s in statements(cfn_policies[cfn_name])}
        tf = set()
        for statement in module.policy(tf_name):
            signature = tf_signature(statement, module)
            if isinstance(signature[4], str):  # the trainer's runtime: this one, or by name
                assert signature[4].endswith(": [local.runtime_arn_pattern]}")
                assert "/runtime-endpoint/*" in signature[4]
                signature = (*signature[:4], frozenset({runtime_pattern}))
            tf.add(signature)
        assert cfn == tf, f"{cfn_name} differs from {tf_name}: {cfn ^ tf}"


def test_same_bucket_queue_and_repository_settings(
    template: Template, module: Module, resolve: Resolver
) -> None:
    bucket = resolve(template["Resources"]["ResultsBucket"]["Properties"])
    sse = bucket["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]
    tf_sse = module.resource("aws_s3_bucket_server_side_encryption_configuration.results")
    assert (
        sse["ServerSideEncryptionByDefault"]["SSEAlgorithm"]
        == tf_sse["rule"][0]["apply_server_side_encryption_by_default"][0]["sse_algorithm"]
    )
    tf_block = module.resource("aws_s3_bucket_public_access_block.results")
    assert {snake(k): v for k, v in bucket["PublicAccessBlockConfiguration"].items()} == {
        k: v for k, v in tf_block.items() if k != "bucket"
    }
    tf_ownership = module.resource("aws_s3_bucket_ownership_controls.results")["rule"][0]
    assert (
        bucket["OwnershipControls"]["Rules"][0]["ObjectOwnership"]
        == (tf_ownership["object_ownership"])
    )

    (notification,) = bucket["NotificationConfiguration"]["QueueConfigurations"]
    (tf_queue,) = module.resource("aws_s3_bucket_notification.results")["queue"]
    filters = {r["Name"]: r["Value"] for r in notification["Filter"]["S3Key"]["Rules"]}
    assert [notification["Event"]] == tf_queue["events"]
    assert filters == {
        "prefix": module.expand(tf_queue["filter_prefix"]),
        "suffix": tf_queue["filter_suffix"],
    }

    cfn_rules = {r["Id"]: r for r in bucket["LifecycleConfiguration"]["Rules"]}
    tf_rules = {
        r["id"]: r for r in module.resource("aws_s3_bucket_lifecycle_configuration.results")["rule"]
    }
    assert set(cfn_rules) == set(tf_rules)
    expire = tf_rules["ExpireRolloutResults"]
    assert cfn_rules["ExpireRolloutResults"]["Prefix"] == module.expand(
        expire["filter"][0]["prefix"]
    )
    assert cfn_rules["ExpireRolloutResults"]["ExpirationInDays"] == expire["expiration"][0]["days"]

    for logical_id, address in (
        ("NotificationQueue", "notifications"),
        ("DeadLetterQueue", "dead_letter"),
    ):
        cfn_queue = template["Resources"][logical_id]["Properties"]
        tf_queue_settings = module.resources["aws_sqs_queue"][address]
        assert cfn_queue["SqsManagedSseEnabled"] is tf_queue_settings["sqs_managed_sse_enabled"]
        assert cfn_queue["MessageRetentionPeriod"] == tf_queue_settings["message_retention_seconds"]
        assert cfn_queue.get("VisibilityTimeout") == tf_queue_settings.get(
            "visibility_timeout_seconds"
        )

    repo = resolve(template["Resources"]["AgentRepository"]["Properties"])
    tf_repo = module.resource("aws_ecr_repository.agent")
    assert repo["ImageTagMutability"] == tf_repo["image_tag_mutability"]
    assert (
        repo["ImageScanningConfiguration"]["ScanOnPush"]
        is (tf_repo["image_scanning_configuration"][0]["scan_on_push"])
    )
    assert repo["RepositoryName"] == tf_repo["name"]


def test_same_runtime_configuration(template: Template, module: Module, resolve: Resolver) -> None:
    runtime = template["Resources"]["Runtime"]["Properties"]
    tf_runtime = module.resource("aws_bedrockagentcore_agent_runtime.this")
    assert resolve(runtime["AgentRuntimeName"]) == tf_runtime["agent_runtime_name"]
    assert resolve(runtime["RoleArn"]) == tf_runtime["role_arn"]
    lifecycle = resolve(runtime["LifecycleConfiguration"])
    assert {snake(k): v for k, v in lifecycle.items()} == tf_runtime["lifecycle_configuration"][0]
    environment = set(runtime["EnvironmentVariables"])
    tf_environment = set(
        re.findall(r"\b(AGENTCORE_ROLLOUT_\w+)\s*=", tf_runtime["environment_variables"])
    )
    assert environment == tf_environment


def test_same_parameters_as_variables(template: Template, module: Module) -> None:
    parameters = template["Parameters"]
    assert {snake(p) for p in parameters} == set(module.variables)
    for name, parameter in parameters.items():
        variable = module.variables[snake(name)]
        validations = " ".join(v["condition"] for v in variable.get("validation", []))
        assert _tf_default(parameter) == variable["default"], name
        for bound in ("MinValue", "MaxValue"):
            if bound in parameter:
                assert str(parameter[bound]) in validations, f"{name} {bound}"
        if "AllowedPattern" in parameter:
            assert parameter["AllowedPattern"] in validations.replace("\\\\", "\\"), name
        for allowed in parameter.get("AllowedValues", []):
            assert allowed in validations or variable["type"] == "bool", name


def _tf_default(parameter: dict[str, Any]) -> Any:
    default = parameter.get("Default")
    if parameter.get("AllowedValues") == ["true", "false"]:
        return default == "true"
    if parameter["Type"] == "CommaDelimitedList":
        return [v for v in default.split(",") if v]
    return default


def test_same_outputs(template: Template, module: Module) -> None:
    # the template's one output per possible endpoint is the module's one list of them
    listed = {
        re.sub(r"^runtime_endpoint\d+_arn$", "runtime_endpoint_arns", snake(o))
        for o in template["Outputs"]
    }
    assert listed == set(module.outputs)


def test_runtime_endpoints_as_many_as_asked_for_this_runtime(
    template: Template, module: Module
) -> None:
    endpoint = module.resource("aws_bedrockagentcore_agent_runtime_endpoint.rollout")
    assert endpoint["count"] == "${var.deploy_runtime ? var.runtime_endpoints : 0}"
    assert endpoint["name"] == "rollout_${count.index + 1}"
    assert endpoint["agent_runtime_id"] == (
        "${aws_bedrockagentcore_agent_runtime.this[0].agent_runtime_id}"
    )
    names = [
        r["Properties"]["Name"]
        for r in resources_of_type(template, "AWS::BedrockAgentCore::RuntimeEndpoint").values()
    ]
    maximum = template["Parameters"]["RuntimeEndpoints"]["MaxValue"]
    assert sorted(names) == [f"rollout_{k}" for k in range(1, maximum + 1)]
    validation = module.variables["runtime_endpoints"]["validation"][0]["condition"]
    assert f"var.runtime_endpoints <= {maximum}" in validation
