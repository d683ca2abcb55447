"""The run journal (`OUT/journal.jsonl`): what a run submitted and started, so `run --resume OUT`
can take over after the process died without running an agent twice. The signing keys derive
from the run's secret (`engine.run_secret`, else `OUT/run_secret`, 0600), which never goes to S3
or the logs."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass, fields
from itertools import islice
from pathlib import Path
from typing import Any

from .. import RolloutRequest, RolloutStart
from .errors import UsageError

JOURNAL, ROLLOUTS, SECRET = "journal.jsonl", "rollouts.jsonl", "run_secret"
STAGED_JOURNAL = "journal.jsonl.new"  # a fresh run's, until its stack is up
_STARTED = ("session_id", "started_at", "deadline", "gateway_session_id", "gateway_url", "endpoint")
"""A `started` line's fields: a `RolloutStart`'s after its request and step, in order."""
INTERRUPTED = "interrupted"  # a rollouts.jsonl row the user's Ctrl-C cancelled: run it again


@dataclass
class Journaled:
    """One request as the journal knows it."""

    request: RolloutRequest
    step: int
    start: RolloutStart | None = None  # its session's start; None: not recorded


class Lines:
    """An append-only JSONL file of whole lines: each write is one unit, and one cut short (a
    full disk, a file-size limit) is cut back off, so no reader meets a torn line. A failed
    write goes to `failed` and is not raised: the caller may be the engine's `on_start`, where
    an error would stop a session that has started (and its agent would run again on resume)."""

    def __init__(self, path: Path, failed: Callable[[Path, OSError], None]) -> None:
        self.path, self._failed = path, failed
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, *records: dict[str, Any]) -> None:
        data = "".join(json.dumps(r) + "\n" for r in records).encode()
        end = os.lseek(self._fd, 0, os.SEEK_END)
        try:
            while data:
                data = data[os.write(self._fd, data) :]
        except OSError as e:
            with suppress(OSError):
                os.ftruncate(self._fd, end)
            self._failed(self.path, e)

    def close(self) -> None:
        os.close(self._fd)


class Journal:
    """Journals requests (before any is submitted) and the sessions started."""

    def __init__(self, lines: Lines) -> None:
        self._lines = lines
        self.started_ids: set[str] = set()  # written or not: a session that started

    def submitted(self, requests: list[RolloutRequest], step: int) -> None:
        self._lines.write(*({"kind": "request", "step": step, **vars(r)} for r in requests))

    def started(self, start: RolloutStart) -> None:
        self.started_ids.add(start.request.request_id)
        line = {"kind": "started", "request_id": start.request.request_id}
        self._lines.write(line | {name: getattr(start, name) for name in _STARTED})


@dataclass
class LeftOpen:
    """What a resumed run takes over: the journaled requests with no line in rollouts.jsonl yet,
    in submission order and with what is known of their start (those the user's interrupt
    cancelled start afresh); the outcomes of those that have a line (the summary counts the
    whole run); how many run again; and the lines rollouts.jsonl keeps."""

    jobs: list[Journaled]
    ended: list[str]
    run_again: int
    rows: list[str] | None  # rollouts.jsonl's lines, when it must be rewritten to them

    def keep_rows(self, out: Path) -> None:
        """Rewrite rollouts.jsonl to its kept lines (once the resumed run's stack is up): a torn
        last line cut off (the process died writing it), the interrupted ones gone."""
        if self.rows is not None:
            (out / ROLLOUTS).write_text("".join(f"{line}\n" for line in self.rows))


def left_open(out: Path) -> LeftOpen:
    """What `run --resume OUT` takes over (see `LeftOpen`); reads, writes nothing."""
    rollouts = out / ROLLOUTS
    lines = rollouts.read_text().split("\n") if rollouts.is_file() else []
    kept = _complete(lines)
    ended = [json.loads(line) for line in kept]
    again = {row["request_id"] for row in ended if row.get(INTERRUPTED)}
    rows = None
    if again or len(kept) != len([line for line in lines if line.strip()]):
        rows = [line for line, row in zip(kept, ended, strict=True) if not row.get(INTERRUPTED)]
    ended = [row for row in ended if not row.get(INTERRUPTED)]
    done = {row["request_id"] for row in ended}
    left = [j for j in _read_journal(out) if j.request.request_id not in done]
    left = [Journaled(j.request, j.step) if j.request.request_id in again else j for j in left]
    return LeftOpen(left, [row["outcome"] for row in ended], len(again), rows)


def _read_journal(out: Path) -> list[Journaled]:
    try:
        lines = (out / JOURNAL).read_text().split("\n")
    except FileNotFoundError:
        raise UsageError(f"--resume {out}: no {JOURNAL} there (not a run's output)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"--resume {out}: cannot read {JOURNAL}: {e}") from None
    entries: dict[str, Journaled] = {}
    for number, line in enumerate(_complete(lines), 1):  # the journal has no blank lines
        try:
            event = json.loads(line)
            rid = event["request_id"]
            if event["kind"] == "request":
                entries[rid] = _journaled(event)
            elif rid in entries:
                entry = entries[rid]
                fields = [event[name] for name in _STARTED]
                entry.start = RolloutStart(entry.request, entry.step, *fields)
        except (KeyError, ValueError, TypeError) as e:
            why = f"no {e}" if isinstance(e, KeyError) else e
            raise UsageError(
                f"--resume {out}: {JOURNAL}:{number}: not a journal line ({why})"
            ) from None
    if not entries:
        raise UsageError(f"--resume {out}: {JOURNAL} lists no requests")
    return list(entries.values())


def journaled_requests(path: Path, count: int) -> Iterator[Journaled]:
    """The first `count` requests journaled in `path`, read lazily (a fresh run submits them
    from here as earlier ones end), ahead of the `started` lines the engine appends meanwhile."""
    with path.open() as lines:
        events = (json.loads(line) for line in lines)
        yield from islice((_journaled(e) for e in events if e["kind"] == "request"), count)


def _journaled(event: dict[str, Any]) -> Journaled:
    request = RolloutRequest(**{f.name: event[f.name] for f in fields(RolloutRequest)})
    return Journaled(request, event["step"])


def run_secret(out: Path, configured: str | None) -> str:
    """A resumed run's secret: the configured one, else the one its run wrote."""
    if configured:
        return configured
    try:
        return (out / SECRET).read_text().strip()
    except FileNotFoundError:
        raise UsageError(
            f"--resume {out}: no {SECRET} there and engine.run_secret is not set"
        ) from None


def write_secret(out: Path, secret: str) -> None:
    """Keep a run's own secret beside its journal (0600), for `--resume`."""
    fd = os.open(out / SECRET, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")


def _complete(lines: list[str]) -> list[str]:
    """Lines that parse as JSON objects; only the last may be torn, and it is dropped."""
    kept = [line for line in lines if line.strip()]
    if kept:
        try:
            json.loads(kept[-1])
        except ValueError:
            kept.pop()
    return kept
