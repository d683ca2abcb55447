"""Harbor's verifier contract, run inside the task's environment once the agent has finished.

`/tests` and `/logs/verifier` are emptied (made if absent), the task's tests are written into
`/tests` (until then they were only in the payload: the agent never saw them), and `bash
/tests/test.sh` runs in the task's working directory with the task's `[verifier] env`, under
its timeout, in a process group of its own killed whole at that timeout. Its output goes to
`/logs/verifier/test-stdout.txt`, as Harbor's does.

The reward is what the tests wrote, read as Harbor reads it: `/logs/verifier/reward.txt` (one
number), else `reward.json` (a number per name). A `test.sh` that exits nonzero but wrote a
reward is a verdict, as in Harbor (many write 0 and exit 1). Every way it cannot judge (no
bash, no `test.sh`, no reward written, a reward that is not one finite number, its timeout)
raises `VerifierError`: the rollout ends `verifier_error`, never a reward of 0."""

from __future__ import annotations

import contextlib
import json
import math
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..agent import VerifierError
from ..contract import NamedRewards, Rewards
from ._process import run_group
from .tasks import write_files

TESTS_DIR = Path("/tests")
LOGS_DIR = Path("/logs/verifier")
_ERROR_TAIL_CHARS = 1500  # an outcome's error keeps 2000 characters: the reason comes first
SCALAR = "reward"
"""reward.json's component that trains. With several components and none of this name, their
mean is added under it: every component counts equally, as Harbor's mean metric counts them."""


@dataclass(frozen=True)
class Verdict:
    rewards: Rewards
    output: str
    """The last lines of the tests' output."""
    exit_code: int
    seconds: float


async def verify(
    tests: list[dict[str, Any]], timeout: float, env: Mapping[str, str], workdir: Path
) -> Verdict:
    """Run the task's `tests` (files as `task_payload` carries them) the way Harbor does, in
    `workdir` with `env` (the environment to run `test.sh` with), and read their reward."""
    bash = shutil.which("bash", path=env.get("PATH"))
    if bash is None:
        raise VerifierError("no bash in the task's environment: tests/test.sh cannot run")
    if not any(f.get("path") == "test.sh" for f in tests):
        raise VerifierError("the task's tests have no test.sh")
    for folder in (TESTS_DIR, LOGS_DIR):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    write_files(tests, TESTS_DIR)
    ran = await run_group(
        [bash, str(TESTS_DIR / "test.sh")],
        cwd=workdir,
        env=env,
        timeout=timeout,
        output=LOGS_DIR / "test-stdout.txt",
    )
    if ran.exit_code is None:
        raise VerifierError(
            _with_tail(f"tests/test.sh ran past its {timeout:g}s timeout", ran.tail)
        )
    try:
        rewards = read_reward(LOGS_DIR)
    except VerifierError as e:
        raise VerifierError(_with_tail(f"{e} (test.sh exit {ran.exit_code})", ran.tail)) from None
    return Verdict(rewards, ran.tail, ran.exit_code, ran.seconds)


def read_reward(logs: Path) -> Rewards:
    """`reward.txt` (one number), else `reward.json`: {"reward": x} or any one name -> x;
    several names -> named components (see `SCALAR`)."""
    text, named = logs / "reward.txt", logs / "reward.json"
    if text.is_file():
        return _number(text.read_text(errors="replace").strip(), "reward.txt")
    if not named.is_file():
        raise VerifierError("the tests wrote no reward (/logs/verifier/reward.txt or reward.json)")
    try:
        found = json.loads(named.read_bytes())
    except ValueError:
        raise VerifierError("reward.json is not JSON") from None
    if not isinstance(found, dict) or not found:
        raise VerifierError('reward.json is not an object of numbers like {"reward": 1}')
    components = {str(k): _number(v, f"reward.json {k!r}") for k, v in found.items()}
    if len(components) == 1:
        return next(iter(components.values()))
    if SCALAR not in components:
        components[SCALAR] = sum(components.values()) / len(components)
    return NamedRewards(components=components, scalar=SCALAR)


def _number(value: object, what: str) -> float:
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            value = float(value)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise VerifierError(f"{what} is {str(value)[:80]!r}, not one finite number")
    return float(value)


def _with_tail(line: str, tail: str) -> str:
    """One line saying why, then the output's last lines."""
    tail = tail[-_ERROR_TAIL_CHARS:]
    return f"{line}; its output ended:\n{tail}" if tail else f"{line}; it printed nothing"
