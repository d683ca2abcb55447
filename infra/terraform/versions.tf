# The AgentCore Runtime resource (aws_bedrockagentcore_agent_runtime) needs provider 6.21+;
# variable validations that refer to other variables need Terraform 1.9+.
terraform {
  required_version = ">= 1.9"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 6.21, < 7.0"
    }
  }
}
