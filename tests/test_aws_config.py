"""AWS configuration that users already have keeps working, because every AWS call goes through
aiobotocore's clients: a CA bundle named in the AWS config file, a proxy with credentials (and
its password nowhere in what the engine writes when it refuses), the user's retry mode, endpoint
URLs from the environment, and credentials that expire and are refreshed.

Each case runs on the real wire: moto and the AgentCore emulator over loopback, behind a local
TLS relay signed by a local CA (trustme), or an HTTP proxy that wants a password, where it
needs one.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import ssl
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import trustme
import yaml
from botocore.exceptions import ClientError

from agentcore_rollout import Outcome, RolloutEngine, RolloutRequest
from agentcore_rollout._aws import AwsClients
from agentcore_rollout.config import ConfigError, ServiceUrls
from agentcore_rollout.local.moto import LOCAL_CREDENTIALS
from agentcore_rollout.local.relay import _pipe
from agentcore_rollout.runtimes.agentcore import AgentCoreRuntime
from agentcore_rollout.runtimes.base import SessionCallError

from .conftest import REGION, RUNTIME_ARN, engine_config
from .wire_support import engine_at, recording_server

pytestmark = pytest.mark.component

ROOT = Path(__file__).resolve().parent.parent
PASSWORD = "s3cretPW-4f7c"  # the proxy's password, which must appear in nothing the engine writes
ROLLOUTS = 3


@pytest.fixture
def aws_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[[str], None]:
    """No proxy, CA bundle or retry setting from the machine; an AWS config file of the test's
    own, empty until the test writes its `[default]` profile with the function returned."""
    for name in (
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "http_proxy",
        "https_proxy",
        "NO_PROXY",
        "no_proxy",
        "AWS_CA_BUNDLE",
        "AWS_RETRY_MODE",
        "AWS_MAX_ATTEMPTS",
        "AWS_PROFILE",
    ):
        monkeypatch.delenv(name, raising=False)
    config = tmp_path / "aws-config"
    config.write_text("[default]\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    return lambda profile: config.write_text(f"[default]\n{profile}\n")


def _service_urls(moto: Any, emu: Any) -> dict[str, str]:
    return {"s3": moto.url, "sqs": moto.url, "agentcore": emu.url}


async def _all_ok(cfg: Any) -> None:
    async with RolloutEngine(cfg) as engine:
        # new requests each time: an agent runs a request id once
        batch = await engine.rollout(
            [RolloutRequest({"a": i, "b": 2}, f"q{i}") for i in range(ROLLOUTS)]
        )
    assert [o.outcome for o in batch.outcomes] == [Outcome.OK] * ROLLOUTS, [
        o.error for o in batch.outcomes
    ]


@pytest.mark.unit
def test_no_module_of_the_package_signs_aws_requests() -> None:
    """AWS calls go through the SDK, which signs them; only the emulator reads a signature."""
    signing = re.compile(r"SigV4|botocore\.auth|AWS4-HMAC-SHA256|X-Amz-Date|aws4_request", re.I)
    package = ROOT / "agentcore_rollout"
    signs = [
        str(path.relative_to(ROOT))
        for path in package.rglob("*.py")
        if signing.search(path.read_text())
    ]
    assert signs == ["agentcore_rollout/local/wire.py"]


# ---------------------------------------------------------------- a CA bundle in ~/.aws/config


async def _relay(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    up_reader: asyncio.StreamReader,
    up_writer: asyncio.StreamWriter,
) -> None:
    """Both ways until both end, with the emulator's own pipe (`local.relay`)."""
    ends = (writer, up_writer)
    await asyncio.gather(_pipe(reader, up_writer, ends), _pipe(up_reader, writer, ends))
    for end in ends:
        end.close()


