# Same outputs as the CloudFormation template, in snake_case.

output "bucket_name" {
  description = "Bucket that holds rollout results."
  value       = aws_s3_bucket.results.id
}

output "result_prefix" {
  description = "Result key prefix."
  value       = var.result_prefix
}

output "queue_url" {
  description = "Queue of S3 ObjectCreated notifications."
  value       = aws_sqs_queue.notifications.id
}

output "dead_letter_queue_url" {
  description = "Notifications received too often."
  value       = aws_sqs_queue.dead_letter.id
}

output "repository_uri" {
  description = "Push agent images here."
  value       = aws_ecr_repository.agent.repository_url
}

output "runtime_arn" {
  description = "ARN of the AgentCore Runtime (null without deploy_runtime)."
  value       = one(aws_bedrockagentcore_agent_runtime.this[*].agent_runtime_arn)
}

output "runtime_endpoint_arns" {
  description = "ARNs of the runtime's endpoints rollout_1 ... rollout_N (qualifiers in engine.runtimes)."
  value       = aws_bedrockagentcore_agent_runtime_endpoint.rollout[*].agent_runtime_endpoint_arn
}

output "role_arn" {
  description = "Execution role for the AgentCore Runtime."
  value       = aws_iam_role.runtime.arn
}

output "trainer_policy_arn" {
  description = "Attach to trainers."
  value       = aws_iam_policy.trainer.arn
}
