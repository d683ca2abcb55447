"""The rollout stack: where agents write results, how the trainer hears of them, what runs agents.

Every deploy-time choice is a CloudFormation parameter whose default comes from
`RolloutStackProps`, so the synthesized template in ``infra/template`` deploys on its own
(``aws cloudformation deploy``) and CDK users set the same values in Python.

Security shape (tests/infra checks each point, and the Terraform module mirrors it):

* bucket: SSE-S3, all public access blocked, TLS-only policy, results expire under the prefix;
* queue + DLQ: SSE-SQS, redrive, only this bucket in this account may send S3 events;
* runtime role: trusted by AgentCore in this account only; may put results under the prefix,
  send to the queue, pull from this repository and write its own logs, nothing else;
* trainer policy: invoke/stop this runtime, consume the queue, read and list results under the
  prefix (never the whole bucket: the engine's start-up check lists ``<prefix>/``).

The runtime itself sits behind the ``DeployRuntime`` parameter: the image must be pushed to the
repository this stack creates before a runtime can start, so the first deploy is without it.
"""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import Aws, Duration, Fn
from aws_cdk import aws_bedrockagentcore as agentcore
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from infra.cdk.parameters import MAX_RUNTIME_ENDPOINTS, Parameters, RolloutStackProps

STACK_DESCRIPTION = (
    "agentcore-rollout: S3 results bucket, SQS notification queue, ECR repository, IAM roles and "
    "an optional Bedrock AgentCore Runtime for RL rollouts"
)
RESULT_SUFFIX = ".json"
# Where AgentCore Runtime writes a runtime's logs; the runtime id starts with its name.
RUNTIME_LOG_GROUP_PREFIX = "/aws/bedrock-agentcore/runtimes/"

SSE_SQS_SKIP = {
    "CKV_AWS_27": "Encrypted with SSE-SQS (SqsManagedSseEnabled); checkov's CloudFormation check "
    "only accepts KMS, and S3 cannot deliver events to a queue under the AWS-managed KMS key."
}


def skip_checkov(resource: cdk.CfnResource, reasons: dict[str, str]) -> None:
    """Record checkov suppressions in the resource metadata, each with the reason it is safe."""
    resource.add_metadata(
        "checkov", {"skip": [{"id": check, "comment": why} for check, why in reasons.items()]}
    )


def _cfn(construct: Construct, logical_id: str) -> cdk.CfnResource:
    """The L1 resource under an L2 construct, renamed to a stable, readable logical id."""
    resource = construct.node.default_child
    assert isinstance(resource, cdk.CfnResource)
    resource.override_logical_id(logical_id)
    return resource


