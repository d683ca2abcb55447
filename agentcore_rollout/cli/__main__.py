"""`python -m agentcore_rollout.cli`: the console script without installing it."""

import sys

from .args import main

sys.exit(main())
