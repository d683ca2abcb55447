"""Result objects for tests that play the agent's part by hand."""

from __future__ import annotations

import time
from typing import Any

from agentcore_rollout.contract import RolloutResult, Timings, encode_result, sign_result

SIG_KEY = "k" * 32


def make_result(**fields: Any) -> RolloutResult:
    """A valid `ok` result; any field can be overridden."""
    now = time.time()
    base: dict[str, Any] = {
        "exp_id": "e",
        "step": 0,
        "request_id": "r1",
        "input_id": "g",
        "session_id": "s" * 33,
        "status": "ok",
        "rewards": 1.0,
        "timings": Timings(received=now, started=now, finished=now),
    }
    return RolloutResult(**(base | fields))


def signed_body(result: RolloutResult, sig_key: str = SIG_KEY) -> bytes:
    """The bytes an agent would put in S3."""
    return encode_result(sign_result(result, sig_key))
