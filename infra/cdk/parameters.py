"""The template parameters of the rollout stack, and the CDK props that set their defaults.

Parameters (not CDK-time constants) so that one synthesized template serves every deployment:
users of the checked-in template choose at deploy time, CDK users through `RolloutStackProps`.
"""

from __future__ import annotations

from dataclasses import dataclass

import aws_cdk as cdk

from agentcore_rollout.runtimes.agentcore.published import (
    IDLE_TIMEOUT_S,
    LIFECYCLE_MAX_S,
    LIFECYCLE_MIN_S,
    MAX_LIFETIME_S,
)

RUNTIME_NAME_PATTERN = "^[a-zA-Z][a-zA-Z0-9_]{0,47}$"
RESULT_PREFIX_PATTERN = "^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$"
# Endpoints of the runtime beside DEFAULT. Since August 2026 AgentCore's new-session and
# data-plane quotas are the account's, shared by every endpoint: more endpoints start no more
# sessions a second (more accounts or regions do); the engine still spreads over them.
MAX_RUNTIME_ENDPOINTS = 7
REPOSITORY_NAME_PATTERN = "^(?:[a-z0-9]+(?:[._-][a-z0-9]+)*/)*[a-z0-9]+(?:[._-][a-z0-9]+)*$"


@dataclass(frozen=True)
class RolloutStackProps:
    """Defaults of the template parameters; template users override them at deploy time."""

    result_prefix: str = "rollouts"
    result_expiration_days: int = 7
    max_receive_count: int = 5
    repository_name: str = "agentcore-rollout"
    deploy_runtime: bool = False
    runtime_name: str = "agentcore_rollout"
    image_tag: str = ""
    network_mode: str = "PUBLIC"
    subnet_ids: tuple[str, ...] = ()
    security_group_ids: tuple[str, ...] = ()
    idle_runtime_session_timeout: int = IDLE_TIMEOUT_S
    max_lifetime: int = MAX_LIFETIME_S
    gateway_url: str = ""
    runtime_endpoints: int = 0


class Parameters:
    """The template parameters, created once so every resource refers to the same ones."""

    def __init__(self, stack: cdk.Stack, props: RolloutStackProps) -> None:
        def param(name: str, description: str, **kwargs: object) -> cdk.CfnParameter:
            return cdk.CfnParameter(stack, name, description=description, **kwargs)

        self.result_prefix = param(
            "ResultPrefix",
            "Key prefix (no leading or trailing slash) under which agents write result objects.",
            type="String",
            default=props.result_prefix,
            allowed_pattern=RESULT_PREFIX_PATTERN,
        )
        self.result_expiration_days = param(
            "ResultExpirationDays",
            "Days after which result objects under the prefix are deleted.",
            type="Number",
            default=props.result_expiration_days,
            min_value=1,
        )
        self.max_receive_count = param(
            "MaxReceiveCount",
            "Receives after which a notification moves to the dead-letter queue.",
            type="Number",
            default=props.max_receive_count,
            min_value=1,
            max_value=1000,
        )
        self.repository_name = param(
            "RepositoryName",
            "Name of the ECR repository for agent images.",
            type="String",
            default=props.repository_name,
            allowed_pattern=REPOSITORY_NAME_PATTERN,
        )
        self.deploy_runtime = param(
            "DeployRuntime",
            "Create the AgentCore Runtime (push the image to the repository first).",
            type="String",
            default="true" if props.deploy_runtime else "false",
            allowed_values=["true", "false"],
        )
        self.runtime_name = param(
            "RuntimeName",
            "AgentCore Runtime name; the role's log and trainer permissions are scoped to it.",
            type="String",
            default=props.runtime_name,
            allowed_pattern=RUNTIME_NAME_PATTERN,
        )
        self.image_tag = param(
            "ImageTag",
            "Tag of the agent image in the repository (required when DeployRuntime is true).",
            type="String",
            default=props.image_tag,
        )
        self.network_mode = param(
            "NetworkMode",
            "PUBLIC, or VPC with SubnetIds and SecurityGroupIds.",
            type="String",
            default=props.network_mode,
            allowed_values=["PUBLIC", "VPC"],
        )
        self.subnet_ids = param(
            "SubnetIds",
            "Subnets of the runtime when NetworkMode is VPC.",
            type="CommaDelimitedList",
            default=",".join(props.subnet_ids),
        )
        self.security_group_ids = param(
            "SecurityGroupIds",
            "Security groups of the runtime when NetworkMode is VPC.",
            type="CommaDelimitedList",
            default=",".join(props.security_group_ids),
        )
        self.idle_timeout = param(
            "IdleRuntimeSessionTimeout",
            "Seconds an idle session lives before AgentCore stops it.",
            type="Number",
            default=props.idle_runtime_session_timeout,
            min_value=LIFECYCLE_MIN_S,
            max_value=LIFECYCLE_MAX_S,
        )
        self.max_lifetime = param(
            "MaxLifetime",
            "Seconds a session may live at most.",
            type="Number",
            default=props.max_lifetime,
            min_value=LIFECYCLE_MIN_S,
            max_value=LIFECYCLE_MAX_S,
        )
        self.gateway_url = param(
            "GatewayUrl",
            "Base URL of the token-capture gateway, passed to agents (optional).",
            type="String",
            default=props.gateway_url,
        )
        self.runtime_endpoints = param(
            "RuntimeEndpoints",
            "Endpoints of the runtime beside DEFAULT (rollout_1 ... rollout_N), sharing the "
            "account's quotas; list them in engine.runtimes.",
            type="Number",
            default=props.runtime_endpoints,
            min_value=0,
            max_value=MAX_RUNTIME_ENDPOINTS,
        )
