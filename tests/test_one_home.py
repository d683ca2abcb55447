"""Each fact has one home: AgentCore's published defaults in `runtimes/agentcore/published.py`,
the wire (signing keys, the run secret, the result prefix) in `contract`, and a rollout's
deadline under one name; one function decides every outcome.

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
            "agentcore_rollout/runtimes/agentcore/published.py",
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
    """The instant a rollout must end by is `deadline`, from `submit` to the contract to the
    journal to `resume`; the one its session must start by is `start_deadline`; a duration is
    a `timeout`. The names it had before fail here."""
    tests = sorted((ROOT / "tests").rglob("*.py"))
    docs = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
    old_names = (
        r"running_until|StartAttempts|\bcap=|attempts\.deadline|\bcutoff|\bstart_by\b"
        r"|\blookup_at\b|\bgive_up_at\b"
    )
    assert _hits(old_names, allowed={"tests/test_one_home.py"}, paths=SOURCES + tests + docs) == []


CORE_FOLDERS = ("_engine", "_dispatch", "_results", "runtimes")
DECIDES = "_engine/request.py"  # its `_decide`


def _core_trees() -> dict[str, ast.Module]:
    paths = [*PACKAGE.glob("*.py"), *(p for f in CORE_FOLDERS for p in (PACKAGE / f).rglob("*.py"))]
    return {p.relative_to(PACKAGE).as_posix(): ast.parse(p.read_text()) for p in sorted(paths)}


def test_one_function_decides_every_outcome() -> None:
    """In the core (its root and its folders), an `Outcome` member is chosen only in
    `_engine/request.py`'s `_decide`: anywhere else it is only compared with."""
    chosen, decides = [], 0
    for name, tree in _core_trees().items():
        compared = {
            id(n)
            for c in ast.walk(tree)
            if isinstance(c, ast.Compare)
            for operand in (c.left, *c.comparators)
            for n in ast.walk(operand)
        }
        deciding = {
            id(n)
            for f in ast.walk(tree)
            if isinstance(f, ast.FunctionDef) and f.name == "_decide" and name == DECIDES
            for n in ast.walk(f)
        }
        decides += bool(deciding)
        for node in ast.walk(tree):
            named = isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            member = named and node.value.id == "Outcome" and node.attr.isupper()
            if member and id(node) not in compared | deciding:
                chosen.append(f"{name}:{node.lineno} Outcome.{node.attr}")
            call = isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            if call and node.func.id == "Outcome" and id(node) not in deciding:
                chosen.append(f"{name}:{node.lineno} Outcome(...)")
    assert decides == 1, f"no _decide in {DECIDES}"
    assert chosen == []
