"""What a task image's verifier may trust, recorded when the image is built and checked
before the tests run: a policy that could rewrite the verifier's tools would write its own
reward.

`record` runs as the last step of the wrapper's layer (`RECORD`, a RUN line of the layer's
Dockerfile, as root, before any agent exists) and writes `TRUSTED_JSON` (root-owned, 0444):

- `tools`: the absolute path, real path and sha256 of each of `TOOLS` found on the image's
  PATH (bash, python3, and the test runners tests commonly call: pytest, uv, uvx);
- `mounts`: what `/logs` and `/tests` are in the image (`dir`, `absent`, ...);
- `env`: the image's own ENV (its Dockerfile's, and the layer's), the variables an agent is
  given besides the allowlist (`allowlist.py`).

The wrapper reads it once, when it starts (`load`), so what an agent later writes over the
file changes nothing. Before the tests run, `check` reports every difference: a tool whose
bytes changed or that is no longer the one PATH finds (an agent's /usr/local/bin/bash
shadowing /usr/bin/bash), a mount point that became a symlink or a file. The verifier then
runs `[<recorded bash>, /tests/test.sh]` with the recorded tools' folders first on PATH
(`trusted_path`).

Out of scope, and said so in docs/harbor.md: `sh`, `env` and the coreutils a test calls are
not hashed (their folders come first on PATH, so an agent's copy elsewhere does not shadow
them, but a root agent can rewrite them in place), nor the libraries (libc, Python packages)
the tests load, nor any file the tests read. In a shared session a root agent can change
those; a separate verifier environment (the agent's declared artifacts alone cross) is the
mode that closes it."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TRUSTED_JSON = Path("/opt/agentcore-rollout/trusted.json")
RECORD = "RUN /opt/agentcore-rollout/bin/python -m agentcore_rollout.harbor.trusted record\n"
"""The layer's last RUN line (`images.layer_dockerfile` appends it after the agent's
install and the layer's ENV): the record is made of the finished image."""
TOOLS = ("bash", "python3", "pytest", "uv", "uvx")
MOUNTS = ("/logs", "/tests", "/logs/verifier")
_BUILD_ONLY = ("HOSTNAME", "HOME", "PWD", "SHLVL", "OLDPWD", "_")
"""Variables a build step has that are not the image's ENV."""
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Trusted:
    """A task image's record (`TRUSTED_JSON`), as the wrapper loaded it at its start."""

    tools: dict[str, dict[str, str]] = field(default_factory=dict)
    """name -> {"path", "real", "sha256"}"""
    mounts: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)

    def bash(self) -> str | None:
        found = self.tools.get("bash")
        return found["path"] if found else None


def record(path: Path = TRUSTED_JSON, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Write the record of this image (run at its build, as root) and return it."""
    environ = os.environ if environ is None else environ
    tools = {}
    for name in TOOLS:
        found = shutil.which(name, path=environ.get("PATH"))
        if found is not None:
            real = os.path.realpath(found)
            tools[name] = {"path": found, "real": real, "sha256": _sha256(real)}
    made = {
        "v": 1,
        "tools": tools,
        "mounts": {m: _kind(m) for m in MOUNTS},
        "env": {k: v for k, v in sorted(environ.items()) if k not in _BUILD_ONLY},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    path.write_text(json.dumps(made, indent=1, sort_keys=True) + "\n")
    if os.geteuid() == 0:
        os.chown(path, 0, 0)
    path.chmod(0o444)
    return made


def load(path: Path = TRUSTED_JSON) -> Trusted | None:
    """The image's record; None when there is none (an image built before records were)."""
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(found, dict):
        return None
    return Trusted(
        tools=dict(found.get("tools") or {}),
        mounts=dict(found.get("mounts") or {}),
        env={str(k): str(v) for k, v in (found.get("env") or {}).items()},
    )


def check(trusted: Trusted, path_var: str | None) -> list[str]:
    """Every difference from the record, one short entry each ("" none): a tool changed,
    gone, or shadowed on `path_var` (the PATH the tests get before `trusted_path`); a mount
    point that is no longer a folder (or absent)."""
    found: list[str] = []
    for name, tool in trusted.tools.items():
        first = shutil.which(name, path=path_var)
        if first is not None and first != tool["path"]:
            found.append(f"{first} (shadows {tool['path']})")
        real = os.path.realpath(tool["path"])
        if real != tool["real"]:
            found.append(f"{tool['path']} (now {real}, recorded {tool['real']})")
        elif not os.path.isfile(real):
            found.append(f"{tool['path']} (gone)")
        elif _sha256(real) != tool["sha256"]:
            found.append(f"{real} (sha256 differs)")
    for mount in MOUNTS:
        now = _kind(mount)
        if now not in ("dir", "absent"):
            found.append(f"{mount} (a {now}, recorded {trusted.mounts.get(mount, 'absent')})")
    return found


def trusted_path(trusted: Trusted, path_var: str | None) -> str:
    """`path_var` with the recorded tools' folders first (each once)."""
    first = [os.path.dirname(t["path"]) for t in trusted.tools.values()]
    rest = (path_var or os.defpath).split(os.pathsep)
    return os.pathsep.join(dict.fromkeys(d for d in [*first, *rest] if d))


def _kind(path: str) -> str:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return "absent"
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISDIR(mode):
        return "dir"
    return "file" if stat.S_ISREG(mode) else "special file"


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
    except OSError:
        return ""
    return digest.hexdigest()


def main(argv: list[str]) -> int:
    if argv != ["record"]:
        print("usage: python -m agentcore_rollout.harbor.trusted record", file=sys.stderr)
        return 2
    made = record()
    print(f"agentcore-rollout: recorded {', '.join(made['tools'])} in {TRUSTED_JSON}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
