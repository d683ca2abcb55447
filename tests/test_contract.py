"""Wire contract v1: schemas, key layout, signing, notifications; every bad input is one
ContractError with a one-line message."""

from __future__ import annotations

import json
from urllib.parse import quote_plus

import pytest

from agentcore_rollout.contract import (
    ContractError,
    NamedRewards,
    RolloutResult,
    Timings,
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
