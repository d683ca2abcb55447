"""Generate the example's small arithmetic dataset (deterministic; nothing is downloaded).

python -m examples.math_agent.make_data [--n 8] [--seed 0] [--out FILE.jsonl]
    [--max-turns K] [--format-weight W]

`data/format.jsonl` (SmolLM2's training set) is `--n 19 --max-turns 1 --format-weight 1`: one
turn per rollout, and a reward for leading with an integer besides the one for being right.

Every question has its own digit sum. The local toy policy sees a question only through that
sum (its "cue", see `agentcore_rollout.local.policy.model`), so two questions with one cue and
different answers ("6 + 6" and "8 - 4" both sum to 12) would be a contradiction it cannot learn.
With single digits there are 19 sums (0 to 18), so at most 19 questions.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
MAX_QUESTIONS = 19


def make_problems(n: int, seed: int) -> list[dict]:
    """Single-digit sums and differences, each with a distinct digit sum: small enough for the
    tiny local policy to sometimes get right, so rewards vary within a group (what GRPO
    needs)."""
    if not 1 <= n <= MAX_QUESTIONS:
        raise ValueError(f"n must be in [1, {MAX_QUESTIONS}] (one question per digit sum)")
    rng = random.Random(seed)
    problems: list[dict] = []
    cues: set[int] = set()
    while len(problems) < n:
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        if a + b in cues:
            continue
        op = rng.choice("+-")
        if op == "-" and b > a:
            a, b = b, a
        cues.add(a + b)
        answer = a + b if op == "+" else a - b
        problems.append(
            {
                "id": f"math-{len(problems):04d}",
                "question": f"What is {a} {op} {b}?",
                "answer": answer,
            }
        )
    return problems


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=HERE / "data" / "train.jsonl")
    parser.add_argument("--max-turns", type=int, help="the agent's turns (default: its own, 3)")
    parser.add_argument("--format-weight", type=float, help="the agent's format reward weight")
    args = parser.parse_args()
    options = {"max_turns": args.max_turns, "format_weight": args.format_weight}
    options = {k: v for k, v in options.items() if v is not None}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as f:
        for problem in make_problems(args.n, args.seed):
            f.write(json.dumps(problem | options) + "\n")


if __name__ == "__main__":
    main()
