"""The engine's own SigV4 signer (`_sigv4`) and SQS's calls on the results path
(`QueueClient`), held to botocore: the same signature byte for byte, the same requests at the
wire, answers and errors read as botocore reads them; then through moto's real SQS."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any
from unittest import mock
from urllib.parse import quote

import pytest
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from aiohttp import web
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import ReadOnlyCredentials
from botocore.exceptions import ClientError

from agentcore_rollout._aws import AwsClients
from agentcore_rollout._sigv4 import SigV4
from agentcore_rollout._sqs import QueueClient

from .conftest import REGION, RUNTIME_ARN
from .wire_support import AUTH, Received, Reply, engine_at, recording_server, signature_holds

pytestmark = pytest.mark.component

NOW = datetime(2026, 11, 26, 23, 59, 59)
QUEUE = "http://127.0.0.1:9/000000000000/results"
RECEIPT = "AQEB+/Zm9v=="


def _botocores(url: str, path: str, headers: dict[str, str], body: bytes, creds: Any) -> dict:
    request = AWSRequest("POST", url + path, data=body, headers=dict(headers))
    with mock.patch("botocore.auth.get_current_datetime", return_value=NOW):
        SigV4Auth(creds, "bedrock-agentcore", REGION).add_auth(request)
    return dict(request.headers.items())


@pytest.mark.parametrize(
    ("url", "path", "token"),
    [
        ("http://127.0.0.1:8123", f"/runtimes/{quote(RUNTIME_ARN, safe='')}/invocations", "tok"),
        ("https://bedrock-agentcore.us-east-1.amazonaws.com", "/", None),
        ("https://HOST.example:443", "/a/./b//c/../d?z=1&a=%2F&a=0&flag", "tok"),
        ("http://[::1]:8080", "/~user/x%20y?qualifier=DEFAULT", None),
    ],
)
def test_the_signature_is_botocores_byte_for_byte(url: str, path: str, token: str | None) -> None:
    creds = ReadOnlyCredentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG", token)
    headers = {
        "Content-Type": "application/json",
        "X-Amzn-Bedrock-AgentCore-Runtime-Session-Id": "  s  " * 10,  # trimmed, squeezed
        "User-Agent": "agentcore-rollout",  # never signed
        "X-Amz-Target": "AmazonSQS.ReceiveMessage",
    }
    signer = SigV4("bedrock-agentcore", REGION, url)
    for body in (b'{"clientToken": "0f"}', b""):
        ours = signer.sign(creds, "POST", path, headers, body, NOW)
        assert ours == _botocores(url, path, headers, body, creds)
    # the day's signing key is kept; another day or secret signs anew, as botocore does
    rotated = ReadOnlyCredentials("AKIDEXAMPLE", "another-secret", token)
    later = datetime(2026, 11, 27, 0, 0, 1)
    ours = signer.sign(rotated, "POST", path, headers, b"{}", later)
    with mock.patch("botocore.auth.get_current_datetime", return_value=later):
        request = AWSRequest("POST", url + path, data=b"{}", headers=dict(headers))
        SigV4Auth(rotated, "bedrock-agentcore", REGION).add_auth(request)
    assert ours["Authorization"] == request.headers["Authorization"]


# ------------------------------------------------------------------ SQS at the wire

_ANSWERS: dict[str, dict[str, Any]] = {
    "ReceiveMessage": {
        "Messages": [
            {
                "MessageId": "m-1",
                "ReceiptHandle": RECEIPT,
                "MD5OfBody": "49f68a5c8493ec2c0bf489821c21fc3b",
                "Body": json.dumps({"Records": [{"eventSource": "aws:s3"}]}),
                "Attributes": {"ApproximateReceiveCount": "2"},
            }
        ]
    },
    "DeleteMessageBatch": {
        "Successful": [{"Id": "0"}],
        "Failed": [{"Id": "1", "SenderFault": True, "Code": "ReceiptHandleIsInvalid"}],
    },
    "ChangeMessageVisibilityBatch": {"Successful": [{"Id": "0"}, {"Id": "1"}]},
}


def _answer(req: Received) -> web.Response:
    operation = req.headers["X-Amz-Target"].removeprefix("AmazonSQS.")
    return web.json_response(_ANSWERS[operation], headers={"x-amzn-RequestId": "rid"})


@pytest.fixture
async def sqs_recorder() -> AsyncIterator[tuple[str, list[Received], list[Reply]]]:
    async with recording_server(_answer) as recording:
        yield recording


_CALLS: list[tuple[str, dict[str, Any]]] = [
    (
        "receive_message",
        {
            "QueueUrl": QUEUE,
            "MaxNumberOfMessages": 10,
            "WaitTimeSeconds": 20,
            "VisibilityTimeout": 60,
            "MessageSystemAttributeNames": ["ApproximateReceiveCount"],
        },
    ),
    (
        "delete_message_batch",
        {
            "QueueUrl": QUEUE,
            "Entries": [{"Id": "0", "ReceiptHandle": RECEIPT}, {"Id": "1", "ReceiptHandle": "x"}],
        },
    ),
    (
        "change_message_visibility_batch",
        {
            "QueueUrl": QUEUE,
            "Entries": [
                {"Id": "0", "ReceiptHandle": RECEIPT, "VisibilityTimeout": 0},
                {"Id": "1", "ReceiptHandle": "y", "VisibilityTimeout": 43200},
            ],
        },
    ),
]


def _botocore_sqs(url: str, attempts: int = 5) -> Any:
    config = AioConfig(retries={"mode": "standard", "total_max_attempts": attempts})
    return get_session().create_client("sqs", region_name=REGION, endpoint_url=url, config=config)


async def test_sqs_calls_are_botocores_requests_and_answers(sqs_recorder) -> None:
    url, received, _ = sqs_recorder
    theirs: list[dict[str, Any]] = []
    async with _botocore_sqs(url) as client:
        for method, params in _CALLS:
            answer = await getattr(client, method)(**params)
            answer.pop("ResponseMetadata")
            theirs.append(answer)
    async with AwsClients(engine_at(sqs=url, queue_url=QUEUE)) as clients:
        assert clients.queue is not None
        ours = [await getattr(clients.queue, method)(**params) for method, params in _CALLS]
        calls = dict(clients.api_calls)
    assert ours == theirs
    assert calls == {
        "sqs:ReceiveMessage": 1,
        "sqs:DeleteMessageBatch": 1,
        "sqs:ChangeMessageVisibilityBatch": 1,
    }
    modelled = ("Content-Type", "X-Amz-Target", "x-amzn-query-mode", "Host", "X-Amz-Security-Token")
    n = len(_CALLS)
    for their_request, our_request in zip(received[:n], received[n:], strict=True):
        assert (our_request.method, our_request.raw_path) == ("POST", their_request.raw_path)
        assert {h: our_request.headers.get(h) for h in modelled} == {
            h: their_request.headers.get(h) for h in modelled
        }
        assert json.loads(our_request.body) == json.loads(their_request.body)
        auth = AUTH.fullmatch(our_request.headers["Authorization"])
        assert auth is not None and (auth["service"], auth["region"]) == ("sqs", REGION)
        assert signature_holds(their_request) and signature_holds(our_request)
        assert not signature_holds(our_request, secret="not-the-secret")


def _error(status: int, body: bytes, query_error: str | None = None) -> Reply:
    headers = {"x-amzn-query-error": query_error} if query_error else {}
    return lambda _: web.Response(status=status, body=body, headers=headers)


@pytest.mark.parametrize(
    "reply",
    [
        _error(
            400,
            b'{"__type":"com.amazonaws.sqs#QueueDoesNotExist","message":"no such queue"}',
            "AWS.SimpleQueueService.NonExistentQueue;Sender",
        ),
        _error(400, b'{"__type":"com.amazon.coral.validate#ValidationException","message":"x"}'),
        _error(403, b'{"__type":"AccessDeniedException:http://internal/","Message":"denied"}'),
        _error(502, b"<html>Bad Gateway</html>"),
        _error(503, b""),
        _error(500, b"not json at all"),
    ],
)
async def test_sqs_errors_are_botocores_client_errors(sqs_recorder, reply: Reply) -> None:
    url, _, replies = sqs_recorder
    replies.append(reply)
    async with _botocore_sqs(url, attempts=1) as client:
        with pytest.raises(ClientError) as theirs:
            await client.receive_message(QueueUrl=QUEUE)
    replies.append(reply)
    async with AwsClients(engine_at(sqs=url, queue_url=QUEUE)) as clients:
        assert clients.sqs.meta.endpoint_url == url
        with pytest.raises(ClientError) as ours:
            await QueueClient(clients.queue._client, max_attempts=1).receive_message(QueueUrl=QUEUE)
    their_error = theirs.value.response["Error"]
    assert ours.value.response["Error"] == their_error
    assert ours.value.operation_name == theirs.value.operation_name == "ReceiveMessage"
    assert (
        ours.value.response["ResponseMetadata"]["HTTPStatusCode"]
        == (theirs.value.response["ResponseMetadata"]["HTTPStatusCode"])
    )


async def test_transient_sqs_answers_are_tried_again_and_others_are_not(sqs_recorder) -> None:
    url, received, replies = sqs_recorder
    throttled = _error(
        400,
        b'{"__type":"com.amazonaws.sqs#RequestThrottled","message":"slow down"}',
        "AWS.SimpleQueueService.RequestThrottled;Sender",
    )
    replies.extend([_error(503, b""), throttled])
    async with AwsClients(engine_at(sqs=url, queue_url=QUEUE)) as clients:
        assert clients.queue is not None
        answer = await clients.queue.delete_message_batch(**_CALLS[1][1])
        assert answer == _ANSWERS["DeleteMessageBatch"]
        assert clients.api_calls["sqs:DeleteMessageBatch"] == 3  # one per attempt
        replies.append(_error(400, b'{"__type":"com.amazonaws.sqs#InvalidAddress"}'))
        with pytest.raises(ClientError, match="InvalidAddress"):
            await clients.queue.receive_message(QueueUrl=QUEUE)
        assert clients.api_calls["sqs:ReceiveMessage"] == 1  # not transient: one attempt
        replies.extend([_error(500, b"")] * 5)
        with pytest.raises(ClientError, match=r"\(500\)"):
            await clients.queue.receive_message(QueueUrl=QUEUE)
        assert clients.api_calls["sqs:ReceiveMessage"] == 6  # five attempts, then the error
    assert len(received) == 9


# ------------------------------------------------------------------ through moto's SQS


async def test_the_queue_client_drives_motos_sqs(moto, channel) -> None:
    sqs = moto.client("sqs")
    for i in range(3):
        sqs.send_message(QueueUrl=channel.queue_url, MessageBody=json.dumps({"i": i}))
    cfg = engine_at(sqs=moto.url, queue_url=QUEUE)
    async with AwsClients(cfg) as clients:
        queue = clients.queue
        assert queue is not None
        got: list[dict[str, Any]] = []
        for _ in range(5):  # the bucket's s3:TestEvent is on the queue too
            answer = await queue.receive_message(
                QueueUrl=channel.queue_url,
                MaxNumberOfMessages=10,
                WaitTimeSeconds=1,
                MessageSystemAttributeNames=["ApproximateReceiveCount"],
            )
            got += answer.get("Messages", [])
            if len(got) >= 4:
                break
        bodies = sorted(json.loads(m["Body"]).get("i", -1) for m in got)
        assert bodies == [-1, 0, 1, 2]
        assert all(m["Attributes"]["ApproximateReceiveCount"] == "1" for m in got)
        entries = [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)]
        released = await queue.change_message_visibility_batch(
            QueueUrl=channel.queue_url, Entries=[e | {"VisibilityTimeout": 0} for e in entries[:1]]
        )
        assert [s["Id"] for s in released["Successful"]] == ["0"]
        again = await queue.receive_message(QueueUrl=channel.queue_url, WaitTimeSeconds=1)
        assert [m["MessageId"] for m in again["Messages"]] == [got[0]["MessageId"]]
        entries[0]["ReceiptHandle"] = again["Messages"][0]["ReceiptHandle"]
        deleted = await queue.delete_message_batch(
            QueueUrl=channel.queue_url, Entries=[*entries, {"Id": "x", "ReceiptHandle": "bogus"}]
        )
        assert sorted(s["Id"] for s in deleted["Successful"]) == ["0", "1", "2", "3"]
        assert [f["Id"] for f in deleted["Failed"]] == ["x"]
        with pytest.raises(ClientError) as missing:
            await queue.receive_message(QueueUrl=channel.queue_url + "-gone")
        assert missing.value.response["Error"]["Code"] == "AWS.SimpleQueueService.NonExistentQueue"
    attributes = sqs.get_queue_attributes(
        QueueUrl=channel.queue_url, AttributeNames=["ApproximateNumberOfMessages"]
    )["Attributes"]
    assert attributes["ApproximateNumberOfMessages"] == "0"
