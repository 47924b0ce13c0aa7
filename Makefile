# The README's two commands are `make demo` and `make test`; both set everything up first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build of torch is installed only when the venv has no torch yet, so a user who put
# their own CUDA torch in $(VENV) (or set TORCH_SPEC) keeps it.
TORCH_SPEC ?= torch==2.13.0
# DeepSpeed is the test oracle for the engine. Its sdist imports torch in setup.py, so it is built
# against the venv's torch (no build isolation, which would fetch a second, CUDA torch) and with
# DS_BUILD_OPS=0: its CPU ops are JIT-built on first use into TORCH_EXTENSIONS_DIR (kept in the venv).
DEEPSPEED_SPEC ?= deepspeed==0.19.8
export TORCH_EXTENSIONS_DIR ?= $(abspath $(VENV))/torch-extensions

.PHONY: setup demo test test-fast test-soak test-stability lint bench ds-ops
setup: $(VENV)/.installed

# DeepSpeed's CPU ops (shared-memory comm, CPU Adam), built once before the tests so no timed test
# pays the minutes of JIT compilation; a second run finds them in TORCH_EXTENSIONS_DIR.
ds-ops: $(VENV)/.ds-ops
$(VENV)/.ds-ops: $(VENV)/.installed
	DS_ACCELERATOR=cpu $(BIN)/python -c "from deepspeed.accelerator import get_accelerator as a; \
	[a().create_op_builder(n).load(verbose=False) for n in ('ShareMemCommBuilder', 'CPUAdamBuilder')]; \
	print('deepspeed CPU ops built in $(TORCH_EXTENSIONS_DIR)')"
	touch $@

# setup.py and agent/_seam.c: the agent's C seam is built in place by the editable install; an
# edit to either rebuilds it.
$(VENV)/.installed: pyproject.toml setup.py agent/_seam.c
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install "$(TORCH_SPEC)"
	$(BIN)/python -c "import deepspeed" 2>/dev/null || DS_BUILD_OPS=0 $(BIN)/pip install --no-build-isolation "$(DEEPSPEED_SPEC)"
	$(BIN)/pip install -e '.[dev]'
	$(BIN)/python -c "import torch, numpy, deepspeed; print('torch', torch.__version__, 'numpy', numpy.__version__, 'deepspeed', deepspeed.__version__)"
	$(BIN)/python -c "from zeroscope.agent import host_seam as s; print('agent seam:', 'C' if s.NATIVE else 'Python (agent/_seam.c not built)')"
	touch $@

demo: setup
	$(BIN)/zeroscope run --nproc-per-node 2 examples/train_gpt.py

# The layering contracts (pyproject.toml's [tool.importlinter]) are checked by import-linter over
# the package as installed (.ci/lint_imports.py says why it needs that).
lint: setup
	$(BIN)/python .ci/lint_imports.py
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy engine agent zeroscope

# Two pytest workers, a test module to each (`--dist loadfile`: a module's fixtures, which
# launch its reference jobs, run once): the suite alone leaves half of a 2-core machine idle
# (its launchers' single-threaded imports, its waits on jobs). docs/testing.md has the figures.
# PYTEST_WORKERS=0 runs it in one process.
PYTEST_WORKERS ?= 2
PYTEST_PARALLEL := $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile)

test: lint ds-ops
	$(BIN)/pytest $(PYTEST_PARALLEL) --durations=60

# For your own loop: lint, then everything but the slow end-to-end and fault tests.
test-fast: lint ds-ops
	$(BIN)/pytest $(PYTEST_PARALLEL) -m "not slow" -x -q

# The long tier: the tests marked soak (the pipeline tutorial at four stages on both engines),
# then the generated differential suite's soak: 300 generated models on both engines.
test-soak: ds-ops
	$(BIN)/pytest --soak -m soak --durations=10
	$(BIN)/python -m tests.differential.soak --count $(or $(SEEDS),300)

# Before calling an issue resolved: the end-to-end and fault tests STABILITY_RUNS times (10) in a
# row under a CPU load generator, stopping at the first failure (.ci/stability says how).
STABILITY_RUNS ?= 10
test-stability: ds-ops
	STABILITY_RUNS=$(STABILITY_RUNS) PYTEST=$(BIN)/pytest .ci/stability

bench: setup
	$(BIN)/python -m bench