class AgentCoreRolloutStack(cdk.Stack):
    """S3 + SQS + ECR + IAM + (optionally) the AgentCore Runtime of one rollout deployment."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        props: RolloutStackProps | None = None,
        **kwargs: object,
    ) -> None:
        super().__init__(scope, construct_id, description=STACK_DESCRIPTION, **kwargs)
        self.params = p = Parameters(self, props or RolloutStackProps())
        self.runtime_enabled = cdk.CfnCondition(
            self, "RuntimeEnabled", expression=Fn.condition_equals(p.deploy_runtime, "true")
        )
        self.use_vpc = cdk.CfnCondition(
            self, "UseVpc", expression=Fn.condition_equals(p.network_mode, "VPC")
        )
        self.has_gateway_url = cdk.CfnCondition(
            self,
            "HasGatewayUrl",
            expression=Fn.condition_not(Fn.condition_equals(p.gateway_url, "")),
        )
        self._rules()

        prefix = p.result_prefix.value_as_string
        self.bucket_name = self._bucket_name()
        self.bucket_arn = self.format_arn(
            service="s3", region="", account="", resource=self.bucket_name
        )
        self.results_arn = f"{self.bucket_arn}/{prefix}/*"
        self.artifacts_arn = f"{self.bucket_arn}/{prefix}/*.artifacts.tar.gz"
        self.runtime_arn_pattern = self.format_arn(
            service="bedrock-agentcore",
            resource="runtime",
            resource_name=f"{p.runtime_name.value_as_string}-*",
        )

        self.queue = self._queues()
        self.bucket = self._bucket()
        self.repository = self._repository()
        self.role = self._runtime_role()
        self.runtime = self._runtime()
        self.runtime_endpoints = self._runtime_endpoints()
        self.trainer_policy = self._trainer_policy()
        self._outputs()

    def _rules(self) -> None:
        """Reject parameter sets that would only fail later, inside AgentCore."""
        p = self.params
        cdk.CfnRule(
            self,
            "ImageTagRequired",
            rule_condition=Fn.condition_equals(p.deploy_runtime, "true"),
            assertions=[
                cdk.CfnRuleAssertion(
                    assert_=Fn.condition_not(Fn.condition_equals(p.image_tag, "")),
                    assert_description="ImageTag is required when DeployRuntime is true.",
                )
            ],
        )
        for name, param in (("Subnets", p.subnet_ids), ("SecurityGroups", p.security_group_ids)):
            cdk.CfnRule(
                self,
                f"Vpc{name}Required",
                rule_condition=Fn.condition_equals(p.network_mode, "VPC"),
                assertions=[
                    cdk.CfnRuleAssertion(
                        assert_=Fn.condition_not(
                            Fn.condition_each_member_equals(param.value_as_list, "")
                        ),
                        assert_description=f"{name} are required when NetworkMode is VPC.",
                    )
                ],
            )

    def _bucket_name(self) -> str:
        """A globally unique name known before the bucket exists.

        The queue policy must name the bucket (aws:SourceArn) and exist before the bucket's
        notification configuration is validated, so the ARN cannot come from the bucket itself
        without a dependency cycle. The first block of the stack id's UUID makes it unique.
        """
        stack_uuid = Fn.select(2, Fn.split("/", Aws.STACK_ID))
        return Fn.join(
            "-", ["agentcore-rollout", Aws.ACCOUNT_ID, Fn.select(0, Fn.split("-", stack_uuid))]
        )

    def _queues(self) -> sqs.Queue:
        """Notification queue (SSE-SQS, TLS only, redrive to a DLQ); S3 of this bucket may send."""
        dlq = sqs.Queue(
            self,
            "DeadLetterQueue",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=Duration.days(14),
        )
        skip_checkov(_cfn(dlq, "DeadLetterQueue"), SSE_SQS_SKIP)
        self.dead_letter_queue = dlq
        queue = sqs.Queue(
            self,
            "NotificationQueue",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            visibility_timeout=Duration.seconds(60),
            retention_period=Duration.days(4),
            dead_letter_queue=sqs.DeadLetterQueue(
                queue=dlq, max_receive_count=self.params.max_receive_count.value_as_number
            ),
        )
        skip_checkov(_cfn(queue, "NotificationQueue"), SSE_SQS_SKIP)
        queue.add_to_resource_policy(
            iam.PolicyStatement(
                sid="AllowObjectCreatedEventsFromResultsBucket",
                principals=[iam.ServicePrincipal("s3.amazonaws.com")],
                actions=["sqs:SendMessage"],
                resources=[queue.queue_arn],
                conditions={
                    "ArnEquals": {"aws:SourceArn": self.bucket_arn},
                    "StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID},
                },
            )
        )
        return queue

    def _bucket(self) -> s3.Bucket:
        """Results bucket; ObjectCreated events under the prefix go straight to the queue."""
        prefix = f"{self.params.result_prefix.value_as_string}/"
        bucket = s3.Bucket(
            self,
            "ResultsBucket",
            bucket_name=self.bucket_name,
            encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            removal_policy=cdk.RemovalPolicy.RETAIN,
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="ExpireRolloutResults",
                    prefix=prefix,
                    expiration=Duration.days(self.params.result_expiration_days.value_as_number),
                ),
                s3.LifecycleRule(
                    id="AbortIncompleteUploads",
                    abort_incomplete_multipart_upload_after=Duration.days(1),
                ),
            ],
        )
        cfn_bucket = _cfn(bucket, "ResultsBucket")
        assert isinstance(cfn_bucket, s3.CfnBucket)
        # Set on the bucket itself: atomic with the write path, and no Lambda-backed
        # BucketNotifications custom resource. S3 validates the queue policy when this is set.
        cfn_bucket.notification_configuration = s3.CfnBucket.NotificationConfigurationProperty(
            queue_configurations=[
                s3.CfnBucket.QueueConfigurationProperty(
                    event="s3:ObjectCreated:*",
                    queue=self.queue.queue_arn,
                    filter=s3.CfnBucket.NotificationFilterProperty(
                        s3_key=s3.CfnBucket.S3KeyFilterProperty(
                            rules=[
                                s3.CfnBucket.FilterRuleProperty(name="prefix", value=prefix),
                                s3.CfnBucket.FilterRuleProperty(name="suffix", value=RESULT_SUFFIX),
                            ]
                        )
                    ),
                )
            ]
        )
        queue_policy = self.queue.node.find_child("Policy")
        cfn_bucket.node.add_dependency(queue_policy)
        skip_checkov(
            cfn_bucket,
            {
                "CKV_AWS_18": "Short-lived rollout results; CloudTrail data events are the "
                "audit trail where one is needed, not a second logging bucket.",
                "CKV_AWS_21": "Results are written once (If-None-Match) and expire; versions "
                "would only keep copies of expired results.",
                "CKV_AWS_144": "Rollout results are reproducible training by-products; "
                "cross-region replication is not worth its cost.",
                "CKV_AWS_145": "SSE-S3 keeps S3 event delivery to SQS and the agents free of "
                "KMS grants; no customer key is required for this data.",
            },
        )
        return bucket

    def _repository(self) -> ecr.Repository:
        """Agent images: explicit name, scanned on push, immutable tags, bounded history."""
        repository = ecr.Repository(
            self,
            "AgentRepository",
            repository_name=self.params.repository_name.value_as_string,
            image_scan_on_push=True,
            image_tag_mutability=ecr.TagMutability.IMMUTABLE,
            encryption=ecr.RepositoryEncryption.AES_256,
            removal_policy=cdk.RemovalPolicy.RETAIN,
            lifecycle_rules=[ecr.LifecycleRule(max_image_count=50)],
        )
        skip_checkov(
            _cfn(repository, "AgentRepository"),
            {"CKV_AWS_136": "AES-256 at rest; agent images hold code, not data needing a CMK."},
        )
        return repository

    def _runtime_role(self) -> iam.Role:
        """Execution role of the runtime: trusted by AgentCore in this account only."""
        name = self.params.runtime_name.value_as_string
        log_group_arn = self.format_arn(
            service="logs",
            resource="log-group",
            resource_name=f"{RUNTIME_LOG_GROUP_PREFIX}{name}-*",
            arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME,
        )
        statements = [
            iam.PolicyStatement(
                sid="WriteRolloutResults",
                actions=["s3:PutObject"],
                resources=[self.results_arn],
            ),
            # A separate verifier's session reads what the agent's session put beside its
            # result (`contract.artifacts_key`), nothing else: results stay write-only.
            iam.PolicyStatement(
                sid="ReadHandedArtifacts",
                actions=["s3:GetObject"],
                resources=[self.artifacts_arn],
            ),
            iam.PolicyStatement(
                sid="NotifyQueue", actions=["sqs:SendMessage"], resources=[self.queue.queue_arn]
            ),
            iam.PolicyStatement(
                sid="PullAgentImage",
                actions=["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"],
                resources=[self.repository.repository_arn],
            ),
            # GetAuthorizationToken has no resource-level permissions: "*" is the only form.
            iam.PolicyStatement(
                sid="GetEcrToken", actions=["ecr:GetAuthorizationToken"], resources=["*"]
            ),
            iam.PolicyStatement(
                sid="OwnLogGroup",
                actions=["logs:CreateLogGroup", "logs:DescribeLogStreams"],
                resources=[log_group_arn],
            ),
            iam.PolicyStatement(
                sid="OwnLogStreams",
                actions=["logs:CreateLogStream", "logs:PutLogEvents"],
                resources=[f"{log_group_arn}:log-stream:*"],
            ),
        ]
        role = iam.Role(
            self,
            "RuntimeRole",
            description="Execution role of the agentcore-rollout AgentCore Runtime",
            assumed_by=iam.ServicePrincipal(
                "bedrock-agentcore.amazonaws.com",
                conditions={
                    "StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID},
                    "ArnLike": {
                        "aws:SourceArn": self.format_arn(service="bedrock-agentcore", resource="*")
                    },
                },
            ),
            inline_policies={"rollout-runtime": iam.PolicyDocument(statements=statements)},
        )
        _cfn(role, "RuntimeRole")
        return role

    def _runtime(self) -> agentcore.CfnRuntime:
        """The AgentCore Runtime, present only when DeployRuntime is true."""
        p = self.params
        vpc_config = {
            "SecurityGroups": p.security_group_ids.value_as_list,
            "Subnets": p.subnet_ids.value_as_list,
        }
        runtime = agentcore.CfnRuntime(
            self,
            "Runtime",
            agent_runtime_name=p.runtime_name.value_as_string,
            description="agentcore-rollout agent runtime",
            role_arn=self.role.role_arn,
            agent_runtime_artifact=agentcore.CfnRuntime.AgentRuntimeArtifactProperty(
                container_configuration=agentcore.CfnRuntime.ContainerConfigurationProperty(
                    container_uri=f"{self.repository.repository_uri}:{p.image_tag.value_as_string}"
                )
            ),
            network_configuration=agentcore.CfnRuntime.NetworkConfigurationProperty(
                network_mode=p.network_mode.value_as_string,
                network_mode_config=Fn.condition_if(
                    self.use_vpc.logical_id, vpc_config, Aws.NO_VALUE
                ),
            ),
            lifecycle_configuration=agentcore.CfnRuntime.LifecycleConfigurationProperty(
                idle_runtime_session_timeout=p.idle_timeout.value_as_number,
                max_lifetime=p.max_lifetime.value_as_number,
            ),
            environment_variables={
                "AGENTCORE_ROLLOUT_BUCKET": self.bucket.bucket_name,
                "AGENTCORE_ROLLOUT_PREFIX": p.result_prefix.value_as_string,
                "AGENTCORE_ROLLOUT_QUEUE_URL": self.queue.queue_url,
                # The config key engine.llm.base_url: where agents reach the policy.
                "AGENTCORE_ROLLOUT_LLM__BASE_URL": Fn.condition_if(
                    self.has_gateway_url.logical_id, p.gateway_url.value_as_string, Aws.NO_VALUE
                ).to_string(),
            },
        )
        runtime.cfn_options.condition = self.runtime_enabled
        # SubnetIds and SecurityGroupIds default to empty: they are used only in VPC mode, where
        # the Vpc*Required rules demand real ids. cfn-lint still checks the empty defaults against
        # the id patterns inside the untaken Fn::If branch (W1030, reported at the parameters, so
        # resource metadata cannot silence it).
        self.template_options.metadata = {"cfn-lint": {"config": {"ignore_checks": ["W1030"]}}}
        return runtime

    def _runtime_endpoints(self) -> list[agentcore.CfnRuntimeEndpoint]:
        """`RuntimeEndpoints` endpoints of the runtime beside DEFAULT: `rollout_k` exists when
        the runtime does and the count is k or more (CloudFormation has no loops: one resource
        per possible endpoint, each under its own condition)."""
        count = self.params.runtime_endpoints.value_as_string
        endpoints = []
        for k in range(1, MAX_RUNTIME_ENDPOINTS + 1):
            below = [Fn.condition_equals(count, str(n)) for n in range(k)]
            at_least_k = Fn.condition_not(below[0] if k == 1 else Fn.condition_or(*below))
            condition = cdk.CfnCondition(
                self,
                f"HasRuntimeEndpoint{k}",
                expression=Fn.condition_and(self.runtime_enabled, at_least_k),
            )
            endpoint = agentcore.CfnRuntimeEndpoint(
                self,
                f"RuntimeEndpoint{k}",
                agent_runtime_id=self.runtime.attr_agent_runtime_id,
                name=f"rollout_{k}",
                description=f"agentcore-rollout endpoint {k}",
            )
            endpoint.cfn_options.condition = condition
            endpoints.append(endpoint)
        return endpoints

    def _trainer_policy(self) -> iam.ManagedPolicy:
        """What the trainer side needs: invoke/stop sessions, consume events, read results.

        Without the runtime in this stack, the runtime permissions name the runtime by its name
        (``runtime/{RuntimeName}-*``), which also covers one made by ``agentcore-rollout deploy``.
        """
        runtime_arn = self.runtime.attr_agent_runtime_arn
        runtime_resources = Fn.condition_if(
            self.runtime_enabled.logical_id,
            [runtime_arn, f"{runtime_arn}/runtime-endpoint/*"],
            [self.runtime_arn_pattern],
        )
        prefix = self.params.result_prefix.value_as_string
        statements = [
            iam.PolicyStatement(
                sid="InvokeAndStopRuntimeSessions",
                actions=[
                    "bedrock-agentcore:InvokeAgentRuntime",
                    "bedrock-agentcore:StopRuntimeSession",
                ],
                resources=cdk.Token.as_list(runtime_resources),
            ),
            iam.PolicyStatement(
                sid="ConsumeNotifications",
                actions=[
                    "sqs:ReceiveMessage",
                    "sqs:DeleteMessage",
                    "sqs:ChangeMessageVisibility",
                    "sqs:GetQueueAttributes",
                ],
                resources=[self.queue.queue_arn],
            ),
            iam.PolicyStatement(
                sid="ReadRolloutResults", actions=["s3:GetObject"], resources=[self.results_arn]
            ),
            # Only with an s3:prefix under the prefix: the engine's start-up check lists
            # "<prefix>/" (ListObjectsV2, MaxKeys=1; HeadBucket, with no s3:prefix, is denied),
            # and listing makes a missing result a 404 instead of a 403 (resume). StringLike's
            # "*" also matches nothing, so "<prefix>/*" alone would cover "<prefix>/"; both are
            # named to say so. Not "<prefix>*": that would list sibling prefixes too.
            iam.PolicyStatement(
                sid="ListRolloutResults",
                actions=["s3:ListBucket"],
                resources=[self.bucket_arn],
                conditions={"StringLike": {"s3:prefix": [f"{prefix}/", f"{prefix}/*"]}},
            ),
            # AgentCore's quotas as the account has them, read once at start-up (the published
            # defaults without it). Service Quotas' List* actions take no resource but "*".
            iam.PolicyStatement(
                sid="ReadAgentCoreQuotas",
                actions=["servicequotas:ListServiceQuotas"],
                resources=["*"],
            ),
        ]
        policy = iam.ManagedPolicy(
            self,
            "TrainerPolicy",
            description="Trainer side of agentcore-rollout: invoke runtime, read results",
            statements=statements,
        )
        _cfn(policy, "TrainerPolicy")
        return policy

    def _outputs(self) -> None:
        """The values `agentcore-rollout infra env` turns into agentcore.env."""
        outputs: dict[str, tuple[str, str]] = {
            "BucketName": (self.bucket.bucket_name, "Bucket that holds rollout results."),
            "ResultPrefix": (self.params.result_prefix.value_as_string, "Result key prefix."),
            "QueueUrl": (self.queue.queue_url, "Queue of S3 ObjectCreated notifications."),
            "DeadLetterQueueUrl": (
                self.dead_letter_queue.queue_url,
                "Notifications received too often.",
            ),
            "RepositoryUri": (self.repository.repository_uri, "Push agent images here."),
            "RoleArn": (self.role.role_arn, "Execution role for the AgentCore Runtime."),
            "TrainerPolicyArn": (self.trainer_policy.managed_policy_arn, "Attach to trainers."),
        }
        for name, (value, description) in outputs.items():
            self._output(name, value, description)
        self._output(
            "RuntimeArn",
            self.runtime.attr_agent_runtime_arn,
            "ARN of the AgentCore Runtime.",
            condition=self.runtime_enabled,
        )
        for k, endpoint in enumerate(self.runtime_endpoints, start=1):
            self._output(
                f"RuntimeEndpoint{k}Arn",
                endpoint.attr_agent_runtime_endpoint_arn,
                f"ARN of the runtime endpoint rollout_{k} (engine.runtimes qualifier).",
                condition=endpoint.cfn_options.condition,
            )

    def _output(
        self, name: str, value: str, description: str, condition: cdk.CfnCondition | None = None
    ) -> None:
        """An output named exactly ``name`` (outputs and parameters may share names in CFN)."""
        output = cdk.CfnOutput(
            self, f"{name}Output", value=value, description=description, condition=condition
        )
        output.override_logical_id(name)
