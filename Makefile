# gc_assets: every command creates the virtual environment first when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
SPARK_CLASSES := $(VENV)/share/gc_assets/spark-classes.jsa
DEMO_DIR ?= demo
MUTATION_CHILDREN ?= 2
## Test processes (pytest-xdist), one whole file each: a module's servers and tables are built once.
## Three on two cores: a test waits on its servers, subprocesses and Spark's scheduler often enough
## that two left 19 % of the CPU idle (docs/TEST_DURATIONS.md).
TEST_WORKERS ?= 3
TEST_RESULTS := .test-results

export DAGSTER_HOME := $(CURDIR)/.dagster_home
export PYSPARK_PYTHON := $(CURDIR)/$(BIN)/python
export SPARK_LOCAL_IP := 127.0.0.1

.PHONY: install demo test ui bench mutation clean

$(BIN)/.installed: pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --constraint requirements.lock --editable '.[test]'
	touch $@

## Azurite (the Azure Blob Storage emulator the tests start), pinned by emulators/package-lock.json.
emulators/node_modules/.installed: emulators/package.json emulators/package-lock.json
	npm ci --prefix emulators --no-audit --no-fund
	touch $@

## Spark's classes archived for local sessions to map at start (gc_assets/core/spark_classes.py):
## a cold session and its first jobs take seconds less.
$(SPARK_CLASSES): $(BIN)/.installed
	$(BIN)/python -m gc_assets.core.spark_classes

$(DAGSTER_HOME)/dagster.yaml: dagster.yaml
	mkdir -p $(DAGSTER_HOME)
	cp dagster.yaml $@

install: $(BIN)/.installed $(SPARK_CLASSES) $(DAGSTER_HOME)/dagster.yaml

## Build the demo lake and run the whole GC on it (dry run).
demo: install
	$(BIN)/gc-assets demo --dir $(DEMO_DIR)

## Lint and format check (ruff), then the whole test suite, heaviest files first (conftest.py), and the
## slowest files at the end (docs/TEST_DURATIONS.md). pytest's "no tests collected" (exit 5) is a failure.
test: install emulators/node_modules/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	@mkdir -p $(TEST_RESULTS)
	@$(BIN)/python -m pytest --numprocesses $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder \
		--junitxml=$(TEST_RESULTS)/junit.xml; status=$$?; \
	if [ -f $(TEST_RESULTS)/junit.xml ]; then $(BIN)/python -m gc_assets_tests.durations $(TEST_RESULTS)/junit.xml --top 12; fi; \
	if [ $$status -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi; \
	exit $$status

## Open the Dagster UI on the demo lake at http://127.0.0.1:3000
ui: demo
	GC_ASSETS_CONFIG=$(CURDIR)/$(DEMO_DIR)/gc.yaml GC_ASSETS_TRUST_LOCAL_MTIME=1 $(BIN)/dagster dev -w workspace.yaml -h 127.0.0.1 -p $(or $(UI_PORT),3000)

## Benchmark (docs/BENCHMARKS.md): 100 k and 1 M objects, Delta tables, the scaling plot.
bench: install
	$(BIN)/python -m pip install --quiet --constraint requirements.lock --editable '.[bench]'
	$(BIN)/python -m bench.run --json bench/results/results.json --plot docs/scaling.png

## Mutation testing of the safety core (docs/MUTATION.md): about a minute on 2 cores, not part of `test`.
## Starts from an empty mutants/; last line "mutation: killed K of N mutants (P%)"; fails below 90 %.
mutation: install
	$(BIN)/python -m pip install --quiet --constraint requirements.lock --editable '.[mutation]'
	rm -rf mutants
	HYPOTHESIS_PROFILE=ci $(BIN)/mutmut run --max-children $(MUTATION_CHILDREN)
	$(BIN)/python -m gc_assets_tests.mutation_summary --fail-under 90

clean:
	rm -rf $(VENV) $(DAGSTER_HOME) $(DEMO_DIR) .gc_state mutants emulators/node_modules $(TEST_RESULTS)
