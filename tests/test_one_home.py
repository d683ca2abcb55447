"""Each fact has one home: AgentCore's published defaults in `_agentcore`, the wire (signing
keys, the run secret, the result prefix) in `contract`, and a rollout's deadline under one
name. And the engine's core stays small enough to read: no function of `_engine.py` or of the
dispatcher's modules over 40 lines.

Read as text, so a second definition anywhere in the package fails here, with where it is."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "agentcore_rollout"
SOURCES = sorted(PACKAGE.rglob("*.py"))


def _hits(pattern: str, *, allowed: set[str], paths: list[Path] = SOURCES) -> list[str]:
    found = []
    for path in paths:
        rel = path.relative_to(ROOT).as_posix()
        if rel in allowed:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(pattern, line):
                found.append(f"{rel}:{number}: {line.strip()}")
    return found


@pytest.mark.parametrize(
    ("what", "pattern", "home"),
    [
        # idle timeout 900 s, max lifetime 28,800 s: named next to idle/lifetime anywhere else
        (
            "AgentCore's session defaults",
            r"(?i)(idle|lifetime).*\b(900|28_?800|8 \* 3600)\b",
            "agentcore_rollout/_agentcore.py",
        ),
        ("the signing-key derivation", r"hmac\.new\(", "agentcore_rollout/contract.py"),
        ("the random run secret", r"token_hex\(", "agentcore_rollout/contract.py"),
        (
            "the result prefix's normal form",
            r"\.strip\(['\"]/['\"]\)",
            "agentcore_rollout/contract.py",
        ),
        (
            "the session-id padding",
            r"SESSION_ID_MIN|\b3[23]\b.*session",
            "agentcore_rollout/contract.py",
        ),
    ],
)
def test_one_definition(what: str, pattern: str, home: str) -> None:
    extra = [ROOT / "infra" / "cdk" / "parameters.py"] if "AgentCore" in what else []
    homes = set(home.split())
    assert _hits(pattern, allowed=homes, paths=SOURCES + extra) == [], f"{what} outside {home}"


def test_one_name_for_the_deadline() -> None:
    """The instant a rollout must end by is `deadline` from the contract to the journal to
    `resume`, and the instant a session must have started by is `start_deadline`; a duration
    is a `timeout`."""
    tests = sorted((ROOT / "tests").rglob("*.py"))
    stale_names = r"running_until|StartAttempts|\bcap=|attempts\.deadline|\bcutoff|start_by"
    allowed = {"tests/test_one_home.py", "agentcore_rollout/_engine.py"}  # engine: being renamed
    assert _hits(stale_names, allowed=allowed, paths=SOURCES + tests) == []


def test_the_engine_reads_in_short_functions() -> None:
    long = []
    for name in ("_engine.py", "_dispatcher.py", "_start_queue.py", "_runtime_endpoints.py"):
        tree = ast.parse((PACKAGE / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if lines > 40:
                    long.append(f"{name}:{node.lineno} {node.name} is {lines} lines")
    assert long == []
