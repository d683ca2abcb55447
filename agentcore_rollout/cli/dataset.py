"""The dataset `run` and `train` read: JSONL, one payload per line, and the requests it makes
(`n` samples of each row, grouped by the row's id)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .. import RolloutRequest
from .errors import UsageError


def read_dataset(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(input_id, payload) per non-empty line. The id names the row's group (its `n` samples):
    the row's `id`, as text (`7` -> "7"), or `line-<N>` if it has none (absent, null or "").
    Two rows with one id are an error, not one bigger group: a group's rewards are compared
    with each other, so mixing two prompts in one would be silently wrong."""
    try:
        text = path.read_text(encoding="utf-8-sig")  # -sig: an editor's BOM is not data
    except OSError as e:
        raise UsageError(f"data: cannot read {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise UsageError(f"data: {path} is not UTF-8 text (byte {e.start})") from None
    rows: list[tuple[str, dict[str, Any]]] = []
    first_seen: dict[str, int] = {}
    for number, line in enumerate(text.split("\n"), start=1):  # JSON strings may hold U+2028
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise UsageError(f"data: {path}:{number}: not valid JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise UsageError(f"data: {path}:{number}: expected a JSON object")
        input_id = _row_id(row.get("id"), number)
        if input_id is None:
            raise UsageError(f"data: {path}:{number}: id must be a string or a number")
        if input_id in first_seen:
            raise UsageError(
                f"data: {path}:{number}: duplicate id {input_id!r} (first on line "
                f"{first_seen[input_id]}); ids name groups, one row each"
            )
        first_seen[input_id] = number
        rows.append((input_id, row))
    if not rows:
        raise UsageError(f"data: {path} has no rows")
    return rows


def _row_id(value: Any, number: int) -> str | None:
    """The row's group id, or None if its `id` is of a kind that cannot be one (a list...)."""
    if value is None or value == "":
        return f"line-{number}"
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return None


def build_requests(rows: list[tuple[str, dict[str, Any]]], n: int) -> list[RolloutRequest]:
    """`n` requests per row, its samples 0..n-1: one group each."""
    return [
        RolloutRequest(payload=row, input_id=input_id, sample_index=k)
        for input_id, row in rows
        for k in range(n)
    ]
