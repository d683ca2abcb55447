"""What an agent's process (and a task's tests) may find in its environment: an allowlist, never
the wrapper's environment less a few names. A session's environment holds what the wrapper alone
needs (AWS credentials, endpoints) and whatever the launch passed on (trackers' tokens, a proxy's
password): a policy that can print its environment must find none of it.

Later sources win: the image's own ENV as its build recorded it, the session's basics, TLS trust
and credential-free proxies, the task's env, then what the wrapper sets; `DENIED` never comes
from the first two. The lists: docs/harbor.md#what-an-agent-is-given."""

from __future__ import annotations

import re
from collections.abc import Mapping

BASICS = frozenset({"PATH", "HOME", "LANG", "LANGUAGE", "TERM", "TZ", "USER", "TMPDIR"})
TLS = frozenset(
    {
        *("SSL_CERT_FILE", "SSL_CERT_DIR", "NODE_EXTRA_CA_CERTS", "REQUESTS_CA_BUNDLE"),
        *("CURL_CA_BUNDLE", "PIP_CERT", "GIT_SSL_CAINFO", "UV_NATIVE_TLS"),
    }
)
PROXIES = frozenset(
    {"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"}
    | {"http_proxy", "https_proxy", "all_proxy", "no_proxy"}
)
DENIED = (
    *("AWS_", "AGENTCORE_ROLLOUT_", "OTEL_", "WANDB_", "MLFLOW_", "GOOGLE_", "GCLOUD_"),
    *("CLOUDSDK_", "AZURE_", "ARM_", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "NEPTUNE_"),
    *("COMET_", "DD_", "SENTRY_", "LANGCHAIN_", "LANGSMITH_"),
)
"""Prefixes that never reach an agent from the image or the session: cloud credentials,
trackers' and collectors' tokens, the project's own variables."""
_USERINFO = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://[^/@]*@")


def denied(name: str) -> bool:
    upper = name.upper()
    return upper.startswith(DENIED) or "ENDPOINT_URL" in upper


def from_session(name: str, value: str) -> bool:
    """`name` is passed on from the session's environment (step 2)."""
    if denied(name):
        return False
    if name in PROXIES:
        return name.upper() == "NO_PROXY" or not _USERINFO.match(value)
    return name in BASICS or name in TLS or name.startswith("LC_")


def agent_env(
    environ: Mapping[str, str],
    image_env: Mapping[str, str] | None,
    task_env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Steps 1 to 3 for `environ` (the wrapper's), `image_env` (the recorded ENV; None: no
    record) and `task_env`; the wrapper adds step 4."""
    image = environ if image_env is None else image_env
    env = {k: v for k, v in image.items() if not denied(k)}
    if image_env is None:  # the session's stand-in for the image: only what step 2 allows of
        env = {k: v for k, v in env.items() if k not in PROXIES or from_session(k, v)}
    env.update({k: v for k, v in environ.items() if from_session(k, v)})
    env.update(task_env or {})
    return env
