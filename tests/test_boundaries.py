"""Package boundaries, checked three ways.

1. Statically, by folder: every import of every module (inside functions too) is parsed and
   resolved. The modules at the package root are the core (the engine and the wire); it
   imports none of the folders, no server framework and no heavy library. Each folder imports
   the core and the folders `LAYERS` names for it, nothing else; the folders form no cycle,
   and neither do the modules, under `TYPE_CHECKING` or lazily imported.
2. In a subprocess of the full environment: importing the package and the gateway package's
   names loads none of the servers, the local stack or a heavy library.
3. In a bare virtualenv holding only the core distributions (the closure of pyproject.toml's
   `dependencies`, linked from this environment, nothing downloaded): a rollout batch runs end
   to end through the public API against a local stack started here, with and without the
   gateway.
"""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from importlib.metadata import Distribution, distribution
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import agentcore_rollout.gateway as gateway
from agentcore_rollout.local.config import LocalConfig
from agentcore_rollout.local.moto import LOCAL_CREDENTIALS
from agentcore_rollout.local.stack import LocalStack

from .factories import flat_config

pytestmark = pytest.mark.component

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "agentcore_rollout"
# The core: the modules at the package root, and the core's folders, each importing the root's
# modules and the core folders named for it (one way: the request life on top, the runtimes
# at the bottom).
CORE_FOLDERS = {
    "runtimes": set(),  # the sandbox seam: a base, AgentCore, other runtimes
    "_dispatch": {"runtimes"},  # starting and stopping sessions
    "_results": set(),  # the results channel: SQS, S3, checks
    "_engine": {"_dispatch", "_results", "runtimes"},  # the trainer's face, each request's life
}
CORE = sorted(path.stem for path in PACKAGE.glob("*.py")) + sorted(CORE_FOLDERS)
ADMIN_CLIENT = "agentcore_rollout._engine.gateway_admin"  # the engine's client of the gateway
HEAVY = (
    "aiohttp.web",
    "starlette",
    "uvicorn",
    "fastapi",
    "flask",
    "numpy",
    "transformers",
    "tokenizers",
    "torch",
    "verl",
    "moto",
    "bedrock_agentcore",
)
# Each folder of the package, and the folders it may import besides itself and the core. One
# way only: the test below finds any cycle.
LAYERS = {
    "serving": set(),  # helpers for the project's servers
    "training": set(),
    "gateway": {"serving"},
    "agent": {"serving"},
    "integrations": {"training", "gateway", "harbor"},
    "local": {"gateway", "agent", "training", "serving"},
    "harbor": {"agent", "serving"},  # Harbor tasks and the wrapper run in their environments
    "cli": {"training", "local", "integrations", "harbor"},
}
# Must not be loaded by `import agentcore_rollout, agentcore_rollout.gateway` and its names.
NOT_LOADED = (
    "numpy",
    "aiohttp.web",
    "transformers",
    "agentcore_rollout.gateway.server",
    "agentcore_rollout.local",
    "agentcore_rollout.agent",
)


# -- 1. statically --------------------------------------------------------------------------------


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_internal_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import in the module at `path`, wherever it is."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    yield from parse_imports(path.read_text(), package)


def parse_imports(
    source: str, package: str, *, runtime_only: bool = False
) -> Iterator[tuple[int, str]]:
    """`import x`; `from x import y` as `x.y` when y is a submodule (for other distributions
    always `x.y`, so that `from aiohttp import web` reads as `aiohttp.web`), else `x`; and
    `importlib.import_module("x")`. Relative names are resolved against `package`."""
    for node in _nodes(ast.parse(source), runtime_only):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                internal = base.split(".")[0] == "agentcore_rollout"
                yield node.lineno, full if not internal or is_internal_module(full) else base
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.lineno, importlib.util.resolve_name(node.args[0].value, package)


def _nodes(tree: ast.AST, runtime_only: bool) -> Iterator[ast.AST]:
    """Every node under `tree`; with `runtime_only`, not those under `if TYPE_CHECKING:`."""
    for child in ast.iter_child_nodes(tree):
        if (
            runtime_only
            and isinstance(child, ast.If)
            and "TYPE_CHECKING" in ast.unparse(child.test)
        ):
            children: list[ast.AST] = list(child.orelse)
        else:
            children = [child]
        for node in children:
            yield node
            yield from _nodes(node, runtime_only)


def is_under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(f"{p}.") for p in prefixes)


def core_may_import(name: str) -> bool:
    parts = name.split(".")
    if parts[0] != "agentcore_rollout":
        return not is_under(name, HEAVY)
    return len(parts) == 1 or parts[1] in CORE


def folder(name: str) -> str | None:
    """The package folder `name` lives in; None for the core and for other distributions."""
    parts = name.split(".")
    if parts[0] == "agentcore_rollout" and len(parts) > 1 and parts[1] not in CORE:
        return parts[1]
    return None


def where(path: Path, line: int, name: str) -> str:
    return f"{path.relative_to(ROOT)}:{line} imports {name}"


