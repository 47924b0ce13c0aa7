# The README's two commands are `make demo` and `make test`; both set everything up first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build of torch is installed only when the venv has no torch yet, so a user who put
# their own CUDA torch in $(VENV) (or set TORCH_SPEC) keeps it.
TORCH_SPEC ?= torch==2.13.0

.PHONY: setup demo test lint bench
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install "$(TORCH_SPEC)"
	$(BIN)/pip install -e '.[dev]'
	touch $@

demo: setup
	$(BIN)/zeroscope run --nproc-per-node 2 examples/train_gpt.py

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy engine agent zeroscope

test: lint
	$(BIN)/pytest

bench: setup
	$(BIN)/python -m bench
