"""The AgentCore Runtime data plane as botocore's service model describes it: header names, error
shapes, request identity, signing, the payload's limit and the headers passed on to the
container. Everything a client can observe about the wire lives here, to be read beside
`botocore/data/bedrock-agentcore/*/service-2.json` (`tests/test_emulator_conformance.py`)."""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections.abc import Collection
from dataclasses import dataclass, field

from aiohttp import web

from ..runtimes.agentcore.published import MAX_PAYLOAD_BYTES, SESSION_HEADER

# Request and response headers (the model's `locationName`s).
USER_ID_HEADER = "X-Amzn-Bedrock-AgentCore-Runtime-User-Id"
CUSTOM_HEADER_PREFIX = "X-Amzn-Bedrock-AgentCore-Runtime-Custom-"
REQUEST_ID_HEADER = "x-amzn-RequestId"
ERROR_TYPE_HEADER = "x-amzn-ErrorType"
TRACE_ID_HEADER = "X-Amzn-Trace-Id"
# What the container is told the request id is (bedrock-agentcore's REQUEST_ID_HEADER).
CONTAINER_REQUEST_ID_HEADER = "X-Amzn-Bedrock-AgentCore-Runtime-Request-Id"
TRACE_HEADERS = ("X-Amzn-Trace-Id", "traceparent", "tracestate", "baggage")
MCP_HEADERS = ("Mcp-Session-Id", "Mcp-Protocol-Version", "Mcp-Method", "Mcp-Name")

# Request limits of the model (string `max`/`min`; the payload's, `published.MAX_PAYLOAD_BYTES`),
# checked as the service does: botocore only checks minimums, so a longer value reaches it.
SESSION_ID_LENGTH = (33, 256)
HEADER_LIMITS: dict[str, tuple[str, int, int]] = {  # header -> (member, min, max)
    "Content-Type": ("contentType", 1, 256),
    "Accept": ("accept", 1, 256),
    USER_ID_HEADER: ("runtimeUserId", 1, 1024),
    "X-Amzn-Trace-Id": ("traceId", 0, 128),
    "traceparent": ("traceParent", 0, 128),
    "tracestate": ("traceState", 0, 512),
    "baggage": ("baggage", 0, 8192),
    **{h: (h[0].lower() + h[1:].replace("-", ""), 1, 1024) for h in MCP_HEADERS},
}

DEFAULT_QUALIFIER = "DEFAULT"
SIGNING_NAME = "bedrock-agentcore"
RUNTIME_ARN = re.compile(  # partition, region, account, agent id
    r"arn:[a-z0-9-]+:bedrock-agentcore:[a-z0-9-]+:[0-9]{12}:runtime/[A-Za-z][A-Za-z0-9_-]*"
)
_AGENT_ID = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
_ACCOUNT_ID = re.compile(r"[0-9]{12}")
_CREDENTIAL = re.compile(
    r"Credential=[^/,\s]+/\d{8}/(?P<region>[^/]+)/(?P<service>[^/]+)/aws4_request"
)

# Error shapes: code -> HTTP status, from the model's `error.httpStatusCode`.
ERROR_STATUS: dict[str, int] = {
    "ValidationException": 400,
    "UnauthorizedException": 401,
    "ServiceQuotaExceededException": 402,
    "AccessDeniedException": 403,
    "ResourceNotFoundException": 404,
    "ConflictException": 409,
    "RetryableConflictException": 409,
    "ThrottlingException": 429,
    "RuntimeClientError": 424,
    "InternalServerException": 500,
    "UnknownOperationException": 404,  # not modelled: AWS front ends' answer to an unknown path
}


@dataclass
class ApiError(Exception):
    """An error the service answers with: its code, status and modelled members."""

    code: str
    message: str
    fields: list[tuple[str, str]] = field(default_factory=list)  # a ValidationException's

    def __post_init__(self) -> None:
        super().__init__(self.message)

    @property
    def status(self) -> int:
        return ERROR_STATUS[self.code]

    def response(self, request_id: str) -> web.Response:
        body: dict[str, object] = {"message": self.message}
        if self.code == "ValidationException":
            body["reason"] = "FieldValidationFailed"  # of the model's reasons, what every check is
            if self.fields:
                body["fieldList"] = [{"name": n, "message": m} for n, m in self.fields]
        return web.Response(
            body=json.dumps(body).encode(),
            status=self.status,
            content_type="application/json",
            headers={ERROR_TYPE_HEADER: self.code, REQUEST_ID_HEADER: request_id},
        )


def invalid(member: str, message: str) -> ApiError:
    """A ValidationException about one request member, with the modelled `fieldList`."""
    return ApiError("ValidationException", message, [(member, message)])


def new_request_id() -> str:
    return str(uuid.uuid4())


