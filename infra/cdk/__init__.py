"""The CDK app that defines the rollout stack (S3 + SQS + ECR + IAM + AgentCore Runtime)."""

import os

# jsii warns on every import under Node 20; the machine's Node is 20 and synthesis works fine.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
