# Mirrors the parameters of infra/template/agentcore-rollout.template.json (same defaults and
# bounds); tests/infra/test_infra_terraform.py fails on a gap.

variable "result_prefix" {
  description = "Key prefix (no leading or trailing slash) under which agents write result objects."
  type        = string
  default     = "rollouts"

  validation {
    condition     = can(regex("^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$", var.result_prefix))
    error_message = "result_prefix: letters, digits, _ . - and inner slashes only."
  }
}

variable "result_expiration_days" {
  description = "Days after which result objects under the prefix are deleted."
  type        = number
  default     = 7

  validation {
    condition     = var.result_expiration_days >= 1
    error_message = "result_expiration_days must be at least 1."
  }
}

variable "max_receive_count" {
  description = "Receives after which a notification moves to the dead-letter queue."
  type        = number
  default     = 5

  validation {
    condition     = var.max_receive_count >= 1 && var.max_receive_count <= 1000
    error_message = "max_receive_count must be within 1..1000."
  }
}

variable "repository_name" {
  description = "Name of the ECR repository for agent images."
  type        = string
  default     = "agentcore-rollout"

  validation {
    condition     = can(regex("^(?:[a-z0-9]+(?:[._-][a-z0-9]+)*/)*[a-z0-9]+(?:[._-][a-z0-9]+)*$", var.repository_name))
    error_message = "repository_name is not a valid ECR repository name."
  }
}

variable "deploy_runtime" {
  description = "Create the AgentCore Runtime (push the image to the repository first)."
  type        = bool
  default     = false
}

variable "runtime_name" {
  description = "AgentCore Runtime name; the role's log and trainer permissions are scoped to it."
  type        = string
  default     = "agentcore_rollout"

  validation {
    condition     = can(regex("^[a-zA-Z][a-zA-Z0-9_]{0,47}$", var.runtime_name))
    error_message = "runtime_name: a letter, then up to 47 letters, digits or underscores."
  }
}

variable "image_tag" {
  description = "Tag of the agent image in the repository (required when deploy_runtime is true)."
  type        = string
  default     = ""

  validation {
    condition     = !var.deploy_runtime || var.image_tag != ""
    error_message = "image_tag is required when deploy_runtime is true."
  }
}

variable "network_mode" {
  description = "PUBLIC, or VPC with subnet_ids and security_group_ids."
  type        = string
  default     = "PUBLIC"

  validation {
    condition     = contains(["PUBLIC", "VPC"], var.network_mode)
    error_message = "network_mode must be PUBLIC or VPC."
  }
}

variable "subnet_ids" {
  description = "Subnets of the runtime when network_mode is VPC."
  type        = list(string)
  default     = []

  validation {
    condition     = var.network_mode != "VPC" || length(var.subnet_ids) > 0
    error_message = "subnet_ids are required when network_mode is VPC."
  }
}

variable "security_group_ids" {
  description = "Security groups of the runtime when network_mode is VPC."
  type        = list(string)
  default     = []

  validation {
    condition     = var.network_mode != "VPC" || length(var.security_group_ids) > 0
    error_message = "security_group_ids are required when network_mode is VPC."
  }
}

variable "idle_runtime_session_timeout" {
  description = "Seconds an idle session lives before AgentCore stops it."
  type        = number
  default     = 900

  validation {
    condition     = var.idle_runtime_session_timeout >= 60 && var.idle_runtime_session_timeout <= 1209600
    error_message = "idle_runtime_session_timeout must be within 60..1209600 seconds."
  }
}

variable "max_lifetime" {
  description = "Seconds a session may live at most."
  type        = number
  default     = 28800

  validation {
    condition     = var.max_lifetime >= 60 && var.max_lifetime <= 1209600
    error_message = "max_lifetime must be within 60..1209600 seconds."
  }
}

variable "gateway_url" {
  description = "Base URL of the token-capture gateway, passed to agents (optional)."
  type        = string
  default     = ""
}

variable "runtime_endpoints" {
  description = "Endpoints of the runtime beside DEFAULT (rollout_1 ... rollout_N), sharing the account's quotas; list them in engine.runtimes."
  type        = number
  default     = 0

  validation {
    condition     = var.runtime_endpoints >= 0 && var.runtime_endpoints <= 7 && floor(var.runtime_endpoints) == var.runtime_endpoints
    error_message = "runtime_endpoints must be a whole number within 0..7."
  }
}
