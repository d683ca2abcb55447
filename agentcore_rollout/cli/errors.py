"""How the CLI fails: the error for input it cannot use, and its exit codes
(docs/outputs.md#exit-codes says when each is returned)."""

EXIT_ERROR, EXIT_TOO_FEW_OK, EXIT_WRITE_FAILED, EXIT_INTERRUPTED = 2, 3, 4, 130
EXIT_STACK_FAILED = 5  # `train`: a part of the local stack stopped working


class UsageError(ValueError):
    """Input the CLI cannot use: its arguments, the dataset, the output directory."""


class Interrupted(Exception):
    """Ctrl-C before anything started: nothing to clean up or resume."""
