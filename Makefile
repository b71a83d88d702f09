# Each target creates the environment it needs (a virtual environment in .venv) on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_ARGS ?=

.PHONY: demo check check-types check-units test lint docs bench soak clean phoenix

# The tests' modules are compiled (and their asserts rewritten by pytest) once, into __pycache__,
# not again in every worker and every process a test starts: a PYTHONDONTWRITEBYTECODE set in
# the environment makes each run compile them afresh (some 5 s of each worker's start).
unexport PYTHONDONTWRITEBYTECODE

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# Arize Phoenix, a real trace backend for tests/test_phoenix.py (skipped, saying so, without it),
# in a virtual environment of its own: some 850 MB of dependencies that are not trt-otel's.
# .ci/run makes it; `make test` does not, so that a developer's first run stays small.
PHOENIX_VENV := .venv-phoenix
PHOENIX_STAMP := $(PHOENIX_VENV)/.installed

$(PHOENIX_STAMP): tests/requirements-phoenix.txt
	$(PYTHON) -m venv $(PHOENIX_VENV)
	$(PHOENIX_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(PHOENIX_VENV)/bin/python -m pip install --quiet -r tests/requirements-phoenix.txt
	touch $(PHOENIX_STAMP)

phoenix: $(PHOENIX_STAMP)

# The quick start: a real TensorRT-RTX build (CPU-only, no GPU needed) of a generated residual
# net, 20-40 s, most of it one silent step of "Determining refit engines". Where TensorRT-RTX
# does not install (it needs Linux or Windows on x86-64), the simulator imitates that build.
DEMO_DIR := .demo
DEMO_MODEL := $(DEMO_DIR)/residual.onnx
DEMO_SHAPES := input:1x8x32x32,4x8x32x32,8x8x32x32

demo: $(STAMP)
	@mkdir -p $(DEMO_DIR)
	@$(BIN)/python -c 'import sys; from trt_otel.builder.onnx_models import write_quickstart_model; write_quickstart_model(sys.argv[1])' $(DEMO_MODEL)
	@if $(BIN)/python -c 'import tensorrt_rtx' 2>/dev/null; then \
		$(BIN)/trt-otel build $(DEMO_MODEL) -o $(DEMO_DIR)/residual.engine --backend tensorrt-rtx \
			--shapes $(DEMO_SHAPES) --journal $(DEMO_DIR)/residual.jsonl $(DEMO_ARGS); \
	else \
		echo "TensorRT-RTX does not install on $$(uname -sm) (it needs Linux or Windows on x86-64): the simulator imitates its build instead"; \
		$(BIN)/trt-otel demo --simulate tensorrt-rtx --model $(DEMO_MODEL) \
			--shapes $(DEMO_SHAPES) --journal $(DEMO_DIR)/residual.jsonl $(DEMO_ARGS); \
	fi

lint: $(STAMP)
	$(BIN)/ruff check trt_otel tests benchmarks
	$(BIN)/ruff format --check trt_otel tests benchmarks
	$(BIN)/mypy
	$(MKDOCS_BUILD)

# The reference in docs/ (mkdocs.yml): --strict makes a broken link or anchor, or a page left out
# of the navigation, an error.
# Not --quiet: it hides the warnings from the count that --strict fails on. (Material's notice
# about its successor is left out of the output.)
SITE_DIR := .site
MKDOCS_BUILD = NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir $(SITE_DIR)

docs: $(STAMP)
	$(MKDOCS_BUILD)

CORES := $(shell nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)

# The inner loop, in under a minute: ruff, mypy and the tests without the e2e mark (none starts a
# process or a peer or makes a real build: tests/conftest.py fails one that does).
# Two workers a core (at most 8): these tests wait too (a hung collector's timeout, a drip-fed
# answer's deadline); on 2 cores the unit tests took 58 s at one worker a core, 40 to 56 s at two
# (five runs), 44 s at three.
CHECK_WORKERS ?= $(shell n=$$(( 2 * $(CORES) )); echo $$(( n < 8 ? n : 8 )))

# mypy runs beside the tests, on a core of its own: it is one process, and the unit tests keep
# the cores busy only part of the time.
check: $(STAMP)
	$(BIN)/ruff check trt_otel tests benchmarks
	$(BIN)/ruff format --check trt_otel tests benchmarks
	@$(MAKE) --no-print-directory -j2 check-types check-units

check-types: $(STAMP)
	$(BIN)/mypy

check-units: $(STAMP)
	$(BIN)/pytest -n $(CHECK_WORKERS) -m "not e2e" -q

# --dist loadgroup: the tests of an xdist group run on one worker: the Ray tests around one Ray
# cluster, and the modules whose fixtures build (the C++ monitor, a real build) build once.
# Three workers a core (at most 16): the suite waits more than it computes (silent windows,
# scrape intervals, peers starting); at one worker a core it kept 2 cores 38% busy, at three 69%.
# --durations: the slowest tests, in every run's summary, where the suite's time goes.
TEST_WORKERS ?= $(shell n=$$(( 3 * $(CORES) )); echo $$(( n < 16 ? n : 16 )))

test: lint
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup --durations=25

clean:
	rm -rf $(VENV) $(PHOENIX_VENV) $(DEMO_DIR) $(SITE_DIR) .mypy_cache .pytest_cache .ruff_cache .hypothesis

bench: $(STAMP)
	$(BIN)/python benchmarks/eta_accuracy.py
	$(BIN)/python benchmarks/forecast.py
	$(BIN)/python benchmarks/deadline.py
	$(BIN)/python benchmarks/memory_and_replay.py
	$(BIN)/python benchmarks/callback_latency.py
	$(BIN)/python benchmarks/cpp_callback_cost.py
	$(BIN)/python benchmarks/run_recorder_cost.py
	$(BIN)/python benchmarks/callback_cost.py
	$(BIN)/python benchmarks/process_sampling_cost.py
	$(BIN)/python benchmarks/startup_cost.py
	$(BIN)/python benchmarks/cpp_build_wall.py
	$(BIN)/python benchmarks/projection_cost.py
	$(BIN)/python benchmarks/replay_profile.py
	$(BIN)/python benchmarks/command_cost.py
	$(BIN)/python benchmarks/against_release.py
	$(BIN)/python benchmarks/against_release_instructions.py

# A soak with faults (benchmarks/soak.py): real and simulated builds side by side, each with a
# fault injected from outside (kills, stops, Ctrl-C, a full disk, dead, dripping and redirecting
# sinks, hostile HTTP clients), each checked when it ends. Not a test: it prints a table and
# every finding (the suite runs each fault once, two builds at a time: tests/test_soak.py).
SOAK_MINUTES ?= 30
soak: $(STAMP)
	$(BIN)/python benchmarks/soak.py --minutes $(SOAK_MINUTES)
