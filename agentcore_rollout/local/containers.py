"""The machine's container runtime, and the agent's image built for it.

- `container_engine()`: Podman (preferred) or Docker, whichever is present and works (or the one
  asked for); a missing runtime or a Docker client without its daemon raises
  `ContainerRuntimeError`, one line saying which and how to fix it.
- `build_image()`: the agent's image from its Dockerfile, for this machine's architecture.
  Where the Dockerfile's base image cannot be pulled (no registry reachable), `debian_base()`
  substitutes for it, and one line says so.
- `debian_base()`: python3 and a venv (as `python`/`pip` on PATH, like the python images) from
  Debian's packages with mmdebstrap, imported once per machine as `BASE_IMAGE`.

Each session container has its own network namespace and reaches the stack's services, which
bind the host's loopback only:
- Podman (slirp4netns, `allow_host_loopback`) reaches the host's loopback at 10.0.2.2 itself.
  It runs with a containers.conf this module writes (`CONTAINERS_CONF`, never /etc): runc with
  no default ulimits and cgroupfs, since crun is refused here (`setrlimit RLIMIT_NOFILE`, then
  `cgroups in hybrid mode not supported`).
- Docker's containers join `DOCKER_NETWORK`, a bridge without traffic between its containers,
  and reach the host at its gateway address, where the emulator relays the stack's ports to
  loopback for that network's peers alone (`relay.py`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
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
"""Podman: each container its own network namespace, reaching the host's loopback services."""
DOCKER_NETWORK = "agentcore-rollout"
"""Docker: the bridge session containers join (no traffic between them, as between microVMs)."""
_DEBIAN_PACKAGES = "python3-minimal,python3-venv,passwd,ca-certificates"
_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
_CONF = """\
[containers]
default_ulimits = []
[engine]
cgroup_manager = "cgroupfs"
"""
_INSTALL = "apt-get install podman runc catatonit uidmap slirp4netns mmdebstrap (or docker.io)"
ENGINES = ("auto", "podman", "docker")
_LOOPBACK = r"(?:127\.0\.0\.1|localhost)"


class ContainerRuntimeError(RuntimeError):
    """No container runtime that works here: the message says which and how to fix it."""


class ImageBuildError(RuntimeError):
    """The agent's image did not build: the message ends with the builder's last line."""


@dataclass(frozen=True)
class ContainerEngine:
    """A container CLI (`podman` or `docker`), the environment it runs with, and how its
    session containers reach the host."""

    name: str
    path: str
    env: dict[str, str]
    network: str = NETWORK
    host: str = HOST_FROM_CONTAINER
    """The host's address as a session container sees it."""
    subnet: str | None = None
    """Docker: `network`'s subnet, whose peers the emulator's relay serves (Podman: None)."""

    def argv(self, *args: str) -> list[str]:
        return [self.path, *args]

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run one CLI command to its end (output captured; the caller checks the code)."""
        return subprocess.run(
            self.argv(*args), env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def image_exists(self, image: str) -> bool:
        return self.run("image", "inspect", image).returncode == 0

    def remove(self, *containers: str, grace: int = 0) -> None:
        """Remove containers: SIGTERM, SIGKILL after `grace` seconds (0: at once)."""
        if self.name == "podman":
            self.run("rm", "-f", "-t", str(grace), *containers, timeout=30 + grace)
            return
        if grace:  # docker's rm has no grace period; its stop has, and `--rm` then removes
            self.run("stop", "-t", str(grace), *containers, timeout=30 + grace)
        self.run("rm", "-f", *containers, timeout=30)

    def remove_orphans(self) -> None:
        """Force-remove session containers whose emulator is gone (killed before its stop):
        the label's value begins with its emulator's pid."""
        if not (ids := self.run("ps", "-aq", "--filter", f"label={LABEL}").stdout.split()):
            return
        template = '{{.Id}} {{index .Config.Labels "' + LABEL + '"}}'
        shown = self.run("inspect", "--format", template, *ids)  # some may be gone by now
        labelled = (line.split(" ", 1) for line in shown.stdout.splitlines() if " " in line)
        if orphans := [cid for cid, label in labelled if not _alive(label.split("-")[0])]:
            self.remove(*orphans)

    def remove_containers(self, label_value: str) -> None:
        """Force-remove every container of one emulator (those whose start raced its stop)."""
        found = self.run("ps", "-aq", "--filter", f"label={LABEL}={label_value}")
        if ids := found.stdout.split():
            self.remove(*ids)


@functools.cache
def container_engine(choice: str = "auto") -> ContainerEngine:
    """The runtime sessions run in: `choice` (podman or docker), or with "auto" Podman where
    present, else Docker. Raises `ContainerRuntimeError` (not cached) if it does not work."""
    if choice not in ENGINES:
        raise ValueError(f"container engine {choice!r} is none of {', '.join(ENGINES)}")
    if choice != "docker" and (podman := shutil.which("podman")):
        conf = _cache_dir() / "containers.conf"
        runtime = '\nruntime = "runc"\n' if shutil.which("runc") else ""
        conf.write_text(_CONF + runtime)
        return ContainerEngine("podman", podman, {**os.environ, "CONTAINERS_CONF": str(conf)})
    if choice != "podman" and (docker := shutil.which("docker")):
        return _docker(docker)
    wanted = "podman or docker" if choice == "auto" else choice
    raise ContainerRuntimeError(f"no container runtime ({wanted}) found: {_INSTALL}")


def _docker(path: str) -> ContainerEngine:
    """Docker, once its daemon answers, with `DOCKER_NETWORK` (made the first time)."""
    engine = ContainerEngine("docker", path, dict(os.environ), network=DOCKER_NETWORK)
    info = engine.run("info", "--format", "{{.ServerVersion}}", timeout=20)
    if info.returncode != 0:
        why = _last_line(info.stderr or info.stdout)
        raise ContainerRuntimeError(
            f"docker is present but not running ({why}): start its daemon (dockerd), or {_INSTALL}"
        )
    template = "{{range .IPAM.Config}}{{.Gateway}} {{.Subnet}}{{end}}"
    shown = engine.run("network", "inspect", DOCKER_NETWORK, "--format", template)
    if shown.returncode != 0:  # made here; another process may be making it at once
        icc = "com.docker.network.bridge.enable_icc=false"
        engine.run("network", "create", "--driver", "bridge", "-o", icc, DOCKER_NETWORK)
        shown = engine.run("network", "inspect", DOCKER_NETWORK, "--format", template)
    gateway, _, subnet = shown.stdout.strip().partition(" ")
    if shown.returncode != 0 or not subnet:
        why = _last_line(shown.stderr or shown.stdout)
        raise ContainerRuntimeError(f"docker network {DOCKER_NETWORK} is unusable: {why}")
    return dataclasses.replace(engine, host=gateway, subnet=subnet)


def container_url(url: str, host: str = HOST_FROM_CONTAINER) -> str:
    """A loopback URL of the host as a session container reaches it (at `host`)."""
    return re.sub(rf"//{_LOOPBACK}(?=[:/]|$)", f"//{host}", url)


def loopback_ports(urls: Iterable[str]) -> set[int]:
    """The ports of the host's loopback services among `urls` (what a Docker relay serves)."""
    found = (re.match(rf"\w+://{_LOOPBACK}:(\d+)", url) for url in urls)
    return {int(m.group(1)) for m in found if m}


