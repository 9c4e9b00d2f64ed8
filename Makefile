# Set-up and entry points. `make demo` and `make test` each do all the set-up on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU wheel lies on this machine's disk; on a GPU box use e.g. TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
TORCH_SPEC ?= torch==2.13.0
MODEL ?= checkpoints/dexcoder-16l

.PHONY: install demo test test-all

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

install: $(VENV)/.installed

demo: install
	OMP_NUM_THREADS=1 $(VENV)/bin/dex-decode --model $(MODEL) --explorers 4 --max-new-tokens 48 --verify --humaneval 0

test: install
	$(PY) -m pytest -q

test-all: install
	$(PY) -m pytest -q -m ''