@asynccontextmanager
async def _tls_relay(upstream: str, ca: trustme.CA) -> AsyncIterator[str]:
    """An https:// URL whose TLS (a certificate for 127.0.0.1 from `ca`) ends here, the bytes
    relayed to the plain-HTTP `upstream`: a service behind TLS a local CA vouches for."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    target = urlsplit(upstream)

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(target.hostname, target.port)
        except OSError:
            writer.close()
            return

        await _relay(reader, writer, up_reader, up_writer)

    server = await asyncio.start_server(relay, "127.0.0.1", 0, ssl=context)
    try:
        yield f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


async def test_a_ca_bundle_in_the_aws_config_file_is_trusted(
    moto, channel, emulator, aws_config, tmp_path: Path
) -> None:
    emu = await emulator()
    ca = trustme.CA()
    bundle = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    async with _tls_relay(moto.url, ca) as aws, _tls_relay(emu.url, ca) as agentcore:
        cfg = engine_config(
            moto, channel, emu, service_urls={"s3": aws, "sqs": aws, "agentcore": agentcore}
        )
        # Not trusted yet: the engine says so in one line before it starts anything.
        with pytest.raises(ConfigError, match=r"cannot reach https://127\.0\.0\.1:\d+/?: SSL"):
            await RolloutEngine(cfg).start()
        aws_config(f"ca_bundle = {bundle}")
        await _all_ok(cfg)
    assert len(emu.sessions.started) == ROLLOUTS


# ---------------------------------------------------------------- a proxy with credentials


@asynccontextmanager
async def _proxy() -> AsyncIterator[int]:
    """An HTTP proxy on loopback that wants `bob` and `right` (Basic), else answers 407; yields
    its port. It tunnels CONNECT, and forwards a request in absolute form to its origin, then
    relays the connection both ways (a client keeps a connection through a proxy to one origin).
    """
    wanted = "Basic " + base64.b64encode(b"bob:right").decode()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        request_line, *lines = head.decode("latin-1").split("\r\n")
        method, target, version = request_line.split(" ")
        fields = dict(line.split(": ", 1) for line in lines if ": " in line)
        if fields.get("Proxy-Authorization") != wanted:
            writer.write(
                b"HTTP/1.1 407 Proxy Authentication Required\r\n"
                b"Proxy-Authenticate: Basic\r\nContent-Length: 0\r\n\r\n"
            )
            await writer.drain()
            writer.close()
            return
        origin = urlsplit(target if method != "CONNECT" else f"//{target}")
        up_reader, up_writer = await asyncio.open_connection(origin.hostname, origin.port)
        if method == "CONNECT":
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        else:
            path = origin.path + (f"?{origin.query}" if origin.query else "")
            kept = [line for line in lines if not line.startswith("Proxy-")]
            up_writer.write(f"{method} {path} {version}\r\n".encode() + "\r\n".join(kept).encode())
        await _relay(reader, writer, up_reader, up_writer)

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


async def test_a_proxy_with_credentials_carries_every_call(
    moto, channel, emulator, aws_config, monkeypatch: pytest.MonkeyPatch
) -> None:
    emu = await emulator()
    # The engine's service URLs by name, through the proxy; the (in-process) agents', which run
    # in AgentCore and not behind the trainer's proxy, by address, around it.
    by_name = {k: v.replace("127.0.0.1", "localhost") for k, v in _service_urls(moto, emu).items()}
    cfg = engine_config(moto, channel, emu, service_urls=by_name)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    async with _proxy() as port:
        monkeypatch.setenv("HTTP_PROXY", f"http://bob:right@127.0.0.1:{port}")
        await _all_ok(cfg)
        # The same run with a password the proxy refuses: every call went through it.
        monkeypatch.setenv("HTTP_PROXY", f"http://bob:{PASSWORD}@127.0.0.1:{port}")
        with pytest.raises(ConfigError) as refused:
            await RolloutEngine(cfg).start()
    assert "407" in str(refused.value) and PASSWORD not in str(refused.value)


async def test_a_proxy_refusing_a_tls_tunnel_is_a_refusal_that_started_nothing(
    aws_config, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with _proxy() as port:
        monkeypatch.setenv("HTTPS_PROXY", f"http://bob:{PASSWORD}@127.0.0.1:{port}")
        async with AwsClients(engine_at(agentcore="https://bedrock.example:443")) as clients:
            client = await clients.agentcore_in(REGION, "https://bedrock.example:443")
            with pytest.raises(SessionCallError) as caught:
                await AgentCoreRuntime(client, RUNTIME_ARN).invoke("s" * 40, b"{}")
    err = caught.value
    assert err.code == "ProxyConnectionError" and "refused" in str(err)
    assert (err.retryable, err.outage, err.maybe_started) == (False, False, False)
    assert PASSWORD not in str(err)


async def test_an_unreachable_proxy_is_an_unreachable_endpoint(
    aws_config, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", f"http://bob:{PASSWORD}@127.0.0.1:9")  # nothing listens
    async with AwsClients(engine_at()) as clients:
        client = await clients.agentcore_in(REGION, "https://bedrock.example:443")
        with pytest.raises(SessionCallError) as caught:
            await AgentCoreRuntime(client, RUNTIME_ARN).invoke("s" * 40, b"{}")
    err = caught.value
    assert err.code == "ProxyConnectionError" and PASSWORD not in str(err)
    assert (err.retryable, err.outage, err.maybe_started) == (True, True, False)


def _secret_forms() -> list[str]:
    return [PASSWORD, base64.b64encode(f"bob:{PASSWORD}".encode()).decode()]


@pytest.mark.e2e
async def test_a_refusing_proxy_leaves_its_password_in_no_file_and_no_log(
    moto, channel, emulator, aws_config, tmp_path: Path
) -> None:
    """`agentcore-rollout run`, AgentCore's calls through a proxy that refuses the password in
    its URL (S3 and SQS bypass it): each request ends `submit_failed` at once, naming the
    refusal; nothing was started or stopped at AgentCore, nothing was declared down; and the
    password is in no file of the run and no line of its log."""
    emu = await emulator()
    engine = engine_config(moto, channel, emu, exp_id="proxy").model_dump(mode="json")
    # The emulator by name, so NO_PROXY=127.0.0.1 sends S3 and SQS around the proxy.
    engine["service_urls"]["agentcore"] = emu.url.replace("127.0.0.1", "localhost")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"stack": "aws", "engine": engine}))
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"a": i, "b": 1}) + "\n" for i in range(4)))
    (tmp_path / "none.env").write_text("")
    out = tmp_path / "out"
    async with _proxy() as port:
        env = {
            **os.environ,
            **LOCAL_CREDENTIALS,
            "AWS_DEFAULT_REGION": REGION,
            "PYTHONPATH": str(ROOT),
            "HTTP_PROXY": f"http://bob:{PASSWORD}@127.0.0.1:{port}",
            "NO_PROXY": "127.0.0.1",
        }
        argv = ["--config", str(config), "--env-file", str(tmp_path / "none.env")]
        run = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "agentcore_rollout.cli", "run", *argv),
            *("--data", str(data), "--n", "1", "--out", str(out)),
            cwd=tmp_path,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        stdout, stderr = await asyncio.wait_for(run.communicate(), 120)
    log = stdout.decode() + stderr.decode()
    rows = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert [r["outcome"] for r in rows] == ["submit_failed"] * 4, log[-3000:]
    assert all("refused before reaching AgentCore" in r["error"] for r in rows), rows[0]
    assert emu.sessions.started == [] and emu.sessions.stopped == []
    assert "down for" not in log and "Traceback" not in log, log[-3000:]
    written = {p.name: p.read_text(errors="replace") for p in out.iterdir() if p.is_file()}
    assert {"rollouts.jsonl", "summary.json", "journal.jsonl"} <= written.keys()
    for secret in _secret_forms():
        assert secret not in log
        assert [name for name, text in written.items() if secret in text] == []


# ---------------------------------------------------------------- retries, endpoints, credentials


async def test_the_users_retry_mode_and_attempts_stand(
    aws_config, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with AwsClients(engine_at()) as clients:  # nothing set: standard, 5 attempts
        assert clients.sqs.meta.config.retries == {"mode": "standard", "total_max_attempts": 5}
        agentcore = await clients.agentcore_in(REGION, None)
        assert agentcore.meta.config.retries == {"mode": "standard", "total_max_attempts": 1}
    monkeypatch.setenv("AWS_RETRY_MODE", "adaptive")
    aws_config("max_attempts = 2")

    def unavailable(_: Any) -> Any:
        from aiohttp import web

        return web.Response(status=503, body=b"")

    async with (
        recording_server(unavailable) as (url, received, _),
        AwsClients(engine_at(sqs=url, queue_url=f"{url}/q")) as clients,
    ):
        assert clients.sqs.meta.config.retries == {"mode": "adaptive", "total_max_attempts": 2}
        with pytest.raises(ClientError, match="503"):
            await clients.sqs.receive_message(QueueUrl=f"{url}/q")
    assert len(received) == 2  # the profile's max_attempts, on the wire


async def test_the_users_app_id_is_in_every_calls_user_agent(
    aws_config, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SDK_UA_APP_ID", "rl-team-7")

    def empty(_: Any) -> Any:
        from aiohttp import web

        return web.json_response({})

    async with (
        recording_server(empty) as (url, received, _),
        AwsClients(engine_at(sqs=url, queue_url=f"{url}/q")) as clients,
    ):
        await clients.sqs.receive_message(QueueUrl=f"{url}/q")
    assert " app/rl-team-7" in received[0].headers["User-Agent"]


async def test_endpoint_urls_come_from_the_environment(
    moto, channel, emulator, aws_config, monkeypatch: pytest.MonkeyPatch
) -> None:
    emu = await emulator()
    monkeypatch.setenv("AWS_ENDPOINT_URL_SQS", moto.url)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto.url)
    monkeypatch.setenv("AWS_ENDPOINT_URL_BEDROCK_AGENTCORE", emu.url)
    cfg = engine_config(moto, channel, emu)
    cfg.service_urls = ServiceUrls()  # nothing in the engine's own config
    async with AwsClients(cfg) as clients:
        assert clients.sqs.meta.endpoint_url == moto.url
        assert (await clients.agentcore_in(REGION, None)).meta.endpoint_url == emu.url
    await _all_ok(cfg)
    assert len(emu.sessions.started) == ROLLOUTS


_CREDENTIAL_PROCESS = """\
import datetime, json, pathlib, sys
calls = pathlib.Path(sys.argv[1])
n = int(calls.read_text() or 0) + 1 if calls.exists() else 1
calls.write_text(str(n))
# The first answer has expired already; the SDK must ask again, and sign with the second.
ends = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=-1 if n == 1 else 1)
print(json.dumps({"Version": 1, "AccessKeyId": f"AKIDLOCAL{n}", "SecretAccessKey": "x",
                  "SessionToken": f"token{n}", "Expiration": ends.isoformat()}))
"""


async def test_credentials_that_expired_are_refreshed(
    moto, channel, emulator, aws_config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    emu = await emulator()
    script, calls = tmp_path / "credentials.py", tmp_path / "calls"
    script.write_text(_CREDENTIAL_PROCESS)
    aws_config(f"credential_process = {sys.executable} {script} {calls}")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)  # else the environment's would be used
    await _all_ok(engine_config(moto, channel, emu))
    # Asked once and answered expired, asked again (the in-process agents ask too).
    assert int(calls.read_text()) >= 2, "the expired credential was not refreshed"
    assert len(emu.sessions.started) == ROLLOUTS
