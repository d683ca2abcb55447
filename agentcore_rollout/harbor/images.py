"""A Harbor task's image: its environment (built, or its `docker_image`) plus a layer with the agent
wrapper and the chosen agent. The layer's Dockerfile is text here; building it is the CLI's or
the deploy's.

Two ways to the same layer: self-contained, installed with pip on the task's image (`deploy
--tasks`, for another architecture), or copying a wrapper venv and an agent install made once
(local builds), with pip where the copied venv does not run. docs/harbor.md#images-and-runtimes."""

from __future__ import annotations

from .agents import AGENT_ENV, ENVIRONMENT_ENV, HarborAgent
from .trusted import RECORD

VENV = "/opt/agentcore-rollout"
SOURCE = ("pyproject.toml", "README.md", "agentcore_rollout")
"""What the layer's build context holds: this package's source, installed with `[agent]`."""
ENVIRONMENT_REPOSITORY = "localhost/agentcore-rollout-harbor-env"
AGENT_REPOSITORY = "localhost/agentcore-rollout-harbor"
WRAPPER_REPOSITORY = "localhost/agentcore-rollout-harbor-wrapper"
INSTALL_REPOSITORY = "localhost/agentcore-rollout-harbor-install"
WRAPPER_SOURCE = "/opt/agentcore-rollout-source"
"""In the wrapper's image: the package's source, for a layer whose Python cannot use the venv."""

# `python3`, or the first of these found that is >= 3.11 and has venv and ensurepip.
_FIND_PYTHON = (
    "find_python() { for p in python3 python3.13 python3.12 python3.11; do "
    "command -v $p >/dev/null 2>&1 && $p -c 'import sys, venv, ensurepip; "
    "sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1 && { echo $p; return; }; done; }; "
)
_INSTALL_PYTHON = """\
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
"""
_PYTHON = f"""\
RUN {_FIND_PYTHON}\\
{_INSTALL_PYTHON}    "$py" -m venv {VENV}
"""


def environment_image(docker_image: str | None, environment: str) -> str:
    """The task's environment as an image: its `docker_image`, or the one built from its
    `environment/` and named by its environment id."""
    return docker_image or f"{ENVIRONMENT_REPOSITORY}:{environment}"


def agent_image(environment: str, agent: str) -> str:
    """The image a session of the environment's tasks runs: the environment and the layer."""
    return f"{AGENT_REPOSITORY}:{environment}-{agent}"


def wrapper_image() -> str:
    """The image holding the wrapper's venv and source, made once per build."""
    return f"{WRAPPER_REPOSITORY}:latest"


def install_image(agent: str) -> str:
    """The image holding `agent`'s install (its `shared` paths), made once per machine."""
    return f"{INSTALL_REPOSITORY}:{agent}"


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
{install}{_tail(agent, environment)}"""


def _tail(agent: HarborAgent, environment: str) -> str:
    """The layer's last lines: who it is, the image's record of what its verifier may trust
    (`trusted.RECORD`, once everything is installed), and the wrapper served."""
    return f"""\
ENV {AGENT_ENV}={agent.name} {ENVIRONMENT_ENV}={environment}
{RECORD}USER root
EXPOSE 8080
CMD ["{VENV}/bin/python", "-m", "agentcore_rollout.agent.serve", \\
     "agentcore_rollout.harbor.app:app", "--host", "0.0.0.0", "--port", "8080"]
"""


def wrapper_dockerfile(base: str) -> str:
    """The wrapper's image on `base` (the Debian base), its context `SOURCE`: the venv with
    the package and `[agent]` (pip and setuptools gone: a quarter less for each layer to
    copy), and its source (`WRAPPER_SOURCE`)."""
    return f"""\
FROM {base}
USER root
{_PYTHON}COPY pyproject.toml README.md {WRAPPER_SOURCE}/
COPY agentcore_rollout {WRAPPER_SOURCE}/agentcore_rollout
RUN {VENV}/bin/pip install --no-cache-dir --disable-pip-version-check -q \\
      "{WRAPPER_SOURCE}[agent]" \\
    && {VENV}/bin/pip uninstall -y -q --disable-pip-version-check pip setuptools
"""


def install_dockerfile(base: str, agent: HarborAgent) -> str:
    """The agent's install on `base` (the Debian base), for layers to copy its `shared`
    paths from: apart from the wrapper's image, so a change of the package's source does not
    install the agent again."""
    install = "".join(f"{line}\n" for line in agent.install)
    return f"FROM {base}\nUSER root\n{install}"


def copied_layer_dockerfile(
    base: str, agent: HarborAgent, environment: str, wrapper: str, installed: str | None = None
) -> str:
    """The layer on `base` copying the wrapper from `wrapper` (its image,
    `wrapper_dockerfile`) and the agent's `shared` paths from `installed` (its image,
    `install_dockerfile`); its context is empty. An agent with nothing `shared` is installed
    here, as `layer_dockerfile` does."""
    if agent.shared and installed is None:
        raise ValueError(f"agent {agent.name}'s install is copied: its image is needed")
    copies = "".join(f"COPY --from={installed} {path} {path}\n" for path in agent.shared)
    install = agent.runtime if agent.shared else agent.install
    lines = "".join(f"{line}\n" for line in install)
    return f"""\
FROM {base}
USER root
COPY --from={wrapper} {VENV} {VENV}
COPY --from={wrapper} {WRAPPER_SOURCE} /tmp/agentcore-rollout
{copies}{_USE_VENV}{lines}{_tail(agent, environment)}"""


# The copied venv, pointed at the image's python3 (its links replaced) and imported; where it
# cannot be, a venv of the image's python3 (installed where there is none, as `_PYTHON`) with
# the package installed from the copied source.
_USE_VENV = (
    f"RUN {_FIND_PYTHON}\\\n"
    '    py="$(find_python)"; \\\n'
    f'    if [ -n "$py" ] && rm -f {VENV}/bin/python {VENV}/bin/python3* {VENV}/pyvenv.cfg \\\n'
    f'       && "$py" -m venv --without-pip {VENV} \\\n'
    f"       && {VENV}/bin/python -c 'import agentcore_rollout.agent.serve, "
    "agentcore_rollout.harbor.app' 2>/dev/null; then \\\n"
    '      echo "agentcore-rollout: the wrapper\'s venv, on $("$py" --version)"; \\\n'
    "    else \\\n"
    f'      echo "agentcore-rollout: the copied venv does not run here: pip installs it"; \\\n'
    f"      rm -rf {VENV}; \\\n"
    f"{_INSTALL_PYTHON}"
    f'      "$py" -m venv {VENV} && {VENV}/bin/pip install --no-cache-dir \\\n'
    '        --disable-pip-version-check -q "/tmp/agentcore-rollout[agent]" || exit 1; \\\n'
    "    fi; \\\n"
    "    rm -rf /tmp/agentcore-rollout\n"
)
