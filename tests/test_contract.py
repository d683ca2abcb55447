"""Wire contract v1: schemas, key layout, signing, notifications; every bad input is one
ContractError with a one-line message."""

from __future__ import annotations

import json
import typing
from urllib.parse import quote_plus

import pytest
from pydantic import ValidationError

from agentcore_rollout.contract import (
    MAX_DEPTH,
    AgentStatus,
    ContractError,
    NamedRewards,
    Outcome,
    RolloutResult,
    Timings,
    canonical_json,
    check_json,
    decode_result,
    encode_result,
    parse_notification,
    parse_result_key,
    result_key,
    scalar_reward,
    sign_result,
    split_payload,
    verify_result,
)

from .factories import SIG_KEY as KEY
from .factories import make_result

pytestmark = pytest.mark.unit


def _result(**kw) -> RolloutResult:
    return make_result(step=3, timings=Timings(received=1.0, started=1.5, finished=2.0), **kw)


def _control(**kw) -> dict:
    base = {
        "v": 1,
        "exp_id": "e",
        "step": 0,
        "request_id": "r1",
        "input_id": "g",
        "sample_index": 0,
        "session_id": "s" * 33,
        "result": {"bucket": "bkt", "key": "p/e/00000000/r1.json"},
        "deadline": 1e10,
        "sig_key": KEY,
    }
    return base | kw


def test_an_agents_status_words_are_outcomes():
    """The agent side writes `Outcome` members: every status it may write is one's value."""
    assert set(typing.get_args(AgentStatus)) < set(Outcome)
    assert _result(status=Outcome.TIMEOUT).status == "timeout"


def test_sign_verify_roundtrip_and_tamper():
    signed = sign_result(_result(), KEY)
    verify_result(decode_result(encode_result(signed)), KEY)
    tampered = signed.model_copy(update={"rewards": 2.0})
    with pytest.raises(ContractError, match="signature does not match"):
        verify_result(tampered, KEY)
    with pytest.raises(ContractError):
        verify_result(signed, "another-key-of-enough-length")


def test_canonical_encoding_is_order_independent():
    a = _result(metrics={"x": 1.0, "y": 2.0})
    b = _result(metrics={"y": 2.0, "x": 1.0})
    assert encode_result(sign_result(a, KEY)) == encode_result(sign_result(b, KEY))


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"\xff\xfe", "not valid JSON"),
        (b"[1, 2]", "result object"),
        (json.dumps({"v": 2}).encode(), "schema version 2"),
        (json.dumps({"v": 1, "exp_id": "e"}).encode(), "Field required"),
        (b" " * 2000, "over the 1024 limit"),
    ],
)
def test_bad_result_objects(body, message):
    with pytest.raises(ContractError, match=message) as info:
        decode_result(body, max_bytes=1024)
    assert "\n" not in str(info.value)


def test_rewards_forms_and_scalar():
    assert scalar_reward(0.5) == 0.5
    assert scalar_reward([0.1, 0.2, 0.3]) == pytest.approx(0.6)
    named = NamedRewards(components={"correct": 1.0, "format": 0.2}, scalar="correct")
    assert scalar_reward(named) == 1.0
    assert _result(rewards=named).scalar_reward() == 1.0
    with pytest.raises(ValueError, match="not one of the components"):
        NamedRewards(components={"a": 1.0}, scalar="b")


def test_key_layout_roundtrip():
    key = result_key("rollouts/", "exp-1", 42, "abc")
    assert key == "rollouts/exp-1/00000042/abc.json"
    parsed = parse_result_key(key)
    assert (parsed.prefix, parsed.exp_id, parsed.step, parsed.request_id) == (
        "rollouts",
        "exp-1",
        42,
        "abc",
    )
    assert parsed.key == key
    assert parse_result_key(result_key("", "e", 1, "r")).prefix == ""
    for bad in ("rollouts/e/12/r.json", "rollouts/e/00000001/r.txt", "x.json"):
        with pytest.raises(ContractError, match="not a rollout result key"):
            parse_result_key(bad)


def test_split_payload():
    user, control = split_payload({"question": "1+1", "_rollout": _control()})
    assert user == {"question": "1+1"} and control.request_id == "r1"
    assert "sig_key" not in repr(control) and KEY not in repr(control)
    with pytest.raises(ContractError, match="no '_rollout'"):
        split_payload({"question": "x"})
    with pytest.raises(ContractError, match="schema version 9"):
        split_payload({"_rollout": _control(v=9)})
    with pytest.raises(ContractError, match="session_id"):
        split_payload({"_rollout": _control(session_id="short")})


def test_s3_event_keys_are_url_decoded_and_test_events_skipped():
    key = "rollouts/e x/00000001/r+1.json"
    event = {
        "Records": [
            {
                "eventSource": "aws:s3",
                "eventName": "ObjectCreated:Put",
                "s3": {"bucket": {"name": "b"}, "object": {"key": quote_plus(key), "size": 10}},
            },
            {
                "eventSource": "aws:s3",
                "eventName": "ObjectRemoved:Delete",
                "s3": {"bucket": {"name": "b"}, "object": {"key": "other"}},
            },
        ]
    }
    refs = parse_notification(json.dumps(event))
    assert [(r.bucket, r.key, r.size) for r in refs] == [("b", key, 10)]
    assert parse_notification(json.dumps({"Event": "s3:TestEvent", "Bucket": "b"})) == []


def test_direct_notification_and_garbage():
    direct = {"v": 1, "kind": "rollout_result", "bucket": "b", "key": "k", "extra": 1}
    assert [r.key for r in parse_notification(json.dumps(direct))] == ["k"]
    for body in (
        "nope",
        "[]",
        '{"hello": 1}',
        '{"Records": []}',
        '{"v": 2, "kind": "rollout_result"}',
    ):
        with pytest.raises(ContractError):
            parse_notification(body)


