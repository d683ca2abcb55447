"""What the agent's session hands a separate verifier: the task's `artifacts`, one tar.gz beside
the result object, its digest in the agent's signed result, checked and unpacked by the
verifier's session. Unpacking takes regular files and folders by relative names only: what an
agent packs is untrusted input."""

from __future__ import annotations

import fnmatch
import hashlib
import io
import tarfile
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from aiobotocore.session import get_session

from ..agent import VerifierError

CONVENTION = "/logs/artifacts"
MAX_BYTES = 512 * 1024 * 1024
"""The most a session hands over (compressed): more fails the rollout as the agent's."""


def pack(entries: Sequence[dict[str, Any]]) -> bytes:
    """The artifacts that exist, as a tar.gz: entry i's source under `i/`, less its
    `exclude` patterns; the convention folder under `c/`. A missing source is skipped, as
    Harbor skips it."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        sources = [(str(i), e["source"], e.get("exclude") or ()) for i, e in enumerate(entries)]
        for name, source, exclude in [*sources, ("c", CONVENTION, ())]:
            path = Path(source)
            if path.exists() and not path.is_symlink():
                tar.add(path, arcname=name, filter=_leaving_out(exclude))
    if out.tell() > MAX_BYTES:
        raise ValueError(f"the artifacts are over {MAX_BYTES >> 20} MiB packed")
    return out.getvalue()


def unpack(body: bytes, entries: Sequence[dict[str, Any]]) -> list[str]:
    """Put each packed entry at its destination (else its source path); the paths written."""
    targets = {str(i): e.get("destination") or e["source"] for i, e in enumerate(entries)}
    targets["c"] = CONVENTION
    written = []
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as tar:
        for member in tar:
            parts = PurePosixPath(member.name).parts
            if not parts or parts[0] not in targets or ".." in parts or member.name.startswith("/"):
                raise VerifierError(f"artifacts: entry {member.name!r} is not one we packed")
            if not (member.isfile() or member.isdir()):
                continue  # links and devices are not carried over
            target = Path(targets[parts[0]], *parts[1:])
            if member.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            source = tar.extractfile(member)
            assert source is not None
            with source, target.open("wb") as f:
                f.write(source.read())
            target.chmod(member.mode & 0o755)
            written.append(str(target))
    return written


def digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


async def put(bucket: str, key: str, body: bytes) -> None:
    """Beside the result, written once (a second write of the same key fails)."""
    async with get_session().create_client("s3") as s3:
        await s3.put_object(Bucket=bucket, Key=key, Body=body, IfNoneMatch="*")


async def fetch(handed: Any) -> bytes:
    """The agent's artifacts as the engine passed them on (`contract.AGENT_ARTIFACTS_KEY`),
    checked against the digest in the agent's signed result."""
    if not isinstance(handed, dict) or not {"bucket", "key", "sha256"} <= set(handed):
        raise VerifierError("the agent's session handed over no artifacts")
    async with get_session().create_client("s3") as s3:
        got = await s3.get_object(Bucket=handed["bucket"], Key=handed["key"])
        if got["ContentLength"] > MAX_BYTES:
            raise VerifierError(f"artifacts: over {MAX_BYTES >> 20} MiB")
        async with got["Body"] as stream:
            body = await stream.read()
    if digest(body) != handed["sha256"]:
        raise VerifierError("artifacts: changed since the agent's session wrote them")
    return body


def _leaving_out(patterns: Sequence[str]) -> Any:
    def keep(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
        name = PurePosixPath(member.name)
        relative = PurePosixPath(*name.parts[1:]) if len(name.parts) > 1 else name
        for pattern in patterns:
            if fnmatch.fnmatch(str(relative), pattern) or fnmatch.fnmatch(name.name, pattern):
                return None
        return member if member.isfile() or member.isdir() else None

    return keep
