"""The dataset `run` and `train` read: JSONL, one payload per line, read a line at a time and
checked as it is read, so a bad row is named before anything starts and no copy of the whole
file is ever held; or Harbor tasks (a folder of task folders, or a JSONL naming them), one
row each (`harbor.tasks`); and the requests it makes (`n` samples of each row, grouped by its
id)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .. import RolloutRequest
from ..contract import ID_MAX, ContractError, check_request
from ..harbor.tasks import HarborTask, TaskError, is_task_source, read_tasks, task_payload
from .errors import UsageError
from .journal import Journal

MAX_SHOWN = 20  # bad rows named, one line each; the rest are counted
BOM = b"\xef\xbb\xbf"  # an editor's byte-order mark is not data


def read_rows(path: Path, *, solution: bool = False) -> Iterator[tuple[str, dict[str, Any]]]:
    """(input_id, payload) per good non-empty line, lazily. The id names the row's group (its
    `n` samples): the row's `id`, as text (`7` -> "7"), or `line-<N>` if it has none (absent,
    null or ""). Bad rows are skipped and, once the file is read, raised as one UsageError
    naming each (one line per row), so every mistake is found in one pass. Harbor tasks are
    a row each, named by their folder, their solutions in them only with `solution` (for
    the `oracle` agent)."""
    if is_task_source(path):
        yield from _task_rows(path, solution)
        return
    bad: list[str] = []
    seen: dict[str, int] = {}  # input_id -> its line; the only thing kept per row
    try:
        with path.open("rb") as lines:
            for number, raw in enumerate(lines, start=1):  # splits on b"\n" only: U+2028 is data
                checked = _check(raw[3:] if number == 1 and raw[:3] == BOM else raw, seen, number)
                if isinstance(checked, tuple):
                    yield checked
                elif checked:
                    bad.append(f"data: {path}:{number}: {checked}")
    except OSError as e:
        raise UsageError(f"data: cannot read {path}: {e.strerror}") from None
    if bad:
        more = len(bad) - MAX_SHOWN
        tail = [f"data: {path}: {len(bad)} bad rows, {more} more not shown"] if more > 0 else []
        raise UsageError("\nerror: ".join(bad[:MAX_SHOWN] + tail))  # main() prints "error: "
    if not seen:
        raise UsageError(f"data: {path} has no rows")


def read_task_source(path: Path) -> list[HarborTask]:
    """The Harbor tasks at `path`, or a UsageError naming each bad one, one line each."""
    try:
        return read_tasks(path)
    except TaskError as e:
        lines = [f"data: {line}" for line in str(e).splitlines()]
        raise UsageError("\nerror: ".join(lines)) from None  # main() prints "error: "


def _task_rows(path: Path, solution: bool) -> Iterator[tuple[str, dict[str, Any]]]:
    for task in read_task_source(path):
        yield task.name, task_payload(task, solution=solution)


def _check(raw: bytes, seen: dict[str, int], number: int) -> tuple[str, dict[str, Any]] | str:
    """The row, or what is wrong with it ("": a blank line). Two rows with one id are an
    error, not one bigger group: a group's rewards are compared with each other, so mixing two
    prompts in one would be silently wrong."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"not UTF-8 text (byte {e.start})"
    if not line.strip():
        return ""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        return f"not valid JSON ({e.msg})"
    except RecursionError:
        return "not valid JSON (nested too deeply)"
    if not isinstance(row, dict):
        return "expected a JSON object"
    input_id = _row_id(row.get("id"), number)
    if input_id is None:
        return "id must be a string or a number"
    if len(input_id) > ID_MAX:
        return f"id is {len(input_id)} characters, more than {ID_MAX}"
    try:  # what the engine's submit would refuse: a `_rollout` key, NaN or Infinity, ...
        check_request("row", input_id, 0, row)
    except ContractError as e:
        return str(e)
    if input_id in seen:
        return f"duplicate id {input_id!r} (first on line {seen[input_id]}); ids name groups"
    seen[input_id] = number
    return input_id, row


def _row_id(value: Any, number: int) -> str | None:
    """The row's group id, or None if its `id` is of a kind that cannot be one (a list...)."""
    if value is None or value == "":
        return f"line-{number}"
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return None


def journal_requests(
    path: Path, n: int, step: int, journal: Journal, *, solution: bool = False
) -> int:
    """Check the dataset and journal its requests (`n` per row, samples 0..n-1: one group
    each) in one pass, before anything starts; how many. `run` then submits them from the
    journal as earlier ones end, so neither the dataset nor its requests are held whole."""
    total = 0
    for input_id, row in read_rows(path, solution=solution):
        journal.submitted([RolloutRequest(row, input_id, k) for k in range(n)], step)
        total += n
    return total
