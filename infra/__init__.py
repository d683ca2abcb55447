"""Infrastructure for agentcore-rollout: CDK app, synthesized CloudFormation template, Terraform.

A package (not shipped in the wheel) so that ``python -m infra.cdk.app`` and the tests in
``tests/infra`` can import the stack from a source checkout.
"""
