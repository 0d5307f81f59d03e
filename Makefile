# Set-up and everyday commands. Every path installs torch first, pinned, so pip never swaps in a
# different (possibly multi-GB CUDA) build when it resolves the package's own dependencies.
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
BIN    := $(VENV)/bin

.PHONY: train test test-long test-integration test-slow test-e2e test-all lint docs bench bench-cpu bench-cpu-10m clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --no-compile "$(TORCH)"
	$(BIN)/python -m pip install --quiet --no-compile -e ".[dev]"
	@# byte-compiled on every core at once (pip compiles on one: 68 s against 52 s on 2 cores); it exits 1
	@# for the one file torch ships in Python 3.12 syntax (a test helper), which pip skips silently too
	$(BIN)/python -m compileall -q -j 0 $(VENV)/lib >/dev/null 2>&1 || true
	touch $@

train: $(BIN)/.installed  ## AdLoCo on the embedded default (this Python's standard library source)
	$(BIN)/adloco train

test: $(BIN)/.installed  ## the default tier: unit and in-process tests (no network; under 3 minutes on 2 cores)
	$(BIN)/python -m pytest -q -n 2 tests/unit -m "not long" --durations=10

test-long: $(BIN)/.installed  ## the unit tests marked long: whole runs trained again and again, in this process
	$(BIN)/python -m pytest -q -n 2 tests/unit -m long --durations=10

test-integration: $(BIN)/.installed  ## real torch.distributed processes on gloo, faults, elastic agents
	$(BIN)/python -m pytest -q -n 2 tests/integration -m "not slow" --durations=10

test-slow: $(BIN)/.installed  ## sixteen gloo processes against their in-process twins (about 15 minutes on 2 cores)
	$(BIN)/python -m pytest -q -n 1 tests/integration -m slow --durations=10

test-e2e: $(BIN)/.installed  ## the command line, the examples and the demo, in processes of their own
	$(BIN)/python -m pytest -q -n 2 tests/e2e --durations=10

test-all: test lint  ## every tier and lint, as CI runs them
	$(BIN)/python -m pytest -q -n 2 tests/unit tests/integration tests/e2e -m "long or ((integration or e2e) and not slow)" --durations=15

lint: $(BIN)/.installed  ## ruff and mypy
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples
	$(BIN)/mypy src

$(BIN)/.docs-installed: $(BIN)/.installed pyproject.toml
	$(BIN)/python -m pip install --quiet -e ".[dev,docs]"
	touch $@

docs: $(BIN)/.docs-installed  ## the documentation site into build/site (MkDocs, strict: a warning is an error)
	$(BIN)/ruff check docs
	$(BIN)/ruff format --check docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

bench: $(BIN)/.installed  ## engine overhead benchmark (see benchmarks/RESULTS.md)
	$(BIN)/python benchmarks/engine_overhead.py

bench-cpu: $(BIN)/.installed  ## the methods, tuned, and ablations over 3 seeds on 2 CPU cores (about an hour and a half)
	$(BIN)/adloco bench --config configs/bench-cpu.yaml --ablations no-adaptive,no-merge,no-switch --jobs 2

bench-cpu-10m: $(BIN)/.installed  ## the same four methods at their tuned settings on llama-10m, 2 seeds (about 80 minutes)
	$(BIN)/adloco bench --config configs/bench-cpu-10m.yaml --jobs 2

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache
