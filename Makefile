# specsweep: `make demo` and `make test` work on a fresh clone; they create the venvs they need.
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
SGLANG_VENV := .venv-sglang
PIP_FLAGS := -q --disable-pip-version-check
PYTEST_ARGS ?=
# Tests run in a random order, shuffled within each module and the modules among themselves (module fixtures,
# such as a Ray cluster, are set up once), as two pytest processes side by side: the Ray tests, one after
# another, and the rest (tests/split_run.py says why). It prints the seed first; replay an order with
# make test RANDOM_ORDER_SEED=<seed>
RANDOM_ORDER_SEED ?=

.PHONY: all venv sglang-venv browser demo test lint bench mutation mutation-sample clean

all: test

venv: $(VENV)/.installed
sglang-venv: $(SGLANG_VENV)/.installed

$(VENV)/.installed: requirements/dev.txt pyproject.toml
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install $(PIP_FLAGS) -r requirements/dev.txt
	$(VENV)/bin/pip install $(PIP_FLAGS) --no-deps --no-build-isolation -e .
	touch $@

# SGLang's own parser/resolver and benchmark client, without its GPU dependencies (see
# requirements/sglang-resolver.txt). The validator runs it in a subprocess.
$(SGLANG_VENV)/.installed: requirements/sglang-resolver.txt requirements/sglang.txt
	$(PY) -m venv $(SGLANG_VENV)
	$(SGLANG_VENV)/bin/pip install $(PIP_FLAGS) -r requirements/sglang-resolver.txt
	$(SGLANG_VENV)/bin/pip install $(PIP_FLAGS) --no-deps -r requirements/sglang.txt
	touch $@

demo: venv
	$(VENV)/bin/specsweep demo

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# Headless Chromium for the report test (Debian package; CI runs as root). Idempotent.
browser:
	@test -x /usr/bin/chromium || { apt-get update -q && apt-get install -y -q chromium; }

test: venv sglang-venv browser
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/python -m tests.split_run $(if $(RANDOM_ORDER_SEED),--seed=$(RANDOM_ORDER_SEED)) $(PYTEST_ARGS)

bench: venv sglang-venv
	$(VENV)/bin/python -m bench

# Mutation testing of the core modules ([tool.mutmut] in pyproject.toml; docs/testing.md has the score and
# the survivors). Hours on a small machine: MUTANTS narrows it to mutant names (a glob), e.g.
# make mutation MUTANTS='workers.load.generator.x__record__mutmut_*'
MUTANTS ?=
mutation: venv sglang-venv
	rm -rf mutants
	SPECSWEEP_SGLANG_PYTHON=$(abspath $(SGLANG_VENV))/bin/python $(VENV)/bin/mutmut run $(MUTANTS)
	$(VENV)/bin/mutmut results

# A seeded random sample of each module's mutants (PER_MODULE of each; MODULES narrows to some files of
# only_mutate), run at low priority, with each module's score and its one-sided 95% lower bound; mutants
# listed in tests/mutation_equivalent.txt leave the denominator (docs/testing.md says why each is equivalent).
PER_MODULE ?= 30
SEED ?= 32
MODULES ?=
mutation-sample: venv sglang-venv
	rm -rf mutants
	SPECSWEEP_SGLANG_PYTHON=$(abspath $(SGLANG_VENV))/bin/python nice $(VENV)/bin/python tests/mutation_sample.py \
		--per-module $(PER_MODULE) --seed $(SEED) --equivalent tests/mutation_equivalent.txt $(MODULES)

clean:
	rm -rf $(VENV) $(SGLANG_VENV) .pytest_cache .ruff_cache .hypothesis mutants
