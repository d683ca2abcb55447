"""The output folder: one command at a time, and a run's output never replaced by accident.
Both are checked before anything starts, so a clash is one line and exit 2."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from .errors import UsageError
from .journal import JOURNAL, ROLLOUTS, SECRET, STAGED_JOURNAL, write_secret
from .summary import SUMMARY

LOCK = "lock"  # holds the owner's pid; the kernel drops the lock when its process ends
WRITTEN = (ROLLOUTS, SUMMARY, JOURNAL, SECRET, STAGED_JOURNAL)  # what a run writes in its folder


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


def check_fresh(out: Path, *, overwrite: bool = False) -> None:
    """Refuse a folder that holds a run's output (its journal) unless told to overwrite it."""
    if not overwrite and (out / JOURNAL).is_file() and (out / JOURNAL).stat().st_size:
        raise UsageError(
            f"run.out: {out} holds a run's output: --resume {out} to finish it, "
            "or --overwrite to replace it"
        )


def check_not_an_output(data: Path, out: Path) -> None:
    """Refuse a dataset that is one of the files the run writes (an earlier run's rollouts
    rolled out again into the same folder): it would be replaced while it is the input."""
    for name in (*WRITTEN, LOCK):
        with suppress(OSError):
            if data.samefile(out / name):
                raise UsageError(
                    f"run.data: {data} is {out / name}, which this run writes: copy it "
                    f"out of {out} or choose another --out"
                )


def begin_fresh(out: Path, staged: Path, secret: str | None) -> None:
    """Make a fresh run's files, once its stack is up: the staged journal becomes the run's,
    the run's own secret (None: a configured one, never written) is kept beside it, and the
    outputs start empty, so a run never fails at its end for want of a place to write."""
    try:
        for name in (ROLLOUTS, SUMMARY):
            (out / name).open("w").close()
        if secret is not None:
            write_secret(out, secret)
        staged.replace(out / JOURNAL)
    except OSError as e:
        raise UsageError(f"run.out: cannot write {e.filename}: {e.strerror}") from None


def check_writable(out: Path) -> None:
    """A resumed run appends to its files: they must take it before anything starts."""
    try:
        for name in (ROLLOUTS, SUMMARY, JOURNAL):
            (out / name).open("a").close()
    except OSError as e:
        raise UsageError(f"--resume: cannot write {e.filename}: {e.strerror}") from None
