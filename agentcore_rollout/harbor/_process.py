"""One command in a process group of its own, bounded in time and killed whole: how the
wrapper runs the agent and the verifier runs `test.sh`, so nothing either spawned outlives it.

Its output goes to a file (Harbor's `/logs/...`), not a pipe: a process that escaped the group
(`setsid`) cannot then hold the wrapper up by keeping a pipe open; the tail is read back."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import grp
import os
import pwd
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TAIL_LINES = 30
_TAIL_BYTES = 4096
_PR_SET_DUMPABLE = 4
_GONE_POLLS = 100  # 5 s at 0.05 s for the group's last members to die once killed


@dataclass(frozen=True)
class Ran:
    """How it ended: its exit code (None: killed at the time limit), the end of its output,
    seconds taken."""

    exit_code: int | None
    tail: str
    seconds: float


@dataclass(frozen=True)
class RunAs:
    """A user to run a command as (`[agent] user`, `[verifier] user`)."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...] = ()
    home: str | None = None


def user_named(user: str | None) -> RunAs | None:
    """The user `user` (a name, or a uid) of this system; None for None or root. A uid that
    has no entry runs with its own number as group. A name that has none: `LookupError`."""
    if user is None:
        return None
    try:
        entry = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
    except KeyError:
        if not user.isdigit():
            raise LookupError(f"no user {user!r} in the task's image") from None
        return None if int(user) == 0 else RunAs(user, int(user), int(user))
    if entry.pw_uid == 0:
        return None
    groups = tuple(g.gr_gid for g in grp.getgrall() if entry.pw_name in g.gr_mem)
    return RunAs(entry.pw_name, entry.pw_uid, entry.pw_gid, groups, entry.pw_dir)


async def run_group(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    timeout: float,
    output: Path,
    user: RunAs | None = None,
) -> Ran:
    """Run `argv` (as `user`, else as this process's) until it exits or `timeout` seconds
    pass; either way (and if cancelled) its whole process group is SIGKILLed and gone before
    this returns."""
    as_user: dict[str, Any] = {}
    if user is not None:
        as_user = {"user": user.uid, "group": user.gid, "extra_groups": list(user.groups)}
    started = time.monotonic()
    output.parent.mkdir(parents=True, exist_ok=True)
    with output.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd,
            env=dict(env),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            **as_user,
        )
    code: int | None = None
    try:
        code = await asyncio.wait_for(process.wait(), timeout=max(timeout, 0.0))
    except TimeoutError:
        pass
    finally:
        await kill_group(process)
    return Ran(code, tail(output), time.monotonic() - started)


async def kill_group(process: asyncio.subprocess.Process) -> None:
    """SIGKILL `process`'s group (it leads one), reap it, and wait until no member is left."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    await process.wait()
    for _ in range(_GONE_POLLS):  # orphans are reaped by init, a moment later
        if not group_alive(process.pid):
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        await asyncio.sleep(0.05)


def group_alive(pgid: int) -> bool:
    """Some process of group `pgid` still exists (a zombie not yet reaped counts)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def tail(path: Path, lines: int = TAIL_LINES) -> str:
    """The last `lines` lines of the file at `path` ("" if there is none)."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - _TAIL_BYTES))
            end = f.read()
    except OSError:
        return ""
    return "\n".join(end.decode(errors="replace").splitlines()[-lines:])


async def kill_all_but_this(rounds: int = 50) -> int:
    """In a session's own PID namespace (this wrapper is PID 1 or its init's child), SIGKILL
    every process but PID 1 and this one: whatever the agent left, however it detached
    (`setsid`, double fork), is gone before the verifier runs. Each round stops them all
    first, so a process forking in a loop cannot outrun it. Outside such a namespace (the
    wrapper run on a host, as the unit tests do) nothing is killed: 0."""
    me = os.getpid()
    if not in_own_pid_namespace():
        return 0
    seen: set[int] = set()
    for _ in range(rounds):
        victims = [pid for pid in _pids() if pid not in (1, me) and not _zombie(pid)]
        if not victims:
            break
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in victims:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
        seen.update(victims)
        await asyncio.sleep(0.02)
    return len(seen)


def in_own_pid_namespace() -> bool:
    """This process is PID 1 or its init's child: a session's container (or microVM) of its
    own, not a host (where the unit tests run the wrapper)."""
    return os.getpid() == 1 or os.getppid() == 1


def seal() -> bool:
    """Make this process's memory, `/proc/<pid>/environ` and file descriptors unreadable and
    unwritable to the processes it starts, root's included (`PR_SET_DUMPABLE` 0: reading or
    writing them, or ptrace, then needs CAP_SYS_PTRACE, which container runtimes do not grant
    by default). In a session's own PID namespace alone; True if done."""
    if not in_own_pid_namespace():
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _zombie(pid: int) -> bool:
    """Exited, not yet reaped (its parent, or PID 1, reaps it): nothing left to kill."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2 :].startswith(("Z", "X"))