def test_every_folder_of_the_package_is_a_layer() -> None:
    folders = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert folders == set(LAYERS) | set(CORE_FOLDERS), (
        "add the new folder to LAYERS and to docs/architecture.md"
    )


def core_modules() -> list[Path]:
    return sorted(PACKAGE.glob("*.py")) + [
        path for core in CORE_FOLDERS for path in sorted((PACKAGE / core).rglob("*.py"))
    ]


def test_the_core_imports_no_folder_and_only_light_libraries() -> None:
    bad = [
        where(path, line, name)
        for path in core_modules()
        for line, name in imports(path)
        if not core_may_import(name)
    ]
    assert bad == []


@pytest.mark.parametrize("core", sorted(CORE_FOLDERS))
def test_each_core_folder_imports_the_root_and_its_core_folders_only(core: str) -> None:
    bad = [
        where(path, line, name)
        for path in sorted((PACKAGE / core).rglob("*.py"))
        for line, name in imports(path)
        if name.startswith("agentcore_rollout.")
        and (PACKAGE / name.split(".")[1]).is_dir()
        and name.split(".")[1] not in {core, *CORE_FOLDERS[core]}
    ]
    assert bad == []


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_each_folder_imports_the_core_and_its_layers_only(layer: str) -> None:
    bad = [
        where(path, line, name)
        for path in sorted((PACKAGE / layer).rglob("*.py"))
        for line, name in imports(path)
        if folder(name) not in (None, layer, *LAYERS[layer])
    ]
    assert bad == []


def test_training_imports_the_public_api_and_the_standard_library_only() -> None:
    """A trainer of any framework uses it: no numpy, no torch, no private engine module."""
    bad = [
        where(path, line, name)
        for path in sorted((PACKAGE / "training").rglob("*.py"))
        for line, name in imports(path)
        if not (
            name == "agentcore_rollout"
            or name.startswith("agentcore_rollout.training.")
            or name.split(".")[0] in sys.stdlib_module_names
        )
    ]
    assert bad == []


def test_the_folders_import_each_other_one_way() -> None:
    edges: dict[str, set[str]] = {layer: set() for layer in LAYERS}
    for layer in LAYERS:
        for path in (PACKAGE / layer).rglob("*.py"):
            edges[layer] |= {folder(name) for _, name in imports(path)} - {None, layer}

    def reaches(start: str, goal: str, seen: frozenset[str] = frozenset()) -> bool:
        return any(
            nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt}))
            for nxt in edges[start]
        )

    assert [layer for layer in edges if reaches(layer, layer)] == [], edges


def test_no_module_imports_itself_back() -> None:
    """No import cycle at module granularity, core modules included: every import, lazy ones
    and those under `TYPE_CHECKING` too, of every module of the package."""
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    edges = {
        name: {imported for _, imported in imports(path) if imported in modules} - {name}
        for name, path in modules.items()
    }
    done: set[str] = set()

    def cycle_from(name: str, path: list[str]) -> list[str] | None:
        if name in path:
            return [*path[path.index(name) :], name]
        if name in done:
            return None
        for nxt in sorted(edges[name]):
            if found := cycle_from(nxt, [*path, name]):
                return found
        done.add(name)
        return None

    cycles = [c for name in sorted(modules) if (c := cycle_from(name, []))]
    assert cycles == [], " -> ".join(cycles[0])


def test_the_import_parser_resolves_relative_lazy_and_dynamic_imports() -> None:
    """The checks above are only as good as this: imports shaped like violations are found."""
    source = (
        "from ..local.policy import tokenizer\n"
        "from . import server\n"
        "from aiohttp import web\n"
        "def f():\n    from ..agent import RolloutApp\n"
        "if TYPE_CHECKING:\n    import numpy\n"
        "importlib.import_module('transformers')\n"
    )
    assert list(parse_imports(source, "agentcore_rollout.gateway")) == [
        (1, "agentcore_rollout.local.policy.tokenizer"),
        (2, "agentcore_rollout.gateway.server"),
        (3, "aiohttp.web"),
        (5, "agentcore_rollout.agent"),
        (7, "numpy"),
        (8, "transformers"),
    ]
    assert (7, "numpy") not in parse_imports(source, "agentcore_rollout.gateway", runtime_only=True)


# -- 2. what the engine's imports load -----------------------------------------------------------


