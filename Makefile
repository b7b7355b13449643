# The two README commands. Each creates .venv and installs the project with the pins that work here.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The OpenFHE CKKS engine (bootstrapping) runs in its own CPython 3.10 worker: OpenFHE's wheel is
# built for 3.10 only (fhe/ckks/openfhe/engine.py says why it is not the whole project's Python).
PY310 ?= $(shell for p in $(HOME)/.pyenv/versions/3.10*/bin/python python3.10; do \
	$$p -c 'import sys; assert sys.version_info[:2] == (3, 10)' 2>/dev/null && echo $$p && break; done)
OPENFHE_VENV := .venv-openfhe
OPENFHE_STAMP := $(OPENFHE_VENV)/.installed

.PHONY: demo test lint install clean

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip "setuptools<80" wheel
	$(BIN)/pip install -q "torch==2.13.0" "numpy<2" "setuptools<80"
	$(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP)

$(OPENFHE_STAMP):
	@test -n "$(PY310)" || (echo "the OpenFHE engine needs Python 3.10 (python3.10 or pyenv); set PY310=..." && exit 1)
	test -d $(OPENFHE_VENV) || $(PY310) -m venv $(OPENFHE_VENV)
	$(OPENFHE_VENV)/bin/pip install -q "openfhe==1.6.1.0.22.4" "numpy<2"
	touch $(OPENFHE_STAMP)

install: $(STAMP) $(OPENFHE_STAMP)

demo: $(STAMP) $(OPENFHE_STAMP)
	$(BIN)/python scripts/demo.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: $(STAMP) $(OPENFHE_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) $(OPENFHE_VENV) runs
