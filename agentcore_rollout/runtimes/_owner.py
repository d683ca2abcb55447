"""Who ran a container: a label naming this process, and whether the process a label names is
gone. A container engine outlives the process that ran its containers (a SIGKILL, a crash), so
the next process here removes what a gone one left, and never a live one's."""

from __future__ import annotations

import functools
import os
import socket
import uuid
from pathlib import Path


def owner_label() -> str:
    """A new owner's identity: where it runs (this kernel's boot and PID namespace), its pid
    and that process's start time (a pid is reused), and a random part (two owners in one
    process)."""
    return f"{_scope()}/{os.getpid()}/{_started(os.getpid())}/{uuid.uuid4().hex[:8]}"


def gone(label: str) -> bool:
    """The owner `label` names ran here (this kernel and PID namespace) and is gone: its pid
    runs no more, or runs another process (started at another time). Another host's,
    namespace's or format's label is not ours to judge: False."""
    parts = label.split("/")
    if len(parts) != 4 or parts[0] != _scope() or not parts[1].isdigit():
        return False
    return _started(int(parts[1])) != parts[2]


@functools.cache
def _scope() -> str:
    """This kernel's boot and this process's PID namespace (the hostname where /proc lacks
    them): a pid means one process within it alone."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}.{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return socket.gethostname()


def _started(pid: int) -> str:
    """When process `pid` started (clock ticks since boot; "" if none runs). Without /proc,
    "0" for any live pid: a reused pid then passes for its owner, which only keeps its
    containers."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[19]  # field 22, counted after the command's ")"
    except FileNotFoundError:
        return ""
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return ""
    except PermissionError:
        pass
    return "0"
