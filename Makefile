# Claim Lab: two commands for a new user.
#   make lab    set up .venv, start the embedded PostgreSQL, open JupyterLab
#   make study  the same, opening the student copies (the exercises without their answers)
#   make test   set up .venv, run labkit's tests and nbval over every notebook
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.labkit-installed
NBVAL  := --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg
# Extra arguments for jupyter lab, e.g. make lab JUPYTER_ARGS="--no-browser --port 8899"
JUPYTER_ARGS ?=
# JupyterLab refuses to run as root unless told it may.
ROOT_FLAG := $(shell [ "$$(id -u)" = 0 ] && echo --allow-root)

.PHONY: setup lab study test test-unit test-notebooks server-stop doctor clean-labs

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "Claim Lab needs Python 3.10 or newer (found %s)" % sys.version.split()[0])'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	@touch $(STAMP)

setup: $(STAMP)

lab: setup
	@if [ -z "$$LABKIT_DSN" ] && [ -z "$$LABKIT_BACKEND" ]; then $(BIN)/labkit server start; fi
	$(BIN)/jupyter lab $(ROOT_FLAG) $(JUPYTER_ARGS) notebooks/00_start_here.ipynb

study: setup
	@if [ -z "$$LABKIT_DSN" ] && [ -z "$$LABKIT_BACKEND" ]; then $(BIN)/labkit server start; fi
	$(BIN)/jupyter lab $(ROOT_FLAG) $(JUPYTER_ARGS) student/01_one_lock_three_policies.ipynb

test: setup
	$(BIN)/pytest tests notebooks $(NBVAL)

test-unit: setup
	$(BIN)/pytest tests

test-notebooks: setup
	$(BIN)/pytest notebooks $(NBVAL)

doctor: setup
	$(BIN)/labkit doctor

server-stop: setup
	$(BIN)/labkit server stop

clean-labs: setup
	$(BIN)/labkit clean --schemas
