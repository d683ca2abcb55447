"""`agentcore-rollout`: run rollouts, train on the local stack, keep it up, deploy the runtime.

One module per concept, `args` first (docs/architecture.md lists them). They use the public API
only, so the CLI is a user of the engine like any trainer. The commands: `agentcore-rollout
--help` and docs/getting-started.md; the config file: docs/configuration.md; the exit codes:
docs/outputs.md#exit-codes."""

from .args import main

__all__ = ["main"]