# --------------------------------------------------------------------------- finiteness

_NAN, _INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    "fields",
    [
        {"rewards": _NAN},
        {"rewards": -_INF},
        {"rewards": [0.5, _NAN]},
        {"rewards": {"components": {"a": _NAN}, "scalar": "a"}},
        {"metrics": {"turns": _NAN}},
    ],
)
def test_models_refuse_non_finite_rewards_and_metrics(fields):
    with pytest.raises(ValidationError, match="finite number"):
        _result(**fields)


def test_every_number_field_of_the_contract_is_finite():
    with pytest.raises(ValidationError, match="finite number"):
        Timings(received=1.0, finished=_INF)
    with pytest.raises(ValidationError, match="finite number"):
        NamedRewards(components={"a": _NAN}, scalar="a")
    bypassed = NamedRewards.model_construct(components={"a": _INF}, scalar="a")
    with pytest.raises(ValidationError, match="reward is inf"):  # the scalar is checked too
        _result(rewards=bypassed)


def test_per_step_rewards_whose_sum_overflows_are_refused():
    assert _result(rewards=[1e308, -1e308, 1e308]).scalar_reward() == 1e308
    with pytest.raises(ValidationError, match="sum of per-step rewards overflows to inf"):
        _result(rewards=[1e308, 1e308])
    with pytest.raises(ValidationError, match="overflows to -inf"):
        _result(rewards=[-1e308, -1e308])


def test_canonical_json_refuses_nan():
    with pytest.raises(ValueError, match="not JSON compliant"):
        canonical_json({"x": _NAN})


def _raw(**fields) -> bytes:
    """A result object as a hostile agent could write it: Python's json allows NaN."""
    return json.dumps(_result().model_dump(mode="json") | fields, separators=(",", ":")).encode()


def _nest(body: bytes, levels: int) -> bytes:
    """`body` with its trajectory's `x` nested `levels` arrays deep (json.dumps cannot)."""
    return body.replace(b'"x":0', b'"x":' + b"[" * levels + b"]" * levels)


@pytest.mark.parametrize(
    ("body", "message", "reason"),
    [
        (_raw(rewards=_NAN), "result object: rewards: non-finite number nan", "not_finite"),
        (
            _raw(rewards=[1.0, _INF]),
            "result object: rewards[1]: non-finite number inf",
            "not_finite",
        ),
        (
            _raw(rewards={"components": {"a": -_INF}, "scalar": "a"}),
            "result object: rewards.components.a: non-finite number -inf",
            "not_finite",
        ),
        (
            _raw(metrics={"turns": 7.5}).replace(b"7.5", b"1e999"),  # parses as inf
            "result object: metrics.turns: non-finite number inf",
            "not_finite",
        ),
        (
            _raw(rewards=[1e308, 1e308]),
            "result object: rewards: sum of per-step rewards overflows to inf",
            "not_finite",
        ),
        (
            _raw(trajectory={"m": ["\ud800"]}),
            "result object: trajectory.m[0]: invalid unicode (lone surrogate)",
            "not_json",
        ),
        (
            _nest(_raw(trajectory={"x": 0}), 70),
            # the object is level 1 and x level 3, so level MAX_DEPTH + 1 is MAX_DEPTH - 2 below x
            f"result object: trajectory.x{'[0]' * (MAX_DEPTH - 2)}: "
            f"nested deeper than {MAX_DEPTH} levels",
            "too_deep",
        ),
        (
            _nest(_raw(trajectory={"x": 0}), 10_000),
            "result object is nested too deeply to parse",
            "too_deep",
        ),
    ],
)
def test_decode_refuses_what_a_hostile_agent_writes_by_hand(body, message, reason):
    with pytest.raises(ContractError) as info:
        decode_result(body)
    assert str(info.value) == message and info.value.reason == reason


@pytest.mark.parametrize(
    ("value", "message", "reason"),
    [
        (_NAN, "(root): non-finite number nan", "not_finite"),
        ({"a": (1, {"b": -_INF})}, "a[1].b: non-finite number -inf", "not_finite"),
        (
            {"odd key\n": {"\ud800": 1}},
            "['odd key\\n']: key '\\ud800' is invalid unicode (lone surrogate)",
            "not_json",
        ),
        (
            _result(trajectory={"t": "\udfff"}),
            "trajectory.t: invalid unicode (lone surrogate)",
            "not_json",
        ),
    ],
)
def test_check_json_names_the_fault_and_where(value, message, reason):
    with pytest.raises(ContractError) as info:
        check_json(value)
    assert str(info.value) == message and info.value.reason == reason
    assert "\n" not in str(info.value)


def test_check_json_depth_limit_and_cycles():
    def nested(levels: int) -> list:
        value: list = []
        for _ in range(levels - 1):
            value = [value]
        return value

    check_json(nested(MAX_DEPTH))
    check_json({"ok": [1, True, None, "é", 2.5]})
    with pytest.raises(ContractError, match=f"nested deeper than {MAX_DEPTH} levels"):
        check_json(nested(MAX_DEPTH + 1))
    cycle: dict = {}
    cycle["self"] = cycle
    with pytest.raises(ContractError, match="nested deeper") as info:
        check_json(cycle)
    assert info.value.reason == "too_deep"


def test_control_block_must_be_finite_and_valid_unicode():
    with pytest.raises(ContractError, match="control block: deadline: non-finite number nan"):
        split_payload({"_rollout": _control(deadline=_NAN)})
    with pytest.raises(ContractError, match="input_id: invalid unicode") as info:
        split_payload({"_rollout": _control(input_id="q\ud800")})
    assert info.value.reason == "not_json"
