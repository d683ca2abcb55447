"""`python -m agentcore_rollout.integrations.verl [--config-path DIR --config-name NAME] [HYDRA
OVERRIDES...]`: the same as `agentcore-rollout verl ...`."""

import sys

from .switch import run

sys.exit(run(sys.argv[1:]))
