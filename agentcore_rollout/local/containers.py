"""The machine's container runtime (Podman or Docker), the agent's image built for it, and the
networks that keep a session container from the host's other services and from other sessions.

A missing runtime or a Docker client without its daemon is one line saying which and how to fix
it. Podman runs with a containers.conf written here, never /etc's: runc with no default ulimits
and cgroupfs, since crun is refused on this kind of host (`setrlimit RLIMIT_NOFILE`, then `cgroups
in hybrid mode not supported`). How a container reaches the stack and nothing else, and how a
no-network one is sealed: docs/local-stack.md#how-a-container-reaches-the-stack-and-nothing-else."""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from ..runtimes._owner import gone

BASE_IMAGE = "localhost/agentcore-rollout-base:bookworm"
AGENT_IMAGE = "localhost/agentcore-rollout-agent:local"
LABEL = "agentcore-rollout.emulator"
"""Every session container carries it, valued with its emulator's identity (`owner_label`), so
none is left behind."""
SESSION_LABEL = "agentcore-rollout.session"
"""Its session's id, on each session container."""
NETWORK = "slirp4netns"
"""Podman: each container its own network namespace, the host's loopback out of its reach."""
DOCKER_NETWORK = "agentcore-rollout"
"""Docker: the bridge session containers join (no traffic between them, as between microVMs)."""
INTERNAL_NETWORK = "agentcore-rollout-internal"
"""No-network sessions' bridge (`--internal`): no route out, no DNS; the host at its gateway."""
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
TAIL_LINES = 12
"""The builder's last lines a failed build keeps (`ImageBuildError.tail`)."""


class ContainerRuntimeError(RuntimeError):
    """No container runtime that works here: the message says which and how to fix it."""


