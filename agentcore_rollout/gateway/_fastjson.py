"""JSON for the gateway's hot path: orjson when installed (the [gateway] extra pins it), else the
standard library, which a core + [local] install runs the gateway on.

Every turn carries the whole conversation in and the whole prompt's ids out, so JSON work grows
with the conversation; orjson encodes a list of ids about ten times faster than `json.dumps`."""

from __future__ import annotations

import json
import math
from typing import Any

try:
    import orjson
except ImportError:  # pragma: no cover - exercised only without the [gateway] extra
    orjson = None


def dumps(data: Any) -> bytes:
    """Compact JSON bytes; NaN and infinities become null, with orjson or without."""
    if orjson is not None:
        return orjson.dumps(data)
    try:
        text = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except ValueError:  # rare: only then is the data walked for the floats JSON cannot hold
        text = json.dumps(_finite(data), separators=(",", ":"), ensure_ascii=False)
    return text.encode()


def loads(data: bytes | str) -> Any:
    """Parse JSON; ValueError (orjson's JSONDecodeError is one) if it is not valid, NaN and
    Infinity included, with orjson or without."""
    if orjson is not None:
        return orjson.loads(data)
    return json.loads(data, parse_constant=_invalid)


def _finite(data: Any) -> Any:
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [_finite(v) for v in data]
    return data


def _invalid(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")
