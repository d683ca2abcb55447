"""The embedded local stack: moto server, AgentCore Runtime emulator, a small CPU policy.

Needs the `[local]` extra.
"""
