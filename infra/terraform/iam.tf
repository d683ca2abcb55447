# Runtime execution role (trusted by AgentCore in this account only) and the trainer policy.
# Explicit actions only; the single "*" resource is ecr:GetAuthorizationToken, which has no
# resource-level permissions.

data "aws_iam_policy_document" "runtime_trust" {
  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["bedrock-agentcore.amazonaws.com"]
    }

    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [local.account_id]
    }

    condition {
      test     = "ArnLike"
      variable = "aws:SourceArn"
      values   = ["arn:${local.partition}:bedrock-agentcore:${local.region}:${local.account_id}:*"]
    }
  }
}

resource "aws_iam_role" "runtime" {
  name_prefix        = "agentcore-rollout-runtime-"
  description        = "Execution role of the agentcore-rollout AgentCore Runtime"
  assume_role_policy = data.aws_iam_policy_document.runtime_trust.json
}

data "aws_iam_policy_document" "runtime" {
  statement {
    sid       = "WriteRolloutResults"
    actions   = ["s3:PutObject"]
    resources = [local.results_arn]
  }

  # A separate verifier's session reads what the agent's session put beside its result.
  statement {
    sid       = "ReadHandedArtifacts"
    actions   = ["s3:GetObject"]
    resources = ["${local.results_arn}.artifacts.tar.gz"]
  }

  statement {
    sid       = "NotifyQueue"
    actions   = ["sqs:SendMessage"]
    resources = [aws_sqs_queue.notifications.arn]
  }

  statement {
    sid       = "PullAgentImage"
    actions   = ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"]
    resources = [aws_ecr_repository.agent.arn]
  }

  statement {
    sid       = "GetEcrToken"
    actions   = ["ecr:GetAuthorizationToken"]
    resources = ["*"]
  }

  statement {
    sid       = "OwnLogGroup"
    actions   = ["logs:CreateLogGroup", "logs:DescribeLogStreams"]
    resources = [local.log_group_arn]
  }

  statement {
    sid       = "OwnLogStreams"
    actions   = ["logs:CreateLogStream", "logs:PutLogEvents"]
    resources = ["${local.log_group_arn}:log-stream:*"]
  }
}

resource "aws_iam_role_policy" "runtime" {
  name   = "rollout-runtime"
  role   = aws_iam_role.runtime.id
  policy = data.aws_iam_policy_document.runtime.json
}

data "aws_iam_policy_document" "trainer" {
  statement {
    sid = "InvokeAndStopRuntimeSessions"
    actions = [
      "bedrock-agentcore:InvokeAgentRuntime",
      "bedrock-agentcore:StopRuntimeSession",
    ]
    # This module's runtime when it has one; otherwise the runtime of that name.
    resources = var.deploy_runtime ? flatten([
      for arn in aws_bedrockagentcore_agent_runtime.this[*].agent_runtime_arn :
      [arn, "${arn}/runtime-endpoint/*"]
    ]) : [local.runtime_arn_pattern]
  }

  statement {
    sid = "ConsumeNotifications"
    actions = [
      "sqs:ReceiveMessage",
      "sqs:DeleteMessage",
      "sqs:ChangeMessageVisibility",
      "sqs:GetQueueAttributes",
    ]
    resources = [aws_sqs_queue.notifications.arn]
  }

  statement {
    sid       = "ReadRolloutResults"
    actions   = ["s3:GetObject"]
    resources = [local.results_arn]
  }

  # Only with an s3:prefix under the prefix: the engine's start-up check lists "<prefix>/"
  # (ListObjectsV2, MaxKeys=1; HeadBucket, with no s3:prefix, is denied), and listing makes a
  # missing result a 404 instead of a 403 (resume). Not "<prefix>*": that lists siblings too.
  statement {
    sid       = "ListRolloutResults"
    actions   = ["s3:ListBucket"]
    resources = [aws_s3_bucket.results.arn]

    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = [local.result_key_prefix, "${var.result_prefix}/*"]
    }
  }

  # AgentCore's quotas as the account has them, read once at start-up (the published defaults
  # without it). Service Quotas' List* actions take no resource but "*".
  statement {
    sid       = "ReadAgentCoreQuotas"
    actions   = ["servicequotas:ListServiceQuotas"]
    resources = ["*"]
  }
}

resource "aws_iam_policy" "trainer" {
  name_prefix = "agentcore-rollout-trainer-"
  description = "Trainer side of agentcore-rollout: invoke runtime, read results"
  policy      = data.aws_iam_policy_document.trainer.json
}
