"""What a process-mode agent of the local stack is given: an allowlist of its host's environment,
never all of it, as an agent on AgentCore is given its runtime's variables alone.

The stack's own process holds what no agent should read (trackers' and collectors' tokens, a
proxy's password, the user's cloud credentials, the project's admin tokens). The list:
docs/harbor.md#what-an-agent-is-given."""

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
