"""The embedded local stack: moto server, the AgentCore Runtime emulator (which hosts any app
of the AgentCore container contract), a small CPU policy.

Needs the `[local]` extra.
"""
