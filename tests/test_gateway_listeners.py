"""The gateway's two listeners, on the real wire: the agents' API (HTTPS with a certificate) and
the admin API apart (loopback, plain HTTP). No admin route is served where agents call, no
agent's key opens an admin route, the admin token serves no turn, and a client that verifies
the certificate against its CA takes a turn over TLS while one that does not trust it is
refused before anything is sampled."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import anthropic
import httpx
import openai
import pytest
import trustme

from agentcore_rollout import Outcome, RolloutEngine, RolloutRequest
from agentcore_rollout.gateway import Gateway, GatewayAdmin, GatewayError, SGLangBackend
from agentcore_rollout.local.config import LocalConfig
from agentcore_rollout.local.policy import CharRenderer, PolicyServer
from agentcore_rollout.local.stack import LocalStack

from .factories import flat_config

pytestmark = pytest.mark.component

ADMIN_ROUTES = [
    ("POST", "/admin/sessions"),
    ("POST", "/admin/sessions/x/finish"),
    ("DELETE", "/admin/sessions/x"),
    ("GET", "/admin/requests/r"),
    ("GET", "/admin/stats"),
]
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def tls_files(ca: trustme.CA, tmp_path: Path) -> dict[str, str]:
    """A server certificate for 127.0.0.1 (signed by `ca`) and its key, as PEM files."""
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_path, key_path = tmp_path / "gateway.pem", tmp_path / "gateway.key"
    for i, pem in enumerate(cert.cert_chain_pems):
        pem.write_to_path(str(cert_path), append=i > 0)
    cert.private_key_pem.write_to_path(str(key_path))
    return {"tls_cert": str(cert_path), "tls_key": str(key_path)}


@pytest.fixture
async def policy() -> AsyncIterator[PolicyServer]:
    async with PolicyServer(seed=3) as server:
        yield server


@pytest.fixture
async def gateway(policy: PolicyServer) -> AsyncIterator[Gateway]:
    async with Gateway(SGLangBackend(policy.url), CharRenderer(), host="0.0.0.0") as gw:
        yield gw


async def test_the_admin_api_has_a_loopback_listener_of_its_own(gateway: Gateway) -> None:
    """Agents may be served on every interface; the admin API stays on loopback, and its
    routes are not found where agents call, with the admin token or without."""
    assert gateway.url.startswith("http://0.0.0.0:")
    assert gateway.admin_url.startswith("http://127.0.0.1:") and gateway.admin_url != gateway.url
    agents = gateway.url.replace("0.0.0.0", "127.0.0.1")
    headers = {"Authorization": f"Bearer {gateway.admin_token}"}
    async with aiohttp.ClientSession() as http:
        for method, path in ADMIN_ROUTES:
            async with http.request(method, agents + path, json={}, headers=headers) as r:
                assert r.status == 404, (method, path)
                message = (await r.json())["error"]["message"]
            assert "/v1/chat/completions" in message and "/admin" not in message.split(":", 1)[1]
    assert len(gateway.sessions) == 0


async def test_a_session_key_opens_no_admin_route(gateway: Gateway) -> None:
    async with GatewayAdmin(gateway.admin_url, gateway.admin_token) as admin:
        session = await admin.create_session("r1")
    async with GatewayAdmin(gateway.admin_url, session.api_key) as agent:
        for call in (agent.stats(), agent.create_session("r2"), agent.finish_session("x")):
            with pytest.raises(GatewayError) as denied:
                await call
            assert denied.value.status == 401
    async with aiohttp.ClientSession() as http:
        x_api_key = {"x-api-key": session.api_key}
        async with http.get(f"{gateway.admin_url}/admin/stats", headers=x_api_key) as r:
            assert r.status == 401
        # and the agents' routes are not on the admin listener
        chat = {"model": "policy", "messages": HI}
        bearer = {"Authorization": f"Bearer {session.api_key}"}
        async with http.post(
            f"{gateway.admin_url}/v1/chat/completions", json=chat, headers=bearer
        ) as r:
            assert r.status == 404
            assert "/admin/sessions" in (await r.json())["error"]["message"]
    assert len(gateway.sessions) == 1


async def test_the_admin_token_serves_no_turn(gateway: Gateway) -> None:
    agents = gateway.url.replace("0.0.0.0", "127.0.0.1")
    token = gateway.admin_token
    async with openai.AsyncOpenAI(base_url=f"{agents}/v1", api_key=token, max_retries=0) as oa:
        with pytest.raises(openai.AuthenticationError):
            await oa.chat.completions.create(model="policy", messages=HI, max_tokens=4)  # type: ignore[arg-type]
        with pytest.raises(openai.AuthenticationError):
            await oa.models.list()
    async with anthropic.AsyncAnthropic(base_url=agents, api_key=token, max_retries=0) as an:
        with pytest.raises(anthropic.AuthenticationError):
            await an.messages.create(model="policy", messages=HI, max_tokens=4)  # type: ignore[arg-type]
    assert gateway.stats()["turns"] == 0


async def test_a_turn_over_tls_with_the_client_verifying_the_certificate(
    policy: PolicyServer, ca: trustme.CA, tls_files: dict[str, str]
) -> None:
    trusting = ssl.create_default_context()
    ca.configure_trust(trusting)
    async with (
        Gateway(SGLangBackend(policy.url), CharRenderer(), **tls_files) as gateway,
        GatewayAdmin(gateway.admin_url, gateway.admin_token) as admin,
    ):
        assert gateway.url.startswith("https://127.0.0.1:")
        assert gateway.admin_url.startswith("http://127.0.0.1:")  # loopback: no TLS
        session = await admin.create_session("tls")
        assert session.url == gateway.url  # what the engine hands the agent
        base = f"{session.url}/v1"
        async with (
            httpx.AsyncClient(verify=trusting) as http,
            openai.AsyncOpenAI(base_url=base, api_key=session.api_key, http_client=http) as oa,
        ):
            answer = await oa.chat.completions.create(model="policy", messages=HI, max_tokens=4)  # type: ignore[arg-type]
        assert answer.choices[0].message.content
        async with (
            anthropic.DefaultAsyncHttpxClient(verify=trusting) as http,
            anthropic.AsyncAnthropic(
                base_url=session.url, api_key=session.api_key, http_client=http
            ) as an,
        ):
            reply = await an.messages.create(model="policy", messages=HI, max_tokens=4)  # type: ignore[arg-type]
        assert reply.content
        # A client that does not trust the CA is refused in the handshake: nothing sampled.
        async with openai.AsyncOpenAI(base_url=base, api_key=session.api_key, max_retries=0) as x:
            with pytest.raises(openai.APIConnectionError) as refused:
                await x.chat.completions.create(model="policy", messages=HI, max_tokens=4)  # type: ignore[arg-type]
        assert "CERTIFICATE_VERIFY_FAILED" in str(refused.value.__cause__)
        trace = await admin.finish_session(session.session_id)
    assert trace["num_turns"] == 2


def test_tls_settings_are_checked_in_one_line(tls_files: dict[str, str], tmp_path: Path) -> None:
    backend, renderer = SGLangBackend("http://127.0.0.1:9"), CharRenderer()
    with pytest.raises(ValueError, match="both tls_cert and tls_key"):
        Gateway(backend, renderer, tls_cert=tls_files["tls_cert"])
    with pytest.raises(ValueError, match="TLS certificate") as unreadable:
        Gateway(backend, renderer, tls_cert=str(tmp_path / "missing.pem"), tls_key="k.pem")
    with pytest.raises(ValueError, match="TLS certificate") as mismatched:
        other = trustme.CA().issue_cert("127.0.0.1").private_key_pem
        other.write_to_path(str(tmp_path / "other.key"))
        Gateway(
            backend, renderer, tls_cert=tls_files["tls_cert"], tls_key=str(tmp_path / "other.key")
        )
    for error in (unreadable, mismatched):
        assert "\n" not in str(error.value)


@pytest.mark.e2e
async def test_the_local_stack_runs_rollouts_over_https(
    ca: trustme.CA, tls_files: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`local.gateway_tls_cert` and `gateway_tls_key`: the gateway's processes serve agents over
    HTTPS (the agents trust the CA through SSL_CERT_FILE), the engine calls their admin API."""
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    monkeypatch.setenv("SSL_CERT_FILE", str(ca_file))  # the in-process agents' httpx reads it
    config = LocalConfig(
        app="tests.agents.held:app",
        mode="in_process",
        policy_workers=1,
        bucket="tls",
        queue="tls",
        gateway_tls_cert=tls_files["tls_cert"],
        gateway_tls_key=tls_files["tls_key"],
    )
    requests = [RolloutRequest({"question": "What is 2 + 5?"}, f"q{i}", 0) for i in range(2)]
    async with LocalStack(config) as stack:
        [gateway] = stack.gateways
        assert gateway.url.startswith("https://127.0.0.1:")
        engine_config = stack.engine_config(flat_config(rollout_timeout=60.0))
        assert engine_config.gateway is not None
        assert engine_config.gateway.url == gateway.urls[1]
        assert gateway.urls[1].startswith("http://127.0.0.1:")
        async with RolloutEngine(engine_config) as engine:
            batch = await engine.rollout(requests)
    outcomes = batch.outcomes
    assert [o.outcome for o in outcomes] == [Outcome.OK] * 2, [o.error for o in outcomes]
    assert all(o.trace is not None and o.trace["num_turns"] == 1 for o in outcomes)


def test_a_local_stack_with_half_a_tls_setting_is_refused() -> None:
    with pytest.raises(ValueError, match="gateway_tls_cert and gateway_tls_key"):
        LocalConfig(gateway_tls_cert="cert.pem")
