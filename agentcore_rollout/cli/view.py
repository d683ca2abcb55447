"""`agentcore-rollout view OUT`: a run's output as one self-contained HTML page.

It must open 10,000 rollouts (hundreds of MB of traces) from a file, offline, without a server:
so it holds an index of small records and each rollout's line gzipped in chunks the browser
inflates only when one is opened, and it is built a line at a time. Everything an agent wrote is
untrusted: the page sets it as text, never as HTML. docs/outputs.md#view."""

from __future__ import annotations

import base64
import gzip
import itertools
import json
import math
import os
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any, TextIO

from ..training import grpo_advantages
from .errors import UsageError

CHUNK = 100  # rollouts per compressed chunk: one opened rollout inflates at most this many
_DATA_MARK = "<!--DATA-->"


@dataclass
class ViewStats:
    """What `build_view` wrote: the page, its rollouts and the lines it skipped."""

    path: Path
    rollouts: int = 0
    chunks: int = 0
    skipped: list[str] = field(default_factory=list)


def view_command(out: str, dest: str | None = None, tokenizer: str | None = None) -> int:
    """The subcommand: the page, then one line saying where it is (skipped lines, one each)."""
    stats = build_view(Path(out), Path(dest) if dest else None, tokenizer=tokenizer)
    for why in stats.skipped:
        print(f"warning: {why}", file=sys.stderr)
    size = stats.path.stat().st_size / 1e6
    print(f"wrote {stats.path} ({stats.rollouts} rollouts, {size:.1f} MB)", file=sys.stderr)
    return 0


