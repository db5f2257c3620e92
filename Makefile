# Claim Lab: two commands for a new user.
#   make lab    set up .venv, start the embedded PostgreSQL, open JupyterLab
#   make study  the same, opening the student copies (the exercises without their answers)
#               Both open working copies in work/ (git-ignored; `labkit workcopy` makes them):
#               running and saving a notebook never changes notebooks/ or student/.
#   make test   set up .venv, run labkit's tests and nbval over every notebook (on four
#               processes; TEST_JOBS=1 for one)
#               In layers: make test-fast (the tests that need no database server at all:
#               pytest -m "not server" tests), make test-unit (all of tests/; pytest -m server
#               tests for those that need PostgreSQL), make test-notebooks (nbval alone)
# For a training room on one machine (as root; README, "Running a training room"):
#   make hub        a JupyterHub for the room: TRAINEES=12 MODE=embedded|shared (shared: the
#                   admin DSN in LABKIT_DSN, exported in a root shell, not on a command line;
#                   a server that trusts this host is refused: UNSAFE_TRUSTING_SERVER=1 only for
#                   one no trainee can reach)
#   make test-hub   the room under load: every trainee runs notebooks 00, 01 and 03 at once
#                   (FOOTPRINT=FILE also writes what each trainee took, for `labkit hub plan`)
#   make hub-status who is where; make hub-clean removes the room's users, passwords, roles
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.labkit-installed
NBVAL  := --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg
# Extra arguments for jupyter lab, e.g. make lab JUPYTER_ARGS="--no-browser --port 8899"
JUPYTER_ARGS ?=
# JupyterLab refuses to run as root unless told it may.
ROOT_FLAG := $(shell [ "$$(id -u)" = 0 ] && echo --allow-root)

# The hub's environment: its own, built from a Python every trainee's user may run (a
# Python under /root, as pyenv installs it, is closed to them).
HUB_PYTHON ?= $(shell [ -x /usr/bin/python3 ] && echo /usr/bin/python3 || echo python3)
HUB_VENV   := .hubenv
HUB_STAMP  := $(HUB_VENV)/.labkit-installed
TRAINEES   ?= 8
MODE       ?= embedded
HUB_PORT   ?= 8000

.PHONY: setup lab study test test-unit test-fast test-notebooks server-stop doctor clean-labs hub test-hub hub-status hub-clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "Claim Lab needs Python 3.10 or newer (found %s)" % sys.version.split()[0])'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	@touch $(STAMP)

setup: $(STAMP)

$(HUB_STAMP): pyproject.toml
	@$(HUB_PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "the hub needs Python 3.10 or newer: make hub HUB_PYTHON=...")'
	$(HUB_PYTHON) -m venv $(HUB_VENV)
	$(HUB_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(HUB_VENV)/bin/python -m pip install --quiet -e ".[hub]"
	@touch $(HUB_STAMP)

hub: $(HUB_STAMP)
	$(HUB_VENV)/bin/labkit hub start --trainees $(TRAINEES) --mode $(MODE) --port $(HUB_PORT) $(if $(UNSAFE_TRUSTING_SERVER),--unsafe-trusting-server)

test-hub: $(HUB_STAMP)
	$(HUB_VENV)/bin/labkit hub loadtest --trainees $(TRAINEES) --mode $(MODE) $(if $(FOOTPRINT),--footprint-out $(FOOTPRINT))

hub-status: $(HUB_STAMP)
	$(HUB_VENV)/bin/labkit hub status

hub-clean: $(HUB_STAMP)
	$(HUB_VENV)/bin/labkit hub clean

# Before JupyterLab opens: the embedded server (unless LABKIT_DSN or LABKIT_BACKEND names
# another), and the working copies (a copy that exists is never written over).
define before_jupyter
	@if [ -z "$$LABKIT_DSN" ] && [ -z "$$LABKIT_BACKEND" ]; then $(BIN)/labkit server start; fi
	@$(BIN)/labkit workcopy
endef

lab: setup
	$(before_jupyter)
	$(BIN)/jupyter lab $(ROOT_FLAG) $(JUPYTER_ARGS) work/notebooks/00_start_here.ipynb

study: setup
	$(before_jupyter)
	$(BIN)/jupyter lab $(ROOT_FLAG) $(JUPYTER_ARGS) work/student/01_one_lock_three_policies.ipynb

# The suite runs on TEST_JOBS processes (pytest-xdist; a notebook's cells stay in order on one),
# each with an embedded server of its own. On a server given by LABKIT_DSN it runs on one:
# some tests end sessions and drop schemas across the server they run on.
# Four, even on two cores: most of a test's time is spent waiting (on locks, on timed jobs, on
# kernels and the browser), so four processes keep two cores busy where two left them half idle.
TEST_JOBS ?= $(if $(LABKIT_DSN),1,4)
# --no-loadscope-reorder keeps the order labkit's plugin collects in (its longest files first);
# by default xdist hands out the files with the most tests first, which leaves the long files
# with few tests (the browser checks, the torture runs) to run on alone at the end.
XDIST := $(if $(filter-out 0 1,$(TEST_JOBS)),-n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder,-p no:xdist)
# Where PYTHONDONTWRITEBYTECODE is set (CI sets it), Python never caches a compiled module, and
# every process compiles labkit again: the test workers, each notebook's kernel and the hundreds
# of worker processes the labs spawn. compileall writes the compiled files all the same (under a
# second); a module edited later is compiled afresh, as Python checks each file's date.
COMPILE := $(BIN)/python -m compileall -q labkit tests >/dev/null
test: setup
	@$(COMPILE)
	$(BIN)/pytest $(XDIST) tests notebooks $(NBVAL)

test-unit: setup
	@$(COMPILE)
	$(BIN)/pytest $(XDIST) tests

# The tests that need no database server (text, parsing, the timing model, lint, the data
# files' validators): they pass with none running and start none.
test-fast: setup
	@$(COMPILE)
	$(BIN)/pytest $(XDIST) -m "not server" tests

test-notebooks: setup
	@$(COMPILE)
	$(BIN)/pytest $(XDIST) notebooks $(NBVAL)

doctor: setup
	$(BIN)/labkit doctor

server-stop: setup
	$(BIN)/labkit server stop

clean-labs: setup
	$(BIN)/labkit clean --schemas
