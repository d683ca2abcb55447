"""agentcore_rollout.cli.infra against moto's AgentCore control plane and CloudFormation in-process.

moto quirks handled here: an updated runtime stays UPDATING forever (AgentCore moves it to
READY), and its ARN gains a ``:version`` suffix that real runtime ARNs do not have.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from dotenv import dotenv_values
from moto import mock_aws
from moto.bedrockagentcorecontrol.models import AgentRuntime
from moto.moto_api import state_manager

from agentcore_rollout.cli.infra import (
    ENV_GATEWAY_URL,
    InfraError,
    RuntimeSpec,
    deploy_runtime,
    destroy_runtime,
    env_from_outputs,
    stack_outputs,
    wait_until_ready,
    write_env_file,
    write_stack_env,
)
from infra.cdk import app

pytestmark = pytest.mark.component

REGION = "us-east-1"
ACCOUNT = "123456789012"
ROLE = f"arn:aws:iam::{ACCOUNT}:role/agentcore-rollout-runtime"
IMAGE = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/agentcore-rollout"
RUNTIME_MODEL = "bedrock-agentcore-control::agent_runtime"
FAST = {"timeout_s": 2.0, "poll_s": 0.01}


def _spec(**overrides: Any) -> RuntimeSpec:
    values: dict[str, Any] = {
        "name": "rollout_agent",
        "container_uri": f"{IMAGE}:v1",
        "role_arn": ROLE,
        "idle_timeout_s": 300,
        "max_lifetime_s": 3600,
        "environment": {"LOG_LEVEL": "INFO"},
        "gateway_url": "https://gateway.example.internal/v1",
    }
    return RuntimeSpec(**(values | overrides))


@pytest.fixture
def aws() -> Iterator[Any]:
    """Moto in-process with the runtime role in place; yields the control-plane client."""
    with mock_aws():
        iam = boto3.client("iam", region_name=REGION)
        iam.create_role(
            RoleName=ROLE.rsplit("/", 1)[-1],
            AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": []}),
        )
        yield boto3.client("bedrock-agentcore-control", region_name=REGION)


@pytest.fixture
def updates_finish(monkeypatch: pytest.MonkeyPatch) -> None:
    """moto leaves an updated runtime UPDATING forever; AgentCore moves it to READY."""
    original = AgentRuntime.update

    def update(self: AgentRuntime, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self._transitions = [("UPDATING", "READY")]

    monkeypatch.setattr(AgentRuntime, "update", update)


@pytest.fixture
def stuck_creating() -> Iterator[None]:
    """Runtimes stay CREATING (no status progression) for the timeout path."""
    state_manager.set_transition(RUNTIME_MODEL, {"progression": "manual", "times": 10**9})
    yield
    state_manager.unset_transition(RUNTIME_MODEL)


def test_deploy_creates_the_runtime_and_returns_it_ready(aws: Any) -> None:
    info = deploy_runtime(_spec(), region=REGION, **FAST)
    assert info.status == "READY" and info.name == "rollout_agent"
    assert info.arn.startswith(f"arn:aws:bedrock-agentcore:{REGION}:{ACCOUNT}:")
    runtime = aws.get_agent_runtime(agentRuntimeId=info.runtime_id)
    assert runtime["agentRuntimeArtifact"] == {
        "containerConfiguration": {"containerUri": f"{IMAGE}:v1"}
    }
    assert runtime["roleArn"] == ROLE
    assert runtime["networkConfiguration"] == {"networkMode": "PUBLIC"}
    assert runtime["lifecycleConfiguration"] == {
        "idleRuntimeSessionTimeout": 300,
        "maxLifetime": 3600,
    }
    assert runtime["environmentVariables"] == {
        "LOG_LEVEL": "INFO",
        ENV_GATEWAY_URL: "https://gateway.example.internal/v1",
    }


def test_deploy_again_unchanged_makes_no_new_version(aws: Any) -> None:
    first = deploy_runtime(_spec(), client=aws, region=REGION, **FAST)
    again = deploy_runtime(_spec(), client=aws, region=REGION, **FAST)
    assert (again.runtime_id, again.version) == (first.runtime_id, first.version)


def test_deploy_changed_updates_in_place(aws: Any, updates_finish: None) -> None:
    first = deploy_runtime(_spec(), client=aws, region=REGION, **FAST)
    updated = deploy_runtime(
        _spec(container_uri=f"{IMAGE}:v2", idle_timeout_s=900), client=aws, region=REGION, **FAST
    )
    assert updated.runtime_id == first.runtime_id
    assert (updated.version, updated.status) == ("2", "READY")
    runtime = aws.get_agent_runtime(agentRuntimeId=updated.runtime_id)
    assert runtime["agentRuntimeArtifact"]["containerConfiguration"]["containerUri"].endswith(":v2")
    assert runtime["lifecycleConfiguration"]["idleRuntimeSessionTimeout"] == 900


def test_deploy_in_a_vpc(aws: Any) -> None:
    spec = _spec(
        network_mode="VPC",
        subnets=("subnet-0123456789abcdef0",),
        security_groups=("sg-0123456789abcdef0",),
    )
    info = deploy_runtime(spec, client=aws, region=REGION, **FAST)
    assert aws.get_agent_runtime(agentRuntimeId=info.runtime_id)["networkConfiguration"] == {
        "networkMode": "VPC",
        "networkModeConfig": {
            "subnets": ["subnet-0123456789abcdef0"],
            "securityGroups": ["sg-0123456789abcdef0"],
        },
    }


def test_a_runtime_that_never_gets_ready_times_out_with_one_line(
    aws: Any, stuck_creating: None
) -> None:
    with pytest.raises(InfraError, match=r"not READY after 0\.2s \(status CREATING\)") as caught:
        deploy_runtime(_spec(), client=aws, region=REGION, timeout_s=0.2, poll_s=0.02)
    assert "\n" not in str(caught.value)
    assert "rollout_agent" in str(caught.value)


class _FailingControlPlane:
    """Reports a failed create: moto's runtimes never fail."""

    def get_agent_runtime(self, agentRuntimeId: str) -> dict[str, Any]:
        return {
            "agentRuntimeId": agentRuntimeId,
            "agentRuntimeArn": "arn",
            "status": "CREATE_FAILED",
            "failureReason": "Image not found:\n manifest unknown",
        }


