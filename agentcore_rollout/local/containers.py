"""The machine's container runtime, and the agent's image built for it.

- `container_engine()`: Podman (preferred) or Docker, whichever is present and works; a missing
  runtime, a Docker client without its daemon or a Docker engine (not supported, see there)
  raises `ContainerRuntimeError`, one line saying which and how to fix it.
- `build_image()`: the agent's image from its Dockerfile, for this machine's architecture.
  Where the Dockerfile's base image cannot be pulled (no registry reachable), `debian_base()`
  substitutes for it, and one line says so.
- `debian_base()`: python3 and a venv (as `python`/`pip` on PATH, like the python images) from
  Debian's packages with mmdebstrap, imported once per machine as `BASE_IMAGE`.

Podman runs with a containers.conf this module writes (`CONTAINERS_CONF`, never /etc): runc
with no default ulimits and cgroupfs, since crun is refused here (`setrlimit RLIMIT_NOFILE`,
then `cgroups in hybrid mode not supported`).
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

BASE_IMAGE = "localhost/agentcore-rollout-base:bookworm"
AGENT_IMAGE = "localhost/agentcore-rollout-agent:local"
LABEL = "agentcore-rollout.emulator"
"""Every session container carries it (valued with its emulator's id), so none is left behind."""
SESSION_LABEL = "agentcore-rollout.session"
"""Its session's id, on each session container."""
HOST_FROM_CONTAINER = "10.0.2.2"
"""The host's loopback as a session container sees it (slirp4netns, allow_host_loopback)."""
NETWORK = "slirp4netns:allow_host_loopback=true"
"""Each container its own network namespace, reaching only the host's loopback services."""
_DEBIAN_PACKAGES = "python3-minimal,python3-venv,passwd,ca-certificates"
_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
_CONF = """\
[containers]
default_ulimits = []
[engine]
cgroup_manager = "cgroupfs"
"""
_INSTALL = "apt-get install podman runc catatonit uidmap slirp4netns mmdebstrap"


class ContainerRuntimeError(RuntimeError):
    """No container runtime that works here: the message says which and how to fix it."""


class ImageBuildError(RuntimeError):
    """The agent's image did not build: the message ends with the builder's last line."""


@dataclass(frozen=True)
class ContainerEngine:
    """A container CLI (`podman` or `docker`) and the environment it runs with."""

    name: str
    path: str
    env: dict[str, str]

    def argv(self, *args: str) -> list[str]:
        return [self.path, *args]

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run one CLI command to its end (output captured; the caller checks the code)."""
        return subprocess.run(
            self.argv(*args), env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def image_exists(self, image: str) -> bool:
        return self.run("image", "inspect", image).returncode == 0

    def remove_orphans(self) -> None:
        """Force-remove session containers whose emulator is gone (killed before its stop):
        the label's value begins with its emulator's pid."""
        listed = self.run("ps", "-a", "--filter", f"label={LABEL}", "--format", "json")
        orphans = [
            c["Id"]
            for c in json.loads(listed.stdout or "[]")
            if not _alive(c.get("Labels", {}).get(LABEL, "").split("-")[0])
        ]
        if orphans:
            self.run("rm", "-f", "-t", "0", *orphans)

    def remove_containers(self, label_value: str) -> None:
        """Force-remove every container of one emulator (those whose start raced its stop)."""
        found = self.run("ps", "-aq", "--filter", f"label={LABEL}={label_value}")
        if ids := found.stdout.split():
            self.run("rm", "-f", "-t", "0", *ids)


@functools.cache
def container_engine() -> ContainerEngine:
    """The runtime sessions run in; raises `ContainerRuntimeError` (not cached) if none works."""
    if podman := shutil.which("podman"):
        conf = _cache_dir() / "containers.conf"
        runtime = '\nruntime = "runc"\n' if shutil.which("runc") else ""
        conf.write_text(_CONF + runtime)
        return ContainerEngine("podman", podman, {**os.environ, "CONTAINERS_CONF": str(conf)})
    if docker := shutil.which("docker"):
        info = subprocess.run([docker, "info"], capture_output=True, text=True, timeout=20)
        if info.returncode != 0:
            why = _last_line(info.stderr or info.stdout)
            raise ContainerRuntimeError(
                f"docker is present but not running ({why}): start its daemon, or {_INSTALL}"
            )
        raise ContainerRuntimeError(
            "docker is running, but the container executor needs podman: a docker bridge "
            "cannot reach the stack's loopback-only endpoints without exposing them; " + _INSTALL
        )
    raise ContainerRuntimeError(f"no container runtime (podman or docker) found: {_INSTALL}")


def container_url(url: str) -> str:
    """A loopback URL of the host as a session container reaches it."""
    return re.sub(r"//(127\.0\.0\.1|localhost)(?=[:/]|$)", f"//{HOST_FROM_CONTAINER}", url)


def build_image(dockerfile: str | Path, image: str = AGENT_IMAGE, context: str | Path = ".") -> str:
    """Build `image` from `dockerfile` for this machine; returns the base image used."""
    engine = container_engine()
    base = _first_from(Path(dockerfile))
    extra: list[str] = []
    if engine.name == "podman" and not engine.image_exists(base):
        pulled = engine.run("pull", "-q", base, timeout=300)
        if pulled.returncode != 0:
            why = _last_line(pulled.stderr).rsplit(": ", 1)[-1]
            print(
                f"{base} cannot be pulled ({why}): building on {BASE_IMAGE}, Debian's python3",
                file=sys.stderr,
            )
            base = debian_base(engine)
            extra = ["--from", base]
    argv = engine.argv("build", *extra, "-f", str(dockerfile), "-t", image, str(context))
    last = "no output"
    with subprocess.Popen(
        argv, env=engine.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as build:
        assert build.stdout is not None
        for line in build.stdout:  # the builder's progress, as it goes; its last line kept
            sys.stderr.write(line)
            last = line.strip() or last
    if build.returncode != 0:
        raise ImageBuildError(f"image {image} did not build: {last[:300]}")
    return base


def ensure_image(dockerfile: str | Path, image: str = AGENT_IMAGE) -> None:
    """Build `image` unless it exists (built once; `local build` rebuilds it)."""
    if not container_engine().image_exists(image):
        print(f"building {image} from {dockerfile} (once)", file=sys.stderr)
        build_image(dockerfile, image)


def debian_base(engine: ContainerEngine | None = None) -> str:
    """`BASE_IMAGE`, built from Debian's packages the first time. The machine's CA bundle goes
    in, so pip inside a build trusts what the host trusts (a proxy's CA included)."""
    engine = engine or container_engine()
    if engine.image_exists(BASE_IMAGE):
        return BASE_IMAGE
    if shutil.which("mmdebstrap") is None:
        raise ImageBuildError(f"building {BASE_IMAGE} needs mmdebstrap: {_INSTALL}")
    with tempfile.TemporaryDirectory(prefix="agentcore-rollout-base-") as tmp:
        rootfs = os.path.join(tmp, "rootfs.tar")
        argv = [
            "mmdebstrap",
            "--variant=apt",
            f"--include={_DEBIAN_PACKAGES}",
            *(f"--dpkgopt=path-exclude=/usr/share/{d}/*" for d in ("doc", "man", "locale")),
            '--customize-hook=chroot "$1" python3 -m venv /opt/venv',
            f'--customize-hook=cat {_CA_BUNDLE} > "$1{_CA_BUNDLE}"',
            "bookworm",
            rootfs,
        ]
        made = subprocess.run(argv, capture_output=True, text=True)
        if made.returncode != 0:
            raise ImageBuildError(f"mmdebstrap failed: {_last_line(made.stderr)}")
        path = "/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        imported = engine.run(
            *("import", "--change", f"ENV PATH={path}", "--change", 'CMD ["python3"]'),
            *(rootfs, BASE_IMAGE),
            timeout=300,
        )
        if imported.returncode != 0:
            raise ImageBuildError(f"importing {BASE_IMAGE} failed: {_last_line(imported.stderr)}")
    return BASE_IMAGE


def _first_from(dockerfile: Path) -> str:
    """The image the Dockerfile's first FROM names (its `--platform=` dropped)."""
    for line in dockerfile.read_text().splitlines():
        words = line.split()
        if words and words[0].upper() == "FROM":
            return next(w for w in words[1:] if not w.startswith("--"))
    raise ImageBuildError(f"{dockerfile} has no FROM line")


def _alive(pid: str) -> bool:
    """A process of this pid runs (a label not starting with one: not ours to judge)."""
    if not pid.isdigit() or int(pid) <= 0:
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    path = Path(base) / "agentcore-rollout"
    path.mkdir(parents=True, exist_ok=True)
    return path
