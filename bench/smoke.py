"""Every bench at its smoke size (`--smoke`), one after another, so a bench that breaks fails
CI rather than the next person who runs it.

Each bench is every bench/*.py but this file, the helpers (`_*.py`) and NOT_BENCHES; a new
bench is in without a line here, and needs a `--smoke` (bench/_smoke.py). Each writes its
JSON and PNG into out/bench-smoke/, its output into out/bench-smoke/NAME.log. A bench is ok
when it exits 0 having written its JSON; skipped when it exits 77 because an extra it needs is
not installed (its reason shown); failed otherwise, or past TIMEOUT_S. Prints a table of bench,
seconds and result; exits 1 if any failed, or with `--strict` (CI's, where the Makefile has
installed every extra) if any was skipped.

    python bench/smoke.py [--strict] [NAME ...]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._smoke import SKIPPED, SMOKE_OUT  # noqa: E402

BENCH = ROOT / "bench"
NOT_BENCHES = {  # bench/*.py that are not benchmarks, and why
    "smoke": "this runner",
    "clients_latest": "installs what the registries serve today; the pinned clients run in "
    "make test (tests/test_released_clients.py)",
}
TIMEOUT_S = 300


def benches() -> list[str]:
    names = (p.stem for p in BENCH.glob("*.py") if not p.stem.startswith("_"))
    return sorted(name for name in names if name not in NOT_BENCHES)


def run(name: str) -> tuple[str, float, str]:
    """One bench's smoke run: (ok | skipped | failed, seconds, what to say about it)."""
    log, result = SMOKE_OUT / f"{name}.log", SMOKE_OUT / f"{name}.json"
    result.unlink(missing_ok=True)
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    began = time.monotonic()
    with log.open("w") as out:
        bench = subprocess.Popen(
            [sys.executable, str(BENCH / f"{name}.py"), "--smoke"],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": path},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group: a hung bench is stopped with its children
        )
        try:
            code: int | None = bench.wait(TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(bench.pid, signal.SIGKILL)
            bench.wait()
            code = None
    seconds = time.monotonic() - began
    lines = log.read_text(errors="replace").splitlines()
    if code == 0 and result.exists():
        return "ok", seconds, ""
    if code == SKIPPED:
        reason = next((s for s in reversed(lines) if s.startswith("skipped: ")), "skipped: ?")
        return "skipped", seconds, reason.removeprefix("skipped: ")
    why = f"no answer in {TIMEOUT_S} s" if code is None else f"exit {code}"
    if code == 0:
        why = f"exit 0 but no {result.relative_to(ROOT)}"
    print(f"\n== {name}: failed ({why}); the end of {log.relative_to(ROOT)}:")
    print("\n".join(lines[-30:]), flush=True)
    return "failed", seconds, why


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="these benches only (default: every one)")
    parser.add_argument("--strict", action="store_true", help="a skipped bench fails too (CI)")
    args = parser.parse_args()
    unknown = set(args.names) - set(benches())
    if unknown:
        parser.error(f"no such bench: {', '.join(sorted(unknown))} (of {', '.join(benches())})")
    SMOKE_OUT.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.names or benches():
        print(f"== {name} --smoke", flush=True)
        rows.append((name, *run(name)))
    print(f"\n| {'bench':<18} | {'s':>5} | result")
    print(f"|{'-' * 20}|{'-' * 7}|{'-' * 8}")
    for name, status, seconds, note in rows:
        print(f"| {name:<18} | {seconds:5.1f} | {status}" + (f": {note}" if note else ""))
    total = sum(seconds for _, _, seconds, _ in rows)
    print(f"| {'total':<18} | {total:5.1f} |")
    bad = {"failed", "skipped"} if args.strict else {"failed"}
    return 1 if any(status in bad for _, status, _, _ in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