def build_image(
    dockerfile: str | Path, image: str, context: str | Path = ".", *, engine: ContainerEngine
) -> str:
    """Build `image` from `dockerfile` for this machine; returns the base image used."""
    lines = Path(dockerfile).read_text().splitlines(keepends=True)
    base = _first_from(lines, dockerfile)[1][0]
    with tempfile.TemporaryDirectory(prefix="agentcore-rollout-build-") as tmp:
        if not engine.image_exists(base):
            pulled = engine.run("pull", "-q", base, timeout=300)
            if pulled.returncode != 0:
                why = _last_line(pulled.stderr).rsplit(": ", 1)[-1]
                print(
                    f"{base} cannot be pulled ({why}): building on {BASE_IMAGE}, Debian's python3",
                    file=sys.stderr,
                )
                base = debian_base(engine)
                dockerfile = _on_base(lines, base, Path(tmp))
        # --force-rm: docker's builder otherwise keeps the container of a step that failed
        argv = engine.argv("build", "--force-rm", "-f", str(dockerfile), "-t", image, str(context))
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


def ensure_image(dockerfile: str | Path, image: str, engine: ContainerEngine) -> None:
    """Build `image` unless it exists (built once; `local build` rebuilds it)."""
    if not engine.image_exists(image):
        print(f"building {image} from {dockerfile} (once)", file=sys.stderr)
        build_image(dockerfile, image, engine=engine)


def debian_base(engine: ContainerEngine) -> str:
    """`BASE_IMAGE`, built from Debian's packages the first time. The machine's CA bundle goes
    in, so pip inside a build trusts what the host trusts (a proxy's CA included)."""
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


def _first_from(lines: list[str], name: object = "the Dockerfile") -> tuple[int, list[str]]:
    """The Dockerfile's first FROM: its line's index, and what it names (image, `AS stage`),
    its `--platform=` dropped."""
    for i, line in enumerate(lines):
        words = line.split()
        if words and words[0].upper() == "FROM":
            return i, [w for w in words[1:] if not w.startswith("--")]
    raise ImageBuildError(f"{name} has no FROM line")


def _on_base(lines: list[str], base: str, tmp: Path) -> Path:
    """A copy of the Dockerfile (in `tmp`) whose first FROM names `base`, its `--platform=`
    dropped too, since the substitute is built for this machine."""
    i, named = _first_from(lines)
    copy = tmp / "Dockerfile"
    copy.write_text(
        "".join([*lines[:i], " ".join(["FROM", base, *named[1:]]) + "\n", *lines[i + 1 :]])
    )
    return copy


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
