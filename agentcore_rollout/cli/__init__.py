"""`agentcore-rollout`: run rollouts, keep the local stack up, deploy the runtime.

    agentcore-rollout run                     # the example dataset on the embedded local stack
    agentcore-rollout run --config configs/aws.yaml --n 8 engine.dispatch.start_rate=5
    agentcore-rollout train [--steps 20] [--max-staleness 1]   # GRPO on the local toy policy
    agentcore-rollout verl [--config-path D --config-name N] [HYDRA OVERRIDES]  # veRL, agentcore
    agentcore-rollout local up                # keep the stack running; prints its endpoints
    agentcore-rollout deploy --name NAME --image URI --role ARN   # prints the runtime ARN
    agentcore-rollout infra env --stack NAME  # agentcore.env from the stack's outputs
    agentcore-rollout view out                # out/view.html: the run's rollouts, offline

Without --config (or $AGENTCORE_ROLLOUT_CONFIG), `run` and `local up` load configs/local.yaml
and `train` configs/train.yaml from the current directory if it is there (the repository's
root), else the built-in defaults that configs/engine.yaml lists. Dotted overrides
(`engine.key=value`) may go anywhere.

Exit codes: 0 when at least `run.min_ok_fraction` of the requests ended `ok`; 3 when fewer
did (rollouts.jsonl and summary.json are still written, the summary still printed); 4 when the
output could not be written (disk full, read-only...): no new session was started, the running
ones finished into S3, and `run --resume OUT` collects them once it is writable; 130 when
interrupted, after writing every request's outcome (the unfinished ones as `cancelled`, which
`--resume` runs again), or at once on a second Ctrl-C, with the summary of what ended; 2 for a
usage, config, dataset or output-directory error (a folder another run holds, or one with a
run's output without `--resume` or `--overwrite`), which is one line on stderr and is found
before anything starts.
`train` exits 5 when a part of the local stack it needs stops working (a policy worker that
cannot be reached): one line names it, and what was trained so far stays.

One module per concept, `args` first (docs/architecture.md lists them); they use the public
API only, so the CLI is a user of the engine like any trainer.
"""

from .args import main

__all__ = ["main"]
