"""Harbor's verifier contract, run inside the task's environment once the agent has finished:
the image's record checked, the tests written in, `test.sh` run, the reward read as Harbor reads
it.

Every way it cannot judge raises `VerifierError`: the rollout ends `verifier_error`, never a
reward of 0, which a trainer would train on. docs/harbor.md#one-rollout."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..agent import VerifierError
from ..contract import NamedRewards, Rewards
from ._process import RunAs, run_group
from .tasks import write_files
from .trusted import TRUSTED_JSON, Trusted, check, trusted_path

TESTS_DIR = Path("/tests")
LOGS_DIR = Path("/logs/verifier")
_ERROR_TAIL_CHARS = 1500  # an outcome's error keeps 2000 characters: the reason comes first
MAX_REWARD_BYTES = 64 * 1024
"""A reward file larger than this is not one number: `VerifierError`."""
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
    trust: str = "checked"
    """`checked` against the image's record, or why not."""
    check_seconds: float = 0.0


async def verify(
    tests: list[dict[str, Any]],
    timeout: float,
    env: Mapping[str, str],
    workdir: Path,
    *,
    user: RunAs | None = None,
    trusted: Trusted | None = None,
) -> Verdict:
    """Run the task's `tests` (files as `task_payload` carries them) the way Harbor does, in
    `workdir` with `env` (the environment to run `test.sh` with), as `user` (None: this
    process's, root), and read their reward. With `trusted` (the image's record), the
    environment is first checked against it (a difference: `tampered: ...`) and test.sh runs
    with the recorded bash, the recorded tools first on PATH; without, bash is found on PATH,
    and the verdict says the image has no record."""
    env = dict(env)
    checked = time.monotonic()
    if trusted is not None:
        if tampered := check(trusted, env.get("PATH")):
            raise VerifierError(f"tampered: {', '.join(tampered)}")
        bash = trusted.bash()
        env["PATH"] = trusted_path(trusted, env.get("PATH"))
        trust = "checked"
    else:
        bash = shutil.which("bash", path=env.get("PATH"))
        trust = f"unchecked: no {TRUSTED_JSON} (an image built before it): bash from PATH"
    check_seconds = time.monotonic() - checked
    if bash is None:
        raise VerifierError("no bash in the task's environment: tests/test.sh cannot run")
    if not any(f.get("path") == "test.sh" for f in tests):
        raise VerifierError("the task's tests have no test.sh")
    for folder in (TESTS_DIR, LOGS_DIR):
        _empty(folder)
    write_files(tests, TESTS_DIR)
    if user is not None:
        os.chown(LOGS_DIR, user.uid, user.gid)
    ran = await run_group(
        [bash, str(TESTS_DIR / "test.sh")],
        cwd=workdir,
        env=env,
        timeout=timeout,
        output=LOGS_DIR / "test-stdout.txt",
        user=user,
    )
    if ran.exit_code is None:
        raise VerifierError(
            _with_tail(f"tests/test.sh ran past its {timeout:g}s timeout", ran.tail)
        )
    if ran.exit_code < 0:
        killed = f"tests/test.sh was killed by signal {-ran.exit_code} ({_signal(-ran.exit_code)})"
        raise VerifierError(_with_tail(killed, ran.tail))
    try:
        rewards = read_reward(LOGS_DIR)
    except VerifierError as e:
        raise VerifierError(_with_tail(f"{e} (test.sh exit {ran.exit_code})", ran.tail)) from None
    return Verdict(rewards, ran.tail, ran.exit_code, ran.seconds, trust, check_seconds)


def _empty(folder: Path) -> None:
    """`folder` made an empty folder of root's: what was there (a link in its place
    included) is gone, or the tests cannot be trusted to be the only writer."""
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        folder.unlink()
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    if folder.is_symlink() or any(folder.iterdir()):
        raise VerifierError(f"tampered: {folder} could not be emptied before the tests")


def read_reward(logs: Path) -> Rewards:
    """`reward.txt` (one number), else `reward.json`: {"reward": x} or any one name -> x;
    several names -> named components (see `SCALAR`). Each read whole up to
    `MAX_REWARD_BYTES`, never through a symlink."""
    text = _read(logs / "reward.txt")
    if text is not None:
        return _number(text.decode(errors="replace").strip(), "reward.txt")
    named = _read(logs / "reward.json")
    if named is None:
        raise VerifierError("the tests wrote no reward (/logs/verifier/reward.txt or reward.json)")
    try:
        found = json.loads(named)
    except ValueError:
        raise VerifierError("reward.json is not JSON") from None
    if not isinstance(found, dict) or not found:
        raise VerifierError('reward.json is not an object of numbers like {"reward": 1}')
    components = {str(k): _number(v, f"reward.json {k!r}") for k, v in found.items()}
    if len(components) == 1:
        return next(iter(components.values()))
    if SCALAR not in components:
        mean = sum(v / len(components) for v in components.values())
        if not math.isfinite(mean):
            raise VerifierError(f"reward.json's components' mean is {mean}, not finite")
        components[SCALAR] = mean
    return NamedRewards(components=components, scalar=SCALAR)


def _read(path: Path) -> bytes | None:
    """The file's bytes (None: absent), a regular file's and no more than the bound."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise VerifierError(f"{path.name} cannot be read ({e.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise VerifierError(f"{path.name} is not a regular file")
        data = f.read(MAX_REWARD_BYTES + 1)
    if len(data) > MAX_REWARD_BYTES:
        raise VerifierError(f"{path.name} is over {MAX_REWARD_BYTES >> 10} KiB")
    return data


def _signal(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unknown"


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
