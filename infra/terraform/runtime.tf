# The AgentCore Runtime, only with deploy_runtime = true: push the image first (the repository is
# created by this module, so the first apply is without the runtime).

resource "aws_bedrockagentcore_agent_runtime" "this" {
  count = var.deploy_runtime ? 1 : 0

  agent_runtime_name = var.runtime_name
  description        = "agentcore-rollout agent runtime"
  role_arn           = aws_iam_role.runtime.arn

  agent_runtime_artifact {
    container_configuration {
      container_uri = "${aws_ecr_repository.agent.repository_url}:${var.image_tag}"
    }
  }

  network_configuration {
    network_mode = var.network_mode

    dynamic "network_mode_config" {
      for_each = var.network_mode == "VPC" ? [1] : []
      content {
        subnets         = var.subnet_ids
        security_groups = var.security_group_ids
      }
    }
  }

  lifecycle_configuration {
    idle_runtime_session_timeout = var.idle_runtime_session_timeout
    max_lifetime                 = var.max_lifetime
  }

  # AGENTCORE_ROLLOUT_LLM__BASE_URL is the config key engine.llm.base_url (the gateway).
  environment_variables = merge(
    {
      AGENTCORE_ROLLOUT_BUCKET    = aws_s3_bucket.results.id
      AGENTCORE_ROLLOUT_PREFIX    = var.result_prefix
      AGENTCORE_ROLLOUT_QUEUE_URL = aws_sqs_queue.notifications.id
    },
    var.gateway_url == "" ? {} : { AGENTCORE_ROLLOUT_LLM__BASE_URL = var.gateway_url },
  )

  # The inline policy is a separate resource here: AgentCore pulls the image with it at create.
  depends_on = [aws_iam_role_policy.runtime]
}

# Endpoints beside DEFAULT, listed in engine.runtimes (qualifier rollout_k). Since August 2026
# AgentCore's quotas are the account's, shared by every endpoint: they add no start rate.
resource "aws_bedrockagentcore_agent_runtime_endpoint" "rollout" {
  count = var.deploy_runtime ? var.runtime_endpoints : 0

  agent_runtime_id = aws_bedrockagentcore_agent_runtime.this[0].agent_runtime_id
  name             = "rollout_${count.index + 1}"
  description      = "agentcore-rollout endpoint ${count.index + 1}"
}