def new_trace_id() -> str:
    """An X-Ray trace header, as the service starts one when the caller sends none."""
    return f"Root=1-{int(time.time()):08x}-{os.urandom(12).hex()}"


def check_signed(request: web.Request, service: str = SIGNING_NAME) -> str:
    """The SigV4 signing region of `request`; AccessDeniedException if it is unsigned or signed
    for another service than `service`. Signatures are not verified: locally every caller signs
    with dummy credentials, and the point is that a client that would not sign fails here as on
    AWS."""
    auth = request.headers.get("Authorization", "")
    if not auth.startswith("AWS4-HMAC-SHA256 ") or not (
        request.headers.get("X-Amz-Date") or request.headers.get("Date")
    ):
        raise ApiError("AccessDeniedException", "Missing Authentication Token")
    m = _CREDENTIAL.search(auth)
    if m is None:
        raise ApiError("AccessDeniedException", "Authorization header is malformed")
    if m["service"] != service:
        raise ApiError(
            "AccessDeniedException",
            f"Credential should be scoped to correct service: '{service}'.",
        )
    return m["region"]


def resolve_runtime(
    identifier: str, account_id: str | None, region: str, known: Collection[str]
) -> str:
    """The ARN of the runtime a request names: a full ARN, or an agent id with `accountId` (the
    model allows both; the id is looked up in the signing region). ValidationException for
    neither, ResourceNotFoundException for a well-formed name no runtime has."""
    if identifier.startswith("arn:"):
        if account_id is not None:
            raise invalid("accountId", "accountId is only allowed with an agent runtime id")
        if not RUNTIME_ARN.fullmatch(identifier):
            raise invalid("agentRuntimeArn", f"Invalid agent runtime ARN: {identifier}")
        arn = identifier
    else:
        if account_id is None:
            raise invalid(
                "agentRuntimeArn",
                f"'{identifier}' is not an agent runtime ARN; "
                "an agent runtime id needs the accountId parameter",
            )
        if not _ACCOUNT_ID.fullmatch(account_id):
            raise invalid("accountId", "accountId must be 12 digits")
        if not _AGENT_ID.fullmatch(identifier):
            raise invalid("agentRuntimeArn", f"Invalid agent runtime id: {identifier}")
        arn = f"arn:aws:bedrock-agentcore:{region}:{account_id}:runtime/{identifier}"
    if arn not in known:
        raise ApiError("ResourceNotFoundException", f"No agent runtime found for {arn}")
    return arn


def check_headers(request: web.Request, *, invoke: bool) -> str:
    """The session id, after checking it and (for an invoke) the modelled headers' lengths."""
    sid = request.headers.get(SESSION_HEADER)
    lo, hi = SESSION_ID_LENGTH
    if sid is None or not lo <= len(sid) <= hi:
        raise invalid("runtimeSessionId", f"runtimeSessionId must be {lo}-{hi} characters")
    if invoke:
        for header, (member, lo, hi) in HEADER_LIMITS.items():
            value = request.headers.get(header)
            if value is not None and not lo <= len(value) <= hi:
                raise invalid(member, f"{member} must be {lo}-{hi} characters")
    return sid


async def read_payload(request: web.Request) -> bytes:
    """The body, up to the model's limit; an oversized one is read to the end (so the client,
    still sending, gets the answer) and refused as the service does."""
    declared = request.content_length
    if declared is None or declared <= MAX_PAYLOAD_BYTES:
        body = bytearray()
        async for chunk in request.content.iter_any():
            body += chunk
            if len(body) > MAX_PAYLOAD_BYTES:
                break
        else:
            return bytes(body)
    async for _ in request.content.iter_any():
        pass
    raise invalid("payload", f"payload must be at most {MAX_PAYLOAD_BYTES} bytes")


def container_headers(
    request: web.Request, session_id: str, request_id: str
) -> tuple[dict[str, str], dict[str, str]]:
    """(headers for the agent, headers echoed to the caller). The agent gets the session and
    request ids, the trace headers (a trace id is started if the caller sent none), the user
    id, custom headers, MCP headers, and Content-Type and Accept as sent; never the caller's
    signature."""
    src = request.headers
    trace = {h: src[h] for h in TRACE_HEADERS if h in src}
    trace.setdefault(TRACE_ID_HEADER, new_trace_id())
    headers = {
        SESSION_HEADER: session_id,
        CONTAINER_REQUEST_ID_HEADER: request_id,
        **trace,
        **{h: src[h] for h in (USER_ID_HEADER, *MCP_HEADERS, "Content-Type", "Accept") if h in src},
        **{k: v for k, v in src.items() if k.lower().startswith(CUSTOM_HEADER_PREFIX.lower())},
    }
    echoed = {SESSION_HEADER: session_id, **trace}
    return headers, echoed
