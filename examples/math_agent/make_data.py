"""Generate the example's small arithmetic dataset (deterministic; nothing is downloaded).

python -m examples.math_agent.make_data [--n 8] [--seed 0] [--out FILE.jsonl]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent


def make_problems(n: int, seed: int) -> list[dict]:
    """Single-digit sums and differences: small enough for the tiny local policy to
    sometimes get right, so rewards vary within a group (what GRPO needs)."""
    rng = random.Random(seed)
    problems = []
    for i in range(n):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        op = rng.choice("+-")
        if op == "-" and b > a:
            a, b = b, a
        answer = a + b if op == "+" else a - b
        problems.append(
            {"id": f"math-{i:04d}", "question": f"What is {a} {op} {b}?", "answer": answer}
        )
    return problems


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=HERE / "data" / "train.jsonl")
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as f:
        for problem in make_problems(args.n, args.seed):
            f.write(json.dumps(problem) + "\n")


if __name__ == "__main__":
    main()
