"""`--smoke`, the same in every bench: its code paths at a tiny size, in seconds, so CI runs
each bench (bench/smoke.py) and a bench that breaks fails there. Its JSON and PNG go to
out/bench-smoke/, never over bench/results/."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, NoReturn

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
SMOKE_OUT = ROOT / "out" / "bench-smoke"
SKIPPED = 77  # exit status of a bench whose extra is not installed (automake's "skip")
HELP = "a tiny size, in seconds (CI's), its JSON and PNG into out/bench-smoke/"


def parse(parser: argparse.ArgumentParser, argv: list[str] | None = None, **tiny: Any):
    """`parser`'s arguments plus `--smoke`, which sets `tiny` (argument: value) and sends
    `--out` from bench/results/ to out/bench-smoke/."""
    parser.add_argument("--smoke", action="store_true", help=HELP)
    args = parser.parse_args(argv)
    if args.smoke:
        vars(args).update(tiny)
        if Path(getattr(args, "out", SMOKE_OUT)).resolve() == RESULTS:
            args.out = SMOKE_OUT
    return args


def skip(reason: str) -> NoReturn:
    """End a smoke run whose extra is not here: the reason, and the status the runner reads."""
    print(f"skipped: {reason}", file=sys.stderr, flush=True)
    sys.exit(SKIPPED)