def test_a_failed_runtime_reports_the_reason_on_one_line() -> None:
    with pytest.raises(InfraError) as caught:
        wait_until_ready(_FailingControlPlane(), "rt-0123456789", "agent", sleep=lambda _: None)
    assert str(caught.value) == (
        "runtime agent (rt-0123456789) is CREATE_FAILED: Image not found: manifest unknown"
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"name": "rollout-agent"}, "runtime name 'rollout-agent' is invalid"),
        ({"name": "9lives"}, "runtime name '9lives' is invalid"),
        ({"role_arn": ""}, "runtime role is missing"),
        ({"role_arn": f"arn:aws:iam::{ACCOUNT}:user/me"}, "is not an IAM role ARN"),
        ({"container_uri": "docker.io/library/python:3.12"}, "is not an ECR image"),
        ({"network_mode": "VPC"}, "network mode VPC needs at least one subnet"),
        (
            {"network_mode": "VPC", "subnets": ("subnet-0123456789abcdef0",)},
            "needs at least one security group",
        ),
        (
            {"network_mode": "VPC", "subnets": ("subnet-1",), "security_groups": ("sg-1",)},
            "invalid subnet id 'subnet-1'",
        ),
        ({"subnets": ("subnet-0123456789abcdef0",)}, "subnets and security groups need"),
        ({"network_mode": "HOST"}, "network mode 'HOST' is not PUBLIC or VPC"),
        ({"idle_timeout_s": 30}, "idle timeout 30s is outside 60..1209600s"),
        ({"idle_timeout_s": 7200, "max_lifetime_s": 3600}, "exceeds max lifetime"),
        ({"environment": {f"K{i}": "v" for i in range(50)}}, "51 environment variables"),
    ],
)
def test_bad_specs_fail_before_any_call(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(InfraError, match=message) as caught:
        deploy_runtime(_spec(**overrides), client=object(), iam_client=object())
    assert "\n" not in str(caught.value)


def test_a_role_that_does_not_exist_is_named(aws: Any) -> None:
    missing = f"arn:aws:iam::{ACCOUNT}:role/nobody"
    with pytest.raises(InfraError, match=f"runtime role {missing} does not exist"):
        deploy_runtime(_spec(role_arn=missing), client=aws, region=REGION, **FAST)


def test_the_role_check_steps_aside_when_iam_may_not_be_read(aws: Any) -> None:
    iam = boto3.client("iam", region_name=REGION)
    with Stubber(iam) as stub:
        stub.add_client_error("get_role", service_error_code="AccessDenied", http_status_code=403)
        info = deploy_runtime(_spec(), client=aws, iam_client=iam, **FAST)
    assert info.status == "READY"


def test_aws_errors_become_one_line_infra_errors() -> None:
    client = boto3.client("bedrock-agentcore-control", region_name=REGION)
    with Stubber(client) as stub:
        stub.add_response("list_agent_runtimes", {"agentRuntimes": []})
        stub.add_client_error(
            "create_agent_runtime",
            service_error_code="ValidationException",
            service_message="Role validation failed\nfor the given role",
            http_status_code=400,
        )
        with pytest.raises(InfraError) as caught:
            deploy_runtime(_spec(), client=client, check_role=False, **FAST)
    assert str(caught.value) == (
        "create agent runtime rollout_agent: ValidationException: "
        "Role validation failed for the given role"
    )
    assert caught.value.code == "ValidationException"


def test_destroy_by_name(aws: Any) -> None:
    deploy_runtime(_spec(), client=aws, region=REGION, **FAST)
    assert destroy_runtime("rollout_agent", client=aws, **FAST) is True
    assert aws.list_agent_runtimes()["agentRuntimes"] == []
    assert destroy_runtime("rollout_agent", client=aws, missing_ok=True) is False
    with pytest.raises(InfraError, match=f"no AgentCore runtime named 'rollout_agent' in {REGION}"):
        destroy_runtime("rollout_agent", client=aws)


def test_destroy_leaves_other_runtimes_alone(aws: Any) -> None:
    deploy_runtime(_spec(), client=aws, region=REGION, **FAST)
    deploy_runtime(_spec(name="rollout_agent_b"), client=aws, region=REGION, **FAST)
    destroy_runtime("rollout_agent", client=aws, **FAST)
    names = [r["agentRuntimeName"] for r in aws.list_agent_runtimes()["agentRuntimes"]]
    assert names == ["rollout_agent_b"]


def test_destroy_rejects_a_bad_name_and_needs_a_region(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(InfraError, match="runtime name 'no such' is invalid"):
        destroy_runtime("no such", client=object())
    for var in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    with pytest.raises(InfraError, match=r"create bedrock-agentcore-control client: .*region"):
        destroy_runtime("rollout_agent")


# agentcore.env from a CloudFormation stack.


@pytest.fixture
def stack() -> Iterator[Any]:
    """The checked-in template deployed on moto (in-process); yields the CloudFormation client."""
    with mock_aws():
        cf = boto3.client("cloudformation", region_name=REGION)
        cf.create_stack(
            StackName="AgentCoreRollout",
            TemplateBody=app.TEMPLATE_PATH.read_text(),
            Capabilities=["CAPABILITY_IAM"],
        )
        yield cf


@pytest.mark.filterwarnings("ignore:Tried to parse")
def test_env_file_from_stack_outputs_keeps_other_lines(stack: Any, tmp_path: Path) -> None:
    outputs = stack_outputs("AgentCoreRollout", client=stack)
    path = tmp_path / "agentcore.env"
    path.write_text(
        "# my settings\nAGENTCORE_ROLLOUT_BUCKET=old-bucket\n"
        "AGENTCORE_ROLLOUT_DISPATCH__START_RATE=5\n"
    )
    runtime_arn = f"arn:aws:bedrock-agentcore:{REGION}:{ACCOUNT}:runtime/rollout_agent-abcdefghij"
    env = write_stack_env("AgentCoreRollout", path, client=stack, runtime_arn=runtime_arn)
    assert env == {
        "AGENTCORE_ROLLOUT_BUCKET": outputs["BucketName"],
        "AGENTCORE_ROLLOUT_PREFIX": "rollouts",
        "AGENTCORE_ROLLOUT_QUEUE_URL": outputs["QueueUrl"],
        "AGENTCORE_ROLLOUT_RUNTIME_ARN": runtime_arn,
        "AWS_REGION": REGION,
    }
    lines = path.read_text().splitlines()
    assert lines[:3] == [
        "# my settings",
        f"AGENTCORE_ROLLOUT_BUCKET={outputs['BucketName']}",
        "AGENTCORE_ROLLOUT_DISPATCH__START_RATE=5",
    ]
    assert dotenv_values(path) == {**env, "AGENTCORE_ROLLOUT_DISPATCH__START_RATE": "5"}


@pytest.mark.filterwarnings("ignore:Tried to parse")
def test_env_without_a_runtime_leaves_the_runtime_out(stack: Any, tmp_path: Path) -> None:
    env = write_stack_env("AgentCoreRollout", tmp_path / "agentcore.env", client=stack)
    assert "AGENTCORE_ROLLOUT_RUNTIME_ARN" not in env
    assert env["AWS_REGION"] == REGION


def test_stack_errors_are_clear(tmp_path: Path) -> None:
    with mock_aws():
        cf = boto3.client("cloudformation", region_name=REGION)
        with pytest.raises(
            InfraError, match="describe stack Nope: ValidationError: Stack with id Nope"
        ):
            write_stack_env("Nope", tmp_path / "agentcore.env", client=cf)
    with pytest.raises(InfraError, match="stack outputs lack QueueUrl: is it an agentcore-rollout"):
        env_from_outputs({"BucketName": "b", "ResultPrefix": "rollouts"}, REGION)
    assert not (tmp_path / "agentcore.env").exists()


def test_env_values_round_trip_through_dotenv(tmp_path: Path) -> None:
    values = {"A": "plain", "B": "with space # and hash", "C": 'quote " and \\ slash', "D": ""}
    path = write_env_file(tmp_path / "x.env", values)
    assert dotenv_values(path) == values
    with pytest.raises(InfraError, match="value of E spans lines"):
        write_env_file(path, {"E": "a\nb"})
