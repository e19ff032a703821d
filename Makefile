# Two commands on a fresh machine: `make up` runs the system, `make test` runs the suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: up test chaos lint bench install clean chromium

install: $(STAMP)

# torch is pinned first so the dependency range never pulls a multi-GB CUDA build on CPU machines.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

up: $(STAMP)
	$(VENV)/bin/statefleet up

test: $(STAMP) chromium
	$(PY) -m pytest -q $(PYTEST_ARGS)

# tests/browser drive Debian's Chromium through Playwright: installed from the distribution when it is
# missing and we are root (never a downloaded browser build); otherwise those tests say how to get it.
chromium:
	@command -v chromium >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

# Fault-injection drills on whole stacks (~5 min); results in var/chaos/results.json,
# `python -m bench.reliability_table` turns them into docs/reliability.md's table.
chaos: $(STAMP)
	$(PY) -m pytest -q -m chaos tests/chaos $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) var .pytest_cache
