# The two commands the README promises: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
SOURCES := setup.py $(shell find mqserver twisted -name '*.py' 2>/dev/null)
PYTEST_ARGS ?=

.PHONY: run test lint wheel-test docs clean bench-setup bench postgres-setup

# Strict editable mode links every file into a tree twistd can scan for
# plugins; the default (lenient) mode hides twisted/plugins from it.  Strict
# mode does not see new files, hence the dependency on every source file.
#
# Then what a wheel install has and an editable one lacks, for twistd's
# start-up (docs/performance.md, "Start-up"): bytecode of the linked sources
# (pip compiles a wheel's at install; without it, under PYTHONDONTWRITEBYTECODE,
# every start compiles mqserver again: about 0.1 s), and fresh twistd plugin
# caches (with a stale dropin.cache the next start imports every plugin
# module and writes the cache, if it can).  -P: not ./twisted/plugins.
$(VENV)/.installed: $(SOURCES)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,docs,analytics,postgres]' --config-settings editable_mode=strict
	$(BIN)/python -m compileall -q mqserver build/__editable__.*
	$(BIN)/python -P -c 'import twisted.plugins; from twisted.plugin import getCache; getCache(twisted.plugins)'
	touch $@

run: $(VENV)/.installed
	$(BIN)/twistd -n --pidfile= mqserver

# eventmq 0.3.13 for the eMQP interop tests (tests/integration/emqp/test_emqp_eventmq.py).
# Its own pins do not install on Python 3.11 (pyzmq 18.1 has no wheel, future
# 0.15 breaks at import), so it gets a venv of its own with pins that work and
# --no-deps.  If this fails the interop tests skip and say why.
EVENTMQ_VENV := .venv-eventmq
$(EVENTMQ_VENV)/.installed:
	-rm -rf $(EVENTMQ_VENV) && $(PYTHON) -m venv $(EVENTMQ_VENV) \
	  && $(EVENTMQ_VENV)/bin/python -m pip install -q pyzmq six monotonic==0.4 croniter==0.3.10 \
	     psutil==5.6.6 future==1.0.0 \
	  && $(EVENTMQ_VENV)/bin/python -m pip install -q --no-deps eventmq==0.3.13 \
	  && touch $@

test: $(VENV)/.installed $(EVENTMQ_VENV)/.installed
	$(BIN)/ruff check mqserver tests twisted setup.py bench contrib docs/_ext docs/conf.py
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The Sphinx site; warnings are errors so a broken reference fails here (and
# in tests/test_docs.py) rather than on a reader.
docs: $(VENV)/.installed
	$(BIN)/sphinx-build -W --keep-going -b html docs docs/_build/html

# The benchmark suite's peers (docs/performance.md): Debian's beanstalkd,
# redis-server, nats-server and rabbitmq-server, installed without their
# services running (the bench starts its own on loopback ports; `epmd -kill`
# stops the epmd that RabbitMQ's init script starts even to stop the node).
# `make bench` runs the whole suite.
BENCH_PEERS = beanstalkd redis-server nats-server rabbitmq-server
bench-setup:
	sudo=""; [ "$$(id -u)" -eq 0 ] || sudo="sudo"; \
	$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
	    $(BENCH_PEERS) && \
	{ $$sudo systemctl disable --now $(BENCH_PEERS) epmd.socket epmd 2>/dev/null || \
	  { for s in $(BENCH_PEERS); do $$sudo service $$s stop; done; $$sudo epmd -kill; } \
	    >/dev/null 2>&1 || true; }

# Debian's PostgreSQL server, for the --storage=postgres tests (.ci/run does
# the same): the tests start their own clusters on free loopback ports, as the
# postgres user when run as root, so the packaged service is stopped.
postgres-setup:
	sudo=""; [ "$$(id -u)" -eq 0 ] || sudo="sudo"; \
	$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
	    postgresql && \
	{ $$sudo systemctl disable --now postgresql 2>/dev/null || \
	  $$sudo service postgresql stop 2>/dev/null || true; }

bench: $(VENV)/.installed
	$(BIN)/python -m bench --markdown bench-latest.md --json bench-latest.json

wheel-test:
	$(BIN)/python -m tox

clean:
	rm -rf $(VENV) $(EVENTMQ_VENV) build dist *.egg-info .pytest_cache .hypothesis docs/_build
