"""JSON for the gateway's hot path: orjson when installed (the [gateway] extra pins it), else the
standard library, which a core + [local] install runs the gateway on.

Why: every turn carries the whole conversation in (the agent's request) and the whole prompt out
(its ids, to the backend), so JSON work grows with the conversation; orjson encodes a list of
ids about ten times faster than `json.dumps`. Both produce compact UTF-8 bytes.
"""

from __future__ import annotations

import json
from typing import Any

try:
    import orjson
except ImportError:  # pragma: no cover - exercised only without the [gateway] extra
    orjson = None


def dumps(data: Any) -> bytes:
    """Compact JSON bytes. NaN and infinities: null with orjson, ValueError without."""
    if orjson is not None:
        return orjson.dumps(data)
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def loads(data: bytes | str) -> Any:
    """Parse JSON; ValueError (orjson's JSONDecodeError is one) if it is not valid."""
    if orjson is not None:
        return orjson.loads(data)
    return json.loads(data)
