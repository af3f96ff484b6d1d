# The two commands the README promises: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
SOURCES := setup.py $(shell find mqserver twisted -name '*.py' 2>/dev/null)
PYTEST_ARGS ?=

.PHONY: run test lint wheel-test clean

# Strict editable mode links every file into a tree twistd can scan for
# plugins; the default (lenient) mode hides twisted/plugins from it.  Strict
# mode does not see new files, hence the dependency on every source file.
$(VENV)/.installed: $(SOURCES)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]' --config-settings editable_mode=strict
	touch $@

run: $(VENV)/.installed
	$(BIN)/twistd -n --pidfile= mqserver

test: $(VENV)/.installed
	$(BIN)/ruff check mqserver tests twisted setup.py bench contrib
	$(BIN)/python -m pytest $(PYTEST_ARGS)

wheel-test:
	$(BIN)/python -m tox

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .hypothesis
