# The two commands of the quickstart: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEVSTAMP := $(VENV)/.installed-dev
NATIVE := $(VENV)/.native

# One BLAS thread: the tests' and fits' matrices are small (at most tens of thousands of rows by
# tens of columns), where OpenBLAS's threads cost more than they gain, and on a busy machine their
# spinning made a least-squares fit's SVD twenty times slower (calibration --check: 218 s against
# 99 s). A value set in the environment wins.
export OPENBLAS_NUM_THREADS ?= 1

# The simulated validation suites are kept here between processes (simulator/validate/store.py,
# keyed by a digest of the package's and hardware_specs/'s files and the libraries' versions): `make test` simulates
# them once, in `regress`, and the test workers and the notebooks read them. A value set in the
# environment wins; an empty one keeps them in each process only.
export LLMSIM_VALIDATE_CACHE ?= $(CURDIR)/$(VENV)/validate-cache

.PHONY: demo test test-fast lint typecheck unit unit-fast notebooks regress bench bench-doc native clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip "setuptools>=77" wheel

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q -e .
	touch $@

$(DEVSTAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e ".[dev,ray]"
	touch $@

# The serving engine's inner loop compiled to C by mypyc, in place (setup.py; the modules are
# simulator/native.py's): the same results in about 0.6 of the CPU time. Rebuilt when a
# serving or metrics source changes; until then the sources run. Without a C compiler the
# build says so and the sources run; LLMSIM_PURE_PYTHON=1 skips it. --force: every module is
# compiled anew, so each is newer than its source (or, where its compile failed, older: then
# the sources run; simulator/native.py), even where mypyc's C did not change.
$(NATIVE): $(STAMP) setup.py simulator/native.py $(wildcard simulator/serving/*.py simulator/metrics/*.py)
	$(BIN)/python -m pip install -q "mypy>=1.10"
	$(BIN)/python setup.py -q build_ext --inplace --force --parallel 2 || echo "the build failed above"
	@$(BIN)/python -c "from simulator import native; print('serving engine:', native.status())"
	touch $@

native: $(NATIVE)

# The quickstart scenario: Llama-3.1-8B on one H100 under vLLM, 500 requests at 8/s.
demo: $(NATIVE)
	$(BIN)/llmsim run scenarios/quickstart.yaml

lint: $(DEVSTAMP)
	$(BIN)/ruff check simulator tests benchmarks tools
	$(BIN)/ruff format --check simulator tests benchmarks tools

typecheck: $(DEVSTAMP)
	$(BIN)/mypy

# The tests run on every core (pytest-xdist). The simulated validation suites come from
# LLMSIM_VALIDATE_CACHE when `regress` (or an earlier run of the same code) left them there.
PYTEST_WORKERS ?= auto
PYTEST_PARALLEL := -n $(PYTEST_WORKERS)

unit: $(DEVSTAMP) $(NATIVE)
	$(BIN)/python -m pytest -q $(PYTEST_PARALLEL)

# The tests less those marked slow (full refits and simulations of the bundled suites), for a
# quick run while developing; `make test` and CI run them all.
unit-fast: $(DEVSTAMP) $(NATIVE)
	$(BIN)/python -m pytest -q $(PYTEST_PARALLEL) -m "not slow"

# Every notebook, top to bottom (outputs are stripped in git; tests/test_notebooks.py checks).
notebooks: $(DEVSTAMP) $(NATIVE)
	cd notebooks && ../$(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_PARALLEL) --nbmake .

# The project's golden predictions (regress/golden.yaml), the validation suites' CI ceilings
# (simulator/validate/targets.yaml) and the validation tables of README.md and docs/validation.md
# (written by tools/readme_validation.py): a prediction that moves, an error that grows, or a
# table left stale fails.
regress: $(NATIVE)
	$(BIN)/llmsim regress regress/golden.yaml
	@# one validation run feeds both checks: the CI ceilings, and the tables in the README and
	@# docs/validation.md (tools/readme_validation.py) written from its figures
	$(BIN)/llmsim validate --check --json > $(VENV)/validate.json || \
		{ cat $(VENV)/validate.json; exit 1; }
	$(BIN)/python tools/readme_validation.py --check --from $(VENV)/validate.json

# `regress` first: its `llmsim validate` simulates the suites (a process each, on every core)
# that the unit tests then read instead of simulating them again in each worker.
test: lint typecheck regress unit notebooks

test-fast: lint typecheck unit-fast

# The tables of docs/speed.md, with the machine, its load and the Python they were measured on.
# The serving benchmark's 1,000,000-request run takes minutes: `make bench BENCH_SERVING=--million`.
BENCH_SERVING ?=
bench: $(NATIVE)
	$(BIN)/python benchmarks/bench_costmodel.py
	$(BIN)/python benchmarks/bench_startup.py
	$(BIN)/python benchmarks/bench_serving.py $(BENCH_SERVING)

# Rewrites docs/speed.md's table of the serving simulator's current figures on this machine
# (three runs of each case, the least CPU kept; a few minutes).
bench-doc: $(NATIVE)
	$(BIN)/python benchmarks/bench_serving.py --repeat 3 --write-doc docs/speed.md $(BENCH_SERVING)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
	find simulator -name '*.so' -delete -o -name '*.pyd' -delete
