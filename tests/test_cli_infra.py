"""`agentcore-rollout deploy / destroy / infra env` against moto's control plane over HTTP."""

from __future__ import annotations

import json

import pytest
from dotenv import dotenv_values

from agentcore_rollout.cli import main

pytestmark = pytest.mark.component

ACCOUNT = "123456789012"
IMAGE = f"{ACCOUNT}.dkr.ecr.us-east-1.amazonaws.com/agentcore-rollout:v1"


def _role(moto) -> str:
    iam = moto.client("iam")
    trust = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Service": "bedrock-agentcore.amazonaws.com"},
                "Action": "sts:AssumeRole",
            }
        ],
    }
    try:
        return iam.create_role(RoleName="acr-runtime", AssumeRolePolicyDocument=json.dumps(trust))[
            "Role"
        ]["Arn"]
    except iam.exceptions.EntityAlreadyExistsException:
        return iam.get_role(RoleName="acr-runtime")["Role"]["Arn"]


def test_deploy_prints_the_arn_and_destroy_removes_it(moto, capsys):
    base = ["--region", "us-east-1", "--endpoint-url", moto.url]
    role = _role(moto)
    args = [
        "deploy",
        "--name",
        "cli_agent",
        "--image",
        IMAGE,
        "--role",
        role,
        "--env",
        "A=1",
        "--gateway-url",
        "https://gw.example/v1",
        "--timeout",
        "10",
        *base,
    ]
    assert main(args) == 0
    arn = capsys.readouterr().out.strip()
    runtimes = moto.client("bedrock-agentcore-control").list_agent_runtimes()["agentRuntimes"]
    assert [(r["agentRuntimeName"], r["agentRuntimeArn"]) for r in runtimes] == [("cli_agent", arn)]
    assert main(["destroy", "--name", "cli_agent", *base]) == 0
    assert moto.client("bedrock-agentcore-control").list_agent_runtimes()["agentRuntimes"] == []
    assert main(["destroy", "--name", "cli_agent", "--missing-ok", *base]) == 0


def test_deploy_errors_are_one_line(moto, capsys):
    base = ["--region", "us-east-1", "--endpoint-url", moto.url]
    cases = [
        (["--name", "bad-name!", "--image", IMAGE, "--role", _role(moto)], "runtime name"),
        (
            ["--name", "ok_name", "--image", "docker.io/x:1", "--role", _role(moto)],
            "is not an ECR image",
        ),
        (
            [
                "--name",
                "ok_name",
                "--image",
                IMAGE,
                "--role",
                f"arn:aws:iam::{ACCOUNT}:role/missing",
            ],
            "missing",
        ),
        (
            ["--name", "ok_name", "--image", IMAGE, "--role", _role(moto), "--env", "NOEQUALS"],
            "is not KEY=VALUE",
        ),
    ]
    for extra, message in cases:
        assert main(["deploy", *extra, *base]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err
    assert main(["destroy", "--name", "never_made", *base]) == 2
    assert "no AgentCore runtime named 'never_made'" in capsys.readouterr().err


def test_infra_env_writes_agentcore_env(moto, tmp_path, capsys):
    cfn = moto.client("cloudformation")
    outputs = {
        "BucketName": "b-1",
        "ResultPrefix": "rollouts",
        "QueueUrl": "https://q",
        "RoleArn": "arn:r",
    }
    template = {
        "Resources": {"Topic": {"Type": "AWS::SQS::Queue"}},
        "Outputs": {k: {"Value": v} for k, v in outputs.items()},
    }
    cfn.create_stack(StackName="acr-test", TemplateBody=json.dumps(template))
    out = tmp_path / "agentcore.env"
    args = [
        "infra",
        "env",
        "--stack",
        "acr-test",
        "--out",
        str(out),
        "--runtime-arn",
        "arn:rt",
        "--region",
        "us-east-1",
        "--endpoint-url",
        moto.url,
    ]
    assert main(args) == 0, capsys.readouterr().err
    env = dotenv_values(out)
    assert (
        env["AGENTCORE_ROLLOUT_BUCKET"] == "b-1"
        and env["AGENTCORE_ROLLOUT_RUNTIME_ARN"] == "arn:rt"
    )
    assert env["AGENTCORE_ROLLOUT_QUEUE_URL"] == "https://q" and env["AWS_REGION"] == "us-east-1"