def build_view(out: Path, dest: Path | None = None, *, tokenizer: str | None = None) -> ViewStats:
    """Write the page for the run in `out` (default `out/view.html`): written beside and
    renamed into place, so a page is never half there."""
    rollouts = out / "rollouts.jsonl"
    if not rollouts.is_file():
        raise UsageError(f"view: {out}: no rollouts.jsonl there (the output folder of a run)")
    decode = _decoder(tokenizer or _run_tokenizer(rollouts))
    stats = ViewStats(dest or out / "view.html")
    head, tail = _template()
    tmp = stats.path.with_name(stats.path.name + ".tmp")
    try:
        with (
            open(rollouts, encoding="utf-8", errors="replace") as src,
            open(tmp, "w", encoding="utf-8") as page,
        ):
            page.write(head)
            index, vocab = _write_chunks(src, page, stats, decode)
            _add_advantages(index)
            data = {"run": str(out), "summary": _summary_json(out), "index": index}
            data |= {"chunk": CHUNK, "vocab": vocab, "skipped": stats.skipped[:100]}
            page.write(_script("index", _json(data)))
            page.write(tail)
        os.replace(tmp, stats.path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise UsageError(f"view: {e}") from None
    return stats


def _write_chunks(
    src: TextIO, page: TextIO, stats: ViewStats, decode: Any
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Each line's index record kept, its whole line in the current chunk, each chunk
    written compressed once full."""
    index: list[dict[str, Any]] = []
    vocab: dict[str, str] = {}
    chunk: list[str] = []
    for row in _rows(src, stats):
        index.append(_record(len(index), row))
        if decode is not None:
            _add_tokens(row, vocab, decode)
        chunk.append(json.dumps(_compact(row), separators=(",", ":")))
        if len(chunk) == CHUNK:
            _flush(chunk, page, stats)
    if chunk:
        _flush(chunk, page, stats)
    stats.rollouts = len(index)
    return index, vocab


def _rows(src: TextIO, stats: ViewStats) -> Iterator[dict[str, Any]]:
    """The lines that are a rollout; any other (a line cut short by a full disk, an edit) is
    skipped and named, not the end of the page."""
    for number, line in enumerate(src, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line, parse_constant=lambda _: None)  # NaN: not for JSON.parse
        except ValueError as e:
            stats.skipped.append(f"rollouts.jsonl line {number}: not JSON ({e}); skipped")
            continue
        if not isinstance(row, dict) or "outcome" not in row:
            stats.skipped.append(f"rollouts.jsonl line {number}: not a rollout; skipped")
            continue
        yield row


def _compact(row: dict[str, Any]) -> dict[str, Any]:
    """Log-probs to 4 decimals, as the page shows them: a full-precision float is 19
    characters, most of a trace's size, and barely compresses. (NaN and infinities are None
    already: `_rows` reads them so.)"""
    for sample in (row.get("trace") or {}).get("samples") or []:
        logprobs = sample.get("logprobs")
        if isinstance(logprobs, list):
            try:
                sample["logprobs"] = [round(lp, 4) for lp in logprobs]
            except TypeError:  # a None (a token not sampled) among them
                sample["logprobs"] = [lp if lp is None else round(lp, 4) for lp in logprobs]
    return row


def _flush(chunk: list[str], page: TextIO, stats: ViewStats) -> None:
    packed = gzip.compress("\n".join(chunk).encode(), compresslevel=6, mtime=0)
    page.write(_script(f"chunk-{stats.chunks}", base64.b64encode(packed).decode(), "text/plain"))
    stats.chunks += 1
    chunk.clear()


def _record(i: int, row: dict[str, Any]) -> dict[str, Any]:
    """What the list, the filters and the groups need of a rollout, and no more."""
    result = row.get("result") if isinstance(row.get("result"), dict) else {}
    trace = row.get("trace") if isinstance(row.get("trace"), dict) else {}
    cost = row.get("cost") if isinstance(row.get("cost"), dict) else {}
    error = row.get("error") or (result or {}).get("error")
    return {
        "i": i,
        "id": row.get("request_id"),
        "g": str(row.get("input_id")),
        "s": row.get("sample_index"),
        "st": row.get("step"),
        "o": str(row.get("outcome")),
        "r": _number(row.get("reward")),
        "l": _number(row.get("latency")),
        "c": _number(cost.get("usd")),
        "t": trace.get("num_turns", _assistant_turns(result)),
        "sr": result.get("stop_reason"),
        "e": str(error).splitlines()[0][:300] if error else None,
    }


def _assistant_turns(result: dict[str, Any]) -> int | None:
    messages = (result.get("trajectory") or {}).get("messages") if result else None
    if not isinstance(messages, list):
        return None
    return sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")


def _number(value: Any) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def _add_advantages(index: list[dict[str, Any]]) -> None:
    """GRPO's advantage of each ok member with a reward, within its group (step, input id),
    as training computes it; none for the rest."""
    groups: dict[tuple[Any, str], list[dict[str, Any]]] = defaultdict(list)
    for rec in index:
        rec["a"] = None
        if rec["o"] == "ok" and rec["r"] is not None:
            groups[(rec["st"], rec["g"])].append(rec)
    for members in groups.values():
        for rec, adv in zip(members, grpo_advantages([m["r"] for m in members]), strict=True):
            rec["a"] = round(adv, 4)


def _add_tokens(row: dict[str, Any], vocab: dict[str, str], decode: Any) -> None:
    for sample in (row.get("trace") or {}).get("samples") or []:
        for key in ("prompt_ids", "response_ids"):
            for tid in sample.get(key) or []:
                if str(tid) not in vocab:
                    vocab[str(tid)] = decode(tid)


def _run_tokenizer(rollouts: Path) -> str | None:
    """The tokenizer the run's gateway rendered with (a trace's `renderer`, `hf:<dir>`), when
    that directory is on this machine: token text without `--tokenizer`."""
    with open(rollouts, encoding="utf-8", errors="replace") as src:
        for line in itertools.islice(src, 100):
            try:
                renderer = (json.loads(line).get("trace") or {}).get("renderer")
            except (ValueError, AttributeError):
                continue
            if isinstance(renderer, str) and renderer.startswith("hf:"):
                path = Path(renderer.removeprefix("hf:"))
                return str(path) if (path / "tokenizer.json").is_file() else None
    return None


def _decoder(tokenizer: str | None) -> Any:
    """Token text from the model's tokenizer.json when given; ids alone otherwise."""
    if tokenizer is None:
        return None
    path = Path(tokenizer)
    path = path / "tokenizer.json" if path.is_dir() else path
    if not path.is_file():
        raise UsageError(f"view: --tokenizer {tokenizer}: no tokenizer.json there")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise UsageError("view: --tokenizer needs the `tokenizers` package") from None
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises its own, untyped: a file it cannot read
        raise UsageError(f"view: --tokenizer {tokenizer}: not a tokenizer.json ({e})") from None
    return lambda tid: tok.decode([int(tid)], skip_special_tokens=False)


def _summary_json(out: Path) -> dict[str, Any] | None:
    try:
        text = (out / "summary.json").read_text(encoding="utf-8")
        summary = json.loads(text, parse_constant=lambda _: None)  # NaN: none, for JSON.parse
    except (OSError, ValueError):
        return None  # a run still going or cut short: the page counts its lines instead
    return summary if isinstance(summary, dict) else None


def _template() -> tuple[str, str]:
    text = files(__package__).joinpath("view.html").read_text(encoding="utf-8")
    head, _, tail = text.partition(_DATA_MARK)
    return head, tail


def _json(data: Any) -> str:
    """JSON safe inside a <script> element: no `<` that could close it."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False, default=str)
    return text.replace("<", "\\u003c")


def _script(element_id: str, body: str, kind: str = "application/json") -> str:
    return f'<script type="{kind}" id="{element_id}">{body}</script>\n'