def test_the_package_and_the_admin_client_load_no_server_policy_or_heavy_library() -> None:
    code = (
        "import sys, json, agentcore_rollout, agentcore_rollout.gateway as g\n"
        "[getattr(g, n) for n in ('GatewayAdmin', 'GatewayError', 'GatewaySession')]\n"
        f"print(json.dumps([m for m in {list(NOT_LOADED)!r} if m in sys.modules]))"
    )
    loaded = subprocess.run(
        [sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert json.loads(loaded.stdout) == []


def test_the_gateways_names_resolve_on_first_use() -> None:
    for name in gateway.__all__:  # the admin client is the core's, re-exported
        module = getattr(gateway, name).__module__
        assert module.startswith("agentcore_rollout.gateway.") or module == ADMIN_CLIENT
    assert set(gateway.__all__) <= set(dir(gateway))
    assert "CharRenderer" not in gateway.__all__  # it lives with the local policy now
    with pytest.raises(AttributeError, match="has no attribute 'CharRenderer'"):
        gateway.CharRenderer  # noqa: B018


# -- 3. a bare install ---------------------------------------------------------------------------

# Run by the bare venv's Python: the public API only, config and requests on stdin.
CHILD = """
import asyncio, importlib.util, json, sys

from agentcore_rollout import EngineConfig, RolloutEngine, RolloutRequest

spec = json.load(sys.stdin)
missing = [m for m in spec["not_installed"] if importlib.util.find_spec(m) is None]


async def main():
    async with RolloutEngine(EngineConfig.model_validate(spec["config"])) as engine:
        return await engine.rollout([RolloutRequest(**r) for r in spec["requests"]])


batch = asyncio.run(main())
rows = 0
if spec["train"]:  # training rows from the traces, in plain Python
    from agentcore_rollout.training import outcome_samples

    rows = sum(len(outcome_samples(o, advantage=1.0)) for o in batch.ok)
outcomes = [
    {"outcome": str(o.outcome), "error": o.error, "trace": o.trace is not None}
    for o in batch.outcomes
]
loaded = [m for m in spec["not_loaded"] if m in sys.modules]
print(json.dumps({"missing": missing, "outcomes": outcomes, "loaded": loaded, "rows": rows}))
"""
NOT_INSTALLED = ["numpy", "transformers", "moto", "bedrock_agentcore", "starlette"]


def core_distributions() -> list[Distribution]:
    """The installed distributions of pyproject.toml's `dependencies`, transitively: extras only
    when a requirement asks for them, markers evaluated for this interpreter."""
    with (ROOT / "pyproject.toml").open("rb") as f:
        texts = tomllib.load(f)["project"]["dependencies"]
    pending = [r for r in map(Requirement, texts) if applies(r, "")]
    found: dict[str, Distribution] = {}
    seen: set[tuple[str, str]] = set()
    while pending:
        req = pending.pop()
        name = canonicalize_name(req.name)
        dist = found.setdefault(name, distribution(req.name))
        for extra in {"", *req.extras}:
            if (name, extra) in seen:
                continue
            seen.add((name, extra))
            pending += [r for r in map(Requirement, dist.requires or []) if applies(r, extra)]
    return list(found.values())


def applies(req: Requirement, extra: str) -> bool:
    return req.marker is None or req.marker.evaluate({"extra": extra})


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with no pip, holding links to the core distributions and a .pth to this repo."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True, timeout=60)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [python, "-I", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.strip()
    )
    for dist in core_distributions():
        assert dist.files is not None, f"{dist.name} has no RECORD"
        for top in {f.parts[0] for f in dist.files} - {"..", "__pycache__"}:
            if not (site / top).exists():  # a namespace package shared by two distributions
                (site / top).symlink_to(dist.locate_file(top))
    (site / "agentcore_rollout_repo.pth").write_text(f"{ROOT}\n")
    return python


@pytest.mark.e2e
@pytest.mark.parametrize("with_gateway", [True, False], ids=["gateway", "llm"])
async def test_a_core_only_install_rolls_out_a_batch(
    bare_python: Path, with_gateway: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)  # the emulator imports the example agent from here
    rows = [json.loads(line) for line in (ROOT / "examples/math_agent/data/train.jsonl").open()]
    requests = [
        {"payload": {"question": r["question"], "answer": r["answer"]}, "input_id": r["id"]}
        for r in rows[:4]
    ]
    local = LocalConfig(
        mode="in_process", policy_workers=1, gateway=with_gateway, bucket="bare", queue="bare"
    )
    async with LocalStack(local) as stack:
        config = stack.engine_config(
            flat_config(exp_id="bare", start_rate=50.0, rollout_timeout=60.0, wait_time=1)
        )
        assert (config.gateway is not None) == with_gateway and (config.llm is None) == with_gateway
        spec = {
            "config": config.model_dump(mode="json"),  # holds the admin token: stdin, not argv
            "requests": requests,
            "not_installed": NOT_INSTALLED,
            "not_loaded": list(NOT_LOADED),
            "train": with_gateway,
        }
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "AWS_"))},
            **LOCAL_CREDENTIALS,
        }
        env.pop("VIRTUAL_ENV", None)
        child = await asyncio.create_subprocess_exec(
            bare_python,
            "-I",
            "-c",
            CHILD,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=tmp_path,
            env=env,
        )
        try:
            out, err = await asyncio.wait_for(child.communicate(json.dumps(spec).encode()), 120)
        finally:
            if child.returncode is None:
                child.kill()
                await child.wait()
    assert child.returncode == 0, err.decode()[-3000:]
    report = json.loads(out.decode().splitlines()[-1])
    assert report["missing"] == NOT_INSTALLED  # so that the run below proves something
    assert [o["outcome"] for o in report["outcomes"]] == ["ok"] * len(requests), report
    assert [o["trace"] for o in report["outcomes"]] == [with_gateway] * len(requests)
    assert report["loaded"] == []
    assert (report["rows"] >= len(requests)) == with_gateway  # a row per policy call at least
