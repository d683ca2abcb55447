"""What a task image's verifier may trust, recorded when the image is built and checked before the
tests run: a policy that could rewrite the verifier's tools would write its own reward.

`record` runs as the layer's last RUN, as root, before any agent exists; the wrapper reads the
record once, when it starts, so what an agent later writes over it changes nothing. What is
checked and what is out of scope: docs/harbor.md#threat-model-rewards-a-policy-cannot-hack."""

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
