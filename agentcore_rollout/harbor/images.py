"""A Harbor task's image: its environment (its `environment/Dockerfile` built, or its
`docker_image`) plus a layer with the agent wrapper and the chosen agent, one per distinct
environment and agent. The layer's Dockerfile is text here; building it is the CLI's
(`cli/harbor.py`) or the deploy's.

The layer keeps the environment's WORKDIR (the task's working directory, where the wrapper
starts the agent) and runs as root, as Harbor's agents do. The wrapper needs Python 3.11
(`tomllib`): the base's `python3` if it is new enough, else one installed with apt-get
(Debian, Ubuntu) or apk (Alpine); a base with neither fails its build in one line. The
wrapper's own venv (`VENV`) keeps its packages out of the task's Python."""

from __future__ import annotations

from .agents import AGENT_ENV, ENVIRONMENT_ENV, HarborAgent
from .trusted import RECORD

VENV = "/opt/agentcore-rollout"
SOURCE = ("pyproject.toml", "README.md", "agentcore_rollout")
"""What the layer's build context holds: this package's source, installed with `[agent]`."""
ENVIRONMENT_REPOSITORY = "localhost/agentcore-rollout-harbor-env"
AGENT_REPOSITORY = "localhost/agentcore-rollout-harbor"

# `python3`, or the first of these found that is >= 3.11 and has venv and ensurepip.
_FIND_PYTHON = (
    "find_python() { for p in python3 python3.13 python3.12 python3.11; do "
    "command -v $p >/dev/null 2>&1 && $p -c 'import sys, venv, ensurepip; "
    "sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1 && { echo $p; return; }; done; }; "
)
_PYTHON = f"""\
RUN {_FIND_PYTHON}\\
    if [ -z "$(find_python)" ]; then \\
      if command -v apt-get >/dev/null 2>&1; then \\
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \\
          --no-install-recommends python3 python3-venv ca-certificates >/dev/null \\
        && rm -rf /var/lib/apt/lists/*; \\
      elif command -v apk >/dev/null 2>&1; then apk add --no-cache -q python3 ca-certificates; \\
      fi; \\
    fi; \\
    py="$(find_python)"; \\
    if [ -z "$py" ]; then \\
      echo "agentcore-rollout: the task's image has no python3 >= 3.11 with venv, and neither \\
apt-get nor apk installed one: the agent wrapper cannot run in it" >&2; exit 1; \\
    fi; \\
    "$py" -m venv {VENV}
"""


def environment_image(docker_image: str | None, environment: str) -> str:
    """The task's environment as an image: its `docker_image`, or the one built from its
    `environment/` and named by its environment id."""
    return docker_image or f"{ENVIRONMENT_REPOSITORY}:{environment}"


def agent_image(environment: str, agent: str) -> str:
    """The image a session of the environment's tasks runs: the environment and the layer."""
    return f"{AGENT_REPOSITORY}:{environment}-{agent}"


def layer_dockerfile(base: str, agent: HarborAgent, environment: str) -> str:
    """The layer's Dockerfile on `base` (the environment's image), its context `SOURCE`."""
    install = "".join(f"{line}\n" for line in agent.install)
    return f"""\
FROM {base}
USER root
{_PYTHON}COPY pyproject.toml README.md /tmp/agentcore-rollout/
COPY agentcore_rollout /tmp/agentcore-rollout/agentcore_rollout
RUN {VENV}/bin/pip install --no-cache-dir --disable-pip-version-check -q \\
      "/tmp/agentcore-rollout[agent]" \\
    && rm -rf /tmp/agentcore-rollout
{install}ENV {AGENT_ENV}={agent.name} {ENVIRONMENT_ENV}={environment}
{RECORD}USER root
EXPOSE 8080
CMD ["{VENV}/bin/python", "-m", "agentcore_rollout.agent.serve", \\
     "agentcore_rollout.harbor.app:app", "--host", "0.0.0.0", "--port", "8080"]
"""
