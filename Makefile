# Each target creates the environment it needs (a virtual environment in .venv) on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_ARGS ?=

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/trt-otel demo $(DEMO_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check trt_otel tests benchmarks
	$(BIN)/ruff format --check trt_otel tests benchmarks
	$(BIN)/mypy

test: lint
	$(BIN)/pytest -n auto

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis

bench: $(STAMP)
	$(BIN)/python benchmarks/eta_accuracy.py
	$(BIN)/python benchmarks/memory_and_replay.py
	$(BIN)/python benchmarks/callback_latency.py
	$(BIN)/python benchmarks/cpp_callback_cost.py
	$(BIN)/python benchmarks/callback_cost.py
	$(BIN)/python benchmarks/command_cost.py
