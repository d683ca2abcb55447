# agentcore-rollout: the Terraform twin of infra/template/agentcore-rollout.template.json.
# Names and ARNs shared by the other files.

data "aws_caller_identity" "current" {}
data "aws_partition" "current" {}
data "aws_region" "current" {}

locals {
  account_id = data.aws_caller_identity.current.account_id
  partition  = data.aws_partition.current.partition
  region     = data.aws_region.current.region

  result_key_prefix = "${var.result_prefix}/"
  results_arn       = "${aws_s3_bucket.results.arn}/${var.result_prefix}/*"

  # AgentCore runtime ids start with the runtime name, so these name this runtime only (and also
  # one made by `agentcore-rollout deploy` with the same name).
  runtime_arn_pattern = "arn:${local.partition}:bedrock-agentcore:${local.region}:${local.account_id}:runtime/${var.runtime_name}-*"
  log_group_arn       = "arn:${local.partition}:logs:${local.region}:${local.account_id}:log-group:/aws/bedrock-agentcore/runtimes/${var.runtime_name}-*"
}
