"""Memory of `agentcore-rollout run` over a long dataset: by default 50,000 rows (`--n 1`)
through the real CLI on the local stack (moto, the runtime emulator with one shared in-process
fast agent, no policy calls). The CLI process reports its own peak RSS (getrusage at exit, so
moto and the emulator, its children, are not counted); its RSS is also sampled as rollouts end,
to show it does not grow with the dataset. Also times the dataset's check-and-journal pass,
which runs before anything starts. Prints JSON; writes bench/results/run_memory.json.

    python bench/run_memory.py [--rows 50000] [--smoke]

`--smoke` (CI's): 100 rows, into out/bench-smoke/.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agentcore_rollout.cli.dataset import journal_requests  # noqa: E402
from agentcore_rollout.cli.journal import Journal, Lines  # noqa: E402
from bench import _smoke  # noqa: E402

# The CLI's own `main`, then its peak RSS (KiB on Linux) written where the benchmark reads it.
CHILD = (
    "import json, resource, sys\n"
    "from agentcore_rollout.cli import main\n"
    "code = main(sys.argv[2:])\n"
    "peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
    "open(sys.argv[1], 'w').write(json.dumps({'exit': code, 'peak_kib': peak}))\n"
)


def write_dataset(path: Path, rows: int) -> None:
    with path.open("w") as f:
        for i in range(rows):
            f.write(json.dumps({"id": f"q{i}", "question": f"What is {i} + {i % 7}?"}) + "\n")


def journal_pass_s(data: Path, journal: Path) -> float:
    """Seconds the check-and-journal pass over `data` takes (n=1), in this process."""

    def failed(path: Path, error: OSError) -> None:
        raise error

    began = time.monotonic()
    lines = Lines(journal, failed)  # as `run` journals: whole lines, appended
    try:
        journal_requests(data, 1, 0, Journal(lines))
    finally:
        lines.close()
    return time.monotonic() - began


def rss_mb(pid: int) -> float | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    kib = next((line.split()[1] for line in status.splitlines() if line.startswith("VmRSS")), None)
    return int(kib) / 1024 if kib else None


def run(rows: int, work: Path) -> dict:
    data, out, report = work / "data.jsonl", work / "out", work / "report.json"
    write_dataset(data, rows)
    check_s = journal_pass_s(data, work / "journal.jsonl")
    env_file = work / "empty.env"
    env_file.write_text("")
    argv = [
        *("run", "--data", str(data), "--n", "1", "--out", str(out)),
        *("--env-file", str(env_file)),
        *("local.mode=in_process", "local.app=bench._fast_agent:app"),
        *("local.policy_workers=1", "local.gateway=false"),
        *("engine.dispatch.start_rate=1000", "engine.dispatch.max_live_sessions=64"),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    began = time.monotonic()
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(report), *argv],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    series: list[tuple[int, float]] = []
    sink, done, seen = out / "rollouts.jsonl", 0, 0
    while child.poll() is None:
        time.sleep(1.0)
        if sink.exists():
            with sink.open("rb") as f:  # count only what was added since the last look
                f.seek(seen)
                chunk = f.read()
            seen += len(chunk)
            done += chunk.count(b"\n")
        rss = rss_mb(child.pid)
        if rss is not None:
            series.append((done, round(rss, 1)))
            if len(series) % 30 == 0:
                print(f"{done}/{rows} rollouts, {rss:.0f} MB", file=sys.stderr, flush=True)
    wall = time.monotonic() - began
    stderr = child.stderr.read() if child.stderr else ""
    if not report.exists():
        raise SystemExit(f"run died (exit {child.returncode}): {stderr[-2000:]}")
    result = json.loads(report.read_text())
    summary = json.loads((out / "summary.json").read_text())
    at = {f"{f:.0%}": next((r for d, r in series if d >= f * rows), None) for f in (0.1, 0.5, 1.0)}
    return {
        "rows": rows,
        "n": 1,
        "exit": result["exit"],
        "outcomes": {k: v for k, v in summary["outcomes"].items() if v},
        "peak_rss_mb": round(result["peak_kib"] / 1024, 1),
        "rss_mb_at_rollouts_ended": at,
        "dataset_check_and_journal_s": round(check_s, 2),
        "throughput_per_s": summary["throughput_per_s"],
        "wall_time_s": round(wall, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--out", type=Path, default=_smoke.RESULTS)
    args = _smoke.parse(parser, rows=100)
    with tempfile.TemporaryDirectory() as work:
        figures = run(args.rows, Path(work))
    if args.rows == 50_000 or args.smoke:  # the published figure; other sizes are trials
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "run_memory.json").write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
