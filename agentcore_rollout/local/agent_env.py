"""What a process-mode agent of the local stack (`agents.ProcessAgent`, one process per
session, as a microVM per session is on AWS) is given: an allowlist of its host's
environment, never all of it. The stack's own process holds what no agent should read (a
tracker's token, a collector's headers, a proxy's password, the user's cloud credentials,
the project's admin tokens); an agent on AgentCore is given its runtime's variables alone.

Passed on: the basics, TLS trust and credential-free proxies (`agent.allowlist`), what an
agent needs to write its result (the AWS region, credentials and endpoint URLs, as a session
container gets them: `agents.container_env`), Python's own (`PYTHON*`, `VIRTUAL_ENV`),
OpenTelemetry's settings but never its headers or client keys (the agent's spans join the
rollout's trace: `OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_SERVICE_NAME`, ...), and the emulator's
`env` (its configuration's, given explicitly)."""

from __future__ import annotations

from collections.abc import Mapping

from ..agent.allowlist import DENIED, from_session

AWS_NAMES = frozenset(
    {
        *("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"),
        *("AWS_SESSION_TOKEN", "AWS_CA_BUNDLE"),
    }
)
_OTEL_SECRETS = ("HEADERS", "CLIENT_KEY", "CLIENT_CERTIFICATE", "PASSWORD", "TOKEN")


def process_agent_env(environ: Mapping[str, str], given: Mapping[str, str]) -> dict[str, str]:
    """A process-mode agent's environment from its host's (`environ`) and the emulator's
    `env` (`given`, passed whole)."""
    env = {k: v for k, v in environ.items() if _passed(k, v)}
    return {**env, **given}


def _passed(name: str, value: str) -> bool:
    if name in AWS_NAMES or ("ENDPOINT_URL" in name and name.startswith("AWS_")):
        return True
    if name.startswith("OTEL_"):
        return not any(secret in name for secret in _OTEL_SECRETS)
    if name.startswith(("PYTHON", "VIRTUAL_ENV")) or name in ("HF_HOME", "XDG_CACHE_HOME"):
        return True
    return not name.startswith(DENIED) and from_session(name, value)
