"""A result's checks before any request sees it: pure functions, so the buffer runs a large
object's in a worker thread, and a test runs them without a queue.

An object in S3 and a result the agent's own message carried are held to the same checks:
size, schema, the request it answers (its key, experiment, step and id) and its signature.
Each failure is a `ContractError` whose `reason` the buffer counts.
"""

from __future__ import annotations

from ..contract import ContractError, ResultKey, RolloutResult, decode_result, verify_result


def checked_object(
    key: str, body: bytes, exp_id: str, step: int, request_id: str, sig_key: str, max_bytes: int
) -> RolloutResult:
    """The object at `key`, parsed and checked (pure CPU: may run in a worker thread)."""
    result = decode_result(body, max_bytes)
    _check_identity(result, key, exp_id, step, request_id)
    verify_result(result, sig_key)
    return result


def checked_inline(
    result: RolloutResult, key: ResultKey, size: int, exp_id: str, sig_key: str, max_bytes: int
) -> RolloutResult:
    """A result carried in a message of `size` bytes, checked as its object at `key` would be."""
    if size > max_bytes:
        raise ContractError(f"message is {size} bytes, over the {max_bytes} limit", "too_large")
    _check_identity(result, key.key, exp_id, key.step, key.request_id)
    verify_result(result, sig_key)
    return result


def _check_identity(
    result: RolloutResult, key: str, exp_id: str, step: int, request_id: str
) -> None:
    if (result.exp_id, result.step, result.request_id) != (exp_id, step, request_id):
        raise ContractError(
            f"object at {key} is for {result.exp_id}/{result.step}/{result.request_id}",
            "wrong_object",
        )