class ImageBuildError(RuntimeError):
    """The agent's image did not build: the message ends with the builder's last line, `tail`
    holds its last lines (at most `TAIL_LINES`)."""

    def __init__(self, message: str, tail: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.tail = tuple(tail)


@dataclass(frozen=True)
class ContainerEngine:
    """A container CLI (`podman` or `docker`), the environment it runs with, and how its
    session containers reach the host."""

    name: str
    path: str
    env: dict[str, str]
    host: str
    """The host's address as a session container sees it, where the emulator's relay listens."""
    subnet: str
    """The peers the relay serves: Docker's `network`'s subnet; with Podman, `host` itself."""
    network: str = NETWORK

    def argv(self, *args: str) -> list[str]:
        return [self.path, *args]

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run one CLI command to its end (output captured; the caller checks the code)."""
        return subprocess.run(
            self.argv(*args), env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def image_exists(self, image: str) -> bool:
        return self.run("image", "inspect", image).returncode == 0

    def image_bytes(self, image: str) -> int:
        """The image's size as this engine reports it (uncompressed, its layers summed)."""
        shown = self.run("image", "inspect", "--format", "{{.Size}}", image)
        if shown.returncode != 0:
            raise RuntimeError(f"image {image}: {_last_line(shown.stderr or shown.stdout)}")
        return int(shown.stdout.split()[0])

    def remove(self, *containers: str, grace: int = 0) -> None:
        """Remove containers: SIGTERM, SIGKILL after `grace` seconds (0: at once)."""
        if self.name == "podman":
            self.run("rm", "-f", "-t", str(grace), *containers, timeout=30 + grace)
            return
        if grace:  # docker's rm has no grace period; its stop has, and `--rm` then removes
            self.run("stop", "-t", str(grace), *containers, timeout=30 + grace)
        self.run("rm", "-f", *containers, timeout=30)

    def remove_orphans(self) -> None:
        """Force-remove session containers whose emulator is provably gone (killed before its
        stop): labelled by an emulator of this kernel and PID namespace whose process runs no
        more. Those of another host, namespace or label format sharing the daemon are left."""
        if not (ids := self.run("ps", "-aq", "--filter", f"label={LABEL}").stdout.split()):
            return
        template = '{{.Id}} {{index .Config.Labels "' + LABEL + '"}}'
        shown = self.run("inspect", "--format", template, *ids)  # some may be gone by now
        labelled = (line.split(" ", 1) for line in shown.stdout.splitlines() if " " in line)
        if orphans := [cid for cid, label in labelled if gone(label)]:
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
        env = {**os.environ, "CONTAINERS_CONF": str(conf)}
        host = _host_address()
        return ContainerEngine("podman", podman, env, host=host, subnet=f"{host}/32")
    if choice != "podman" and (docker := shutil.which("docker")):
        return _docker(docker)
    wanted = "podman or docker" if choice == "auto" else choice
    raise ContainerRuntimeError(f"no container runtime ({wanted}) found: {_INSTALL}")


def _docker(path: str) -> ContainerEngine:
    """Docker, once its daemon answers, with `DOCKER_NETWORK` (made the first time)."""
    engine = ContainerEngine("docker", path, dict(os.environ), "", "", network=DOCKER_NETWORK)
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


@dataclass(frozen=True)
class InternalNetwork:
    """`INTERNAL_NETWORK` as an engine has it: its name, its gateway (the host's address on
    it, where the relay listens) and its subnet (the relay's peers)."""

    name: str
    gateway: str
    subnet: str
    bridge: str = ""
    """Podman: the host's bridge device, whose ports `isolate_ports` keeps apart."""


_internal: dict[str, InternalNetwork] = {}


def internal_network(engine: ContainerEngine) -> InternalNetwork:
    """`INTERNAL_NETWORK`, made the first time (another process may be making it at once);
    a network of that name that is not internal is refused, in one line."""
    if (known := _internal.get(engine.path)) is not None:
        return known
    if engine.name == "podman":
        if os.geteuid() != 0:
            raise ContainerRuntimeError(
                "no-network sessions need Podman as root: a rootless Podman's internal "
                "bridge is in a namespace of its own, out of the emulator's reach"
            )
        template = "{{.Internal}} {{range .Subnets}}{{.Gateway}} {{.Subnet}}{{end}}"
        template += " {{.NetworkInterface}}"
        create = ("--internal", "--disable-dns")
    else:
        template = "{{.Internal}} {{range .IPAM.Config}}{{.Gateway}} {{.Subnet}}{{end}}"
        create = ("--internal", "--driver", "bridge")
        create += ("-o", "com.docker.network.bridge.enable_icc=false")
    shown = engine.run("network", "inspect", INTERNAL_NETWORK, "--format", template)
    if shown.returncode != 0:
        engine.run("network", "create", *create, INTERNAL_NETWORK)
        shown = engine.run("network", "inspect", INTERNAL_NETWORK, "--format", template)
        words = shown.stdout.split()
        if len(words) >= 3 and words[1] == "<nil>":
            # Podman gives an internal network without DNS no gateway (no host address on
            # its bridge): made again on the subnet it chose, with its first address the host's
            subnet = ipaddress.ip_network(words[2])
            engine.run("network", "rm", INTERNAL_NETWORK)
            gateway = ("--subnet", str(subnet), "--gateway", str(next(subnet.hosts())))
            engine.run("network", "create", *create, *gateway, INTERNAL_NETWORK)
            shown = engine.run("network", "inspect", INTERNAL_NETWORK, "--format", template)
    words = shown.stdout.split()
    if shown.returncode != 0 or len(words) not in (3, 4) or words[1] == "<nil>":
        why = _last_line(shown.stderr or shown.stdout)
        raise ContainerRuntimeError(f"{engine.name} network {INTERNAL_NETWORK} is unusable: {why}")
    if words[0] != "true":
        raise ContainerRuntimeError(
            f"{engine.name} network {INTERNAL_NETWORK} is not internal: remove it "
            f"({engine.name} network rm {INTERNAL_NETWORK}), it is made again"
        )
    _internal[engine.path] = made = InternalNetwork(INTERNAL_NETWORK, *words[1:])
    return made


def seal(pid: int, gateway: str, ports: Iterable[int]) -> None:
    """The network namespace of process `pid` (a no-network container's) lets out nothing but
    loopback, replies on connections made to it (the emulator's to its 8080) and TCP to
    `gateway` on `ports` (the relay's): its host's other services, listening on every address
    and so at the gateway too, are out of reach, and IPv6 (link-local on the bridge) sends
    nothing. Set from the host (`nsenter`, iptables); the container has no CAP_NET_ADMIN to
    undo it. Raises `ContainerRuntimeError` (one line) if it cannot be set."""
    allowed = "".join(f"-A OUTPUT -d {gateway}/32 -p tcp --dport {p} -j ACCEPT\n" for p in ports)
    rules = (
        "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT DROP [0:0]\n"
        "-A OUTPUT -o lo -j ACCEPT\n"
        "-A OUTPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT\n"
    )
    for tool, text in (("iptables-restore", rules + allowed), ("ip6tables-restore", rules)):
        if shutil.which("nsenter") is None or shutil.which(tool) is None:
            raise ContainerRuntimeError(f"sealing a no-network container needs nsenter and {tool}")
        argv = ["nsenter", "-t", str(pid), "-n", tool]
        done = subprocess.run(argv, input=text + "COMMIT\n", capture_output=True, text=True)
        if done.returncode != 0:
            why = _last_line(done.stderr or done.stdout)
            raise ContainerRuntimeError(f"cannot seal a no-network container ({tool}): {why}")


def isolate_ports(bridge: str) -> None:
    """Every port of `bridge` isolated (the kernel's `isolated` flag: no traffic between two
    isolated ports, each still reaching the bridge, the host): each container on it reaches
    the host alone. Raises `ContainerRuntimeError` if the flag cannot be set."""
    for flag in (Path("/sys/class/net") / bridge / "brif").glob("*/isolated"):
        try:
            if flag.read_text().strip() != "1":
                flag.write_text("1")
        except FileNotFoundError:  # a port gone meanwhile (its container ended)
            continue
        except OSError as e:
            why = f"cannot isolate the ports of bridge {bridge}: {e}"
            raise ContainerRuntimeError(why) from None


_storage: dict[str, str | None] = {}


def storage_quota(engine: ContainerEngine) -> str | None:
    """None if `engine` can bound a container's disk (`--storage-opt size=`), else why not, in
    one line (asked once per process: `info` takes seconds on a loaded machine)."""
    if engine.path not in _storage:
        _storage[engine.path] = _storage_reason(engine)
    return _storage[engine.path]


def _storage_reason(engine: ContainerEngine) -> str | None:
    shown = engine.run("info", "--format", "json", timeout=120)
    try:
        info = json.loads(shown.stdout)
    except ValueError:
        return f"{engine.name} info did not answer ({_last_line(shown.stderr)})"
    if engine.name == "podman":
        store = info.get("store", {})
        driver, status = store.get("graphDriverName", ""), store.get("graphStatus", {})
    else:
        driver, status = info.get("Driver", ""), dict(info.get("DriverStatus") or [])
    backing = status.get("Backing Filesystem", "unknown")
    if driver in ("overlay", "overlay2") and backing == "xfs":
        return None
    return (
        f"{engine.name}'s storage ({driver} on {backing}) cannot bound a container's disk "
        "(--storage-opt size= needs overlay on XFS with project quotas)"
    )


def container_url(url: str, host: str) -> str:
    """A loopback URL of the host as a session container reaches it (at `host`)."""
    return re.sub(rf"//{_LOOPBACK}(?=[:/]|$)", f"//{host}", url)


def loopback_ports(urls: Iterable[str]) -> set[int]:
    """The ports of the host's loopback services among `urls` (what a Docker relay serves)."""
    found = (re.match(rf"\w+://{_LOOPBACK}:(\d+)", url) for url in urls)
    return {int(m.group(1)) for m in found if m}


def build_image(
    dockerfile: str | Path,
    image: str,
    context: str | Path = ".",
    *,
    engine: ContainerEngine,
    log: TextIO | None = sys.stderr,
) -> str:
    """Build `image` from `dockerfile` for this machine; returns the base image used. The
    builder's output goes to `log` as it comes (None: kept only for a failure's message)."""
    lines = Path(dockerfile).read_text().splitlines(keepends=True)
    base = _first_from(lines, dockerfile)[1][0]
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    with tempfile.TemporaryDirectory(prefix="agentcore-rollout-build-") as tmp:
        if not engine.image_exists(base):
            pulled = engine.run("pull", "-q", base, timeout=300)
            if pulled.returncode != 0:
                why = _last_line(pulled.stderr).rsplit(": ", 1)[-1]
                if log is not None:
                    print(
                        f"{base} cannot be pulled ({why}): building on {BASE_IMAGE}, "
                        "Debian's python3",
                        file=log,
                    )
                base = debian_base(engine)
                dockerfile = _on_base(lines, base, Path(tmp))
        # --force-rm: docker's builder otherwise keeps the container of a step that failed
        argv = engine.argv("build", "--force-rm", "-f", str(dockerfile), "-t", image, str(context))
        with subprocess.Popen(
            argv, env=engine.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        ) as build:
            assert build.stdout is not None
            for line in build.stdout:  # the builder's progress, as it goes; its end kept
                if log is not None:
                    log.write(line)
                if line.strip():
                    tail.append(line.rstrip()[:300])
    if build.returncode != 0:
        last = tail[-1].strip() if tail else "no output"
        raise ImageBuildError(f"image {image} did not build: {last}", tail)
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


def _host_address() -> str:
    """The host's address on its default route: where slirp4netns's containers reach it
    (a UDP socket's connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: any routed address would do
        except OSError as e:
            raise ContainerRuntimeError(
                f"podman: no network address for containers to reach the host at ({e})"
            ) from None
        return probe.getsockname()[0]


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    path = Path(base) / "agentcore-rollout"
    path.mkdir(parents=True, exist_ok=True)
    return path
