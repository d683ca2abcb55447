"""The output folder: one command at a time, and a run's output never replaced by accident.
Both are checked before anything starts, so a clash is one line and exit 2."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from .errors import UsageError
from .journal import JOURNAL, ROLLOUTS
from .summary import SUMMARY

LOCK = "lock"  # holds the owner's pid; the kernel drops the lock when its process ends


@contextmanager
def locked(out: Path, key: str) -> Iterator[None]:
    """Create `out` and hold its lock while the command runs: a second `run` or `train` on it
    is refused, naming this process, however this one ends (an advisory flock on OUT/lock)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd = os.open(out / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except FileExistsError:
        raise UsageError(f"{key}: {out} exists and is not a directory") from None
    except OSError as e:
        raise UsageError(f"{key}: cannot write {e.filename}: {e.strerror}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 20, 0).decode().strip() or "?"
            raise UsageError(f"{key}: {out} is in use by another process (pid {owner})") from None
        with suppress(OSError):  # a full disk: the run finds out, and says so, when it writes
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        os.close(fd)


def prepare_out(out: Path, *, fresh: bool, overwrite: bool = False) -> None:
    """Create the run's files once, so a run never fails at its end (or after the local stack
    started) for want of a place to write. A fresh run starts them empty, and refuses a folder
    that holds a run's output (its journal) unless told to overwrite it; a resumed one appends."""
    if fresh and not overwrite and (out / JOURNAL).is_file() and (out / JOURNAL).stat().st_size:
        raise UsageError(
            f"run.out: {out} holds a run's output: --resume {out} to finish it, "
            "or --overwrite to replace it"
        )
    try:
        for name in (ROLLOUTS, SUMMARY, JOURNAL):
            (out / name).open("w" if fresh else "a").close()
    except OSError as e:
        raise UsageError(f"run.out: cannot write {e.filename}: {e.strerror}") from None
