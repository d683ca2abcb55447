"""The released agent clients as the registries serve them today, through the gateway.

`make clients-latest` (or `python bench/clients_latest.py [NAME=VERSION ...]`) installs the
newest release of each client (or the version named) into a scratch folder, `.clients-latest/`
(`--dir` to choose; what is there already at that version is kept), outside the project's venv
and `.clients/` (the Makefile's pins, which the tests run), and runs each on the released-clients
tests' two-turn shell task (tests/test_released_clients.py: a fresh gateway, a scripted worker,
a trap proxy). It prints one row per client and version:

  first request  ok (the gateway answered a turn), or what the client printed last
  tool ran       the shell command ran (out.txt holds hi)
  trace exact    every turn well-formed and exactly what the worker sampled, one sample
  ignored        the request fields the gateway named as ignored
  seconds        how long the run took (the gateway's start included)

and exits 1 if any row is not ok, yes, yes. Names: claude-code, codex (over HTTP and over its
default WebSocket), claude-agent-sdk, mini-swe-agent, openhands-sdk. It reads the registries with
their own clients (`npm view`, `pip index versions`) and installs with npm and pip.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.gateway_support import hf_renderer  # noqa: E402
from tests.smollm2 import family_renderer  # noqa: E402
from tests.test_released_clients import (  # noqa: E402
    Proxy,
    Run,
    Sandbox,
    check_trace,
    run_claude_agent_sdk,
    run_claude_code,
    run_codex,
    run_mini_swe_agent,
    run_openhands,
)

NPM = {"claude-code": "@anthropic-ai/claude-code", "codex": "@openai/codex"}
PYPI = {  # name -> (distributions, the Python it needs)
    "claude-agent-sdk": (["claude-agent-sdk"], "python3"),
    "mini-swe-agent": (["mini-swe-agent"], "python3"),
    "openhands-sdk": (["openhands-sdk", "openhands-tools"], "python3.12"),
}


def newest(name: str, python: str) -> str:
    """The version the registry serves as newest."""
    if name in NPM:
        return subprocess.run(
            ["npm", "view", NPM[name], "version"], capture_output=True, text=True, check=True
        ).stdout.strip()
    distribution = PYPI[name][0][0]
    listed = subprocess.run(
        [python, "-m", "pip", "index", "versions", distribution],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found = re.search(rf"^{re.escape(distribution)} \((\S+)\)", listed, re.M)
    assert found, listed
    return found.group(1)


def python312() -> str:
    candidates = sorted(Path.home().glob(".pyenv/versions/3.1[2-9]*/bin/python3"))
    found = [str(c) for c in candidates] + [shutil.which("python3.12") or ""]
    return next((c for c in found if c), "")


def install(name: str, version: str, where: Path) -> Path:
    """The client's executable (or its venv's python) at `version`, installed if need be."""
    if name in NPM:
        prefix = where / f"npm-{name}-{version}"
        binary = prefix / "node_modules" / ".bin" / ("claude" if name == "claude-code" else name)
        if not binary.exists():
            subprocess.run(
                ["npm", "install", "--prefix", str(prefix), "--no-audit", "--no-fund",
                 f"{NPM[name]}@{version}"],
                check=True,
                stdout=subprocess.DEVNULL,
            )  # fmt: skip
        return binary
    distributions, needs = PYPI[name]
    venv = where / f"venv-{name}-{version}"
    python = venv / "bin" / "python"
    if not python.exists():
        base = python312() if needs == "python3.12" else sys.executable
        subprocess.run([base, "-m", "venv", str(venv)], check=True)
        pins = [f"{d}=={version}" for d in distributions]
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *pins],
            check=True,
        )
    return python


async def one(name: str, label: str, runner: Callable[[Sandbox], Awaitable[Run]]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        home, work = Path(tmp) / "home", Path(tmp) / "work"
        home.mkdir()
        work.mkdir()
        async with Proxy() as proxy:
            sandbox = Sandbox(home, work, proxy)
            started = time.monotonic()
            run = await runner(sandbox)
            seconds = round(time.monotonic() - started, 1)
            ran = (work / "out.txt").exists() and (work / "out.txt").read_text() == "hi\n"
    turns = run.trace["turns"]
    ignored = sorted({name for t in turns for name in t["ignored"]})
    if turns:
        first = "ok"
        if "WebSocket" in label and not getattr(run.gateway, "websocket_requests", 0):
            tried = getattr(run.gateway, "websocket_connections", None)
            first = "ok, over HTTP" + {0: " (no WebSocket tried)"}.get(tried, ": it fell back")
    else:
        lines = [line for line in run.out.splitlines() if line.strip()]
        first = f"none (exit {run.code}): {(lines or [''])[-1][:100]}"
    try:
        last = "tool_calls" if name == "mini-swe-agent" else "stop"
        check_trace(run.trace, run.worker, set(turns[0]["ignored"]) if turns else set(), last)
        exact = "yes"
    except AssertionError as exc:
        exact = "no: " + " ".join(str(exc).split())[:100]
    row = {"first request": first, "tool ran": "yes" if ran else "no", "trace exact": exact}
    return {**row, "ignored": ", ".join(ignored) or "-", "exit": run.code, "seconds": seconds}


def runners(name: str, path: Path, tmp: Path) -> list[tuple[str, Callable[[Sandbox], Any]]]:
    if name == "claude-code":
        return [("", lambda s: run_claude_code(s, path))]
    if name == "codex":
        return [
            ("HTTP", lambda s: run_codex(s, path)),
            ("WebSocket", lambda s: run_codex(s, path, websocket=True)),
        ]
    if name == "claude-agent-sdk":
        return [("", lambda s: run_claude_agent_sdk(s, path))]
    if name == "mini-swe-agent":
        return [("", lambda s: run_mini_swe_agent(s, path, tmp / "trajectory.json"))]
    return [("", lambda s: run_openhands(s, path, reasoning=False))]


async def main(where: Path, pins: dict[str, str], names: list[str]) -> int:
    family_renderer("qwen3"), hf_renderer()  # loaded once before any run is timed
    rows = []
    for name in names:
        needs = PYPI.get(name, ([], "python3"))[1]
        python = python312() if needs == "python3.12" else sys.executable
        version = pins.get(name) or newest(name, python)
        path = install(name, version, where)
        with tempfile.TemporaryDirectory() as tmp:
            for transport, runner in runners(name, path, Path(tmp)):
                label = f"{name} ({transport})" if transport else name
                row = await one(name, label, runner)
                rows.append({"client": label, "version": version, **row})
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    columns = ["client", "version", "first request", "tool ran", "trace exact", "ignored"]
    columns.append("seconds")
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(str(row[c]) for c in columns) + " |")
    good = all(
        (r["first request"], r["tool ran"], r["trace exact"]) == ("ok", "yes", "yes") for r in rows
    )
    return 0 if good else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pins", nargs="*", help="NAME=VERSION (default: each newest)")
    parser.add_argument("--dir", default=str(ROOT / ".clients-latest"))
    parser.add_argument("--only", nargs="*", help="these clients only")
    args = parser.parse_args()
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    pins = dict(p.split("=", 1) for p in args.pins)
    sys.exit(asyncio.run(main(Path(args.dir), pins, args.only or [*NPM, *PYPI])))
