"""The embedded local stack (the `[local]` extra): moto, the AgentCore Runtime emulator (which hosts
any app of the AgentCore container contract) and a small CPU policy. docs/local-stack.md."""
