# Two commands on a fresh machine: `make up` runs the system, `make test` runs the suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: up test chaos lint typecheck bench install clean ibverbs chromium espeak gpu-wheels

install: $(STAMP)

# torch is pinned first so the dependency range never pulls a multi-GB CUDA build on CPU machines.
# The Mooncake and wan (diffusers) extras are tested, not skipped: its wheel needs libibverbs.so.1, which the ibverbs target
# installs from Debian when it is missing and we are root; without apt (or root) the Mooncake test
# skips and says why.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev,mooncake,wan,webrtc,pipecat,livekit]' || $(PY) -m pip install -q -e '.[dev,wan,webrtc,pipecat,livekit]'
	@$(MAKE) --no-print-directory espeak
	@$(MAKE) --no-print-directory ibverbs
	touch $(STAMP)

ibverbs:
	@if ldconfig -p 2>/dev/null | grep -q 'libibverbs.so.1 '; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		(apt-get install -y -q --no-install-recommends libibverbs1 >/dev/null 2>&1 || \
		 (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends libibverbs1 >/dev/null 2>&1)) || \
		echo "note: could not install libibverbs1; the Mooncake test will skip"; \
	else echo "note: libibverbs1 missing and apt-get unavailable (or not root); the Mooncake test will skip"; fi

up: $(STAMP)
	$(VENV)/bin/statefleet up

test: $(STAMP) chromium
	$(PY) -m pytest -q $(PYTEST_ARGS)

# The text avatar speaks with Debian's espeak-ng (GPL-3.0-or-later, run as a separate program: see
# docs/decisions.md), installed from the distribution when missing and we are root; without it the
# avatar keeps its built-in tone voice and its speech test says how to get it.
espeak:
	@command -v espeak-ng >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null || \
		(apt-get install -y -q --no-install-recommends espeak-ng >/dev/null 2>&1 || \
		 (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends espeak-ng >/dev/null 2>&1)) || \
		echo "note: could not install espeak-ng; the text avatar keeps its tone voice"

# tests/browser drive Debian's Chromium through Playwright: installed from the distribution when it is
# missing and we are root (never a downloaded browser build); otherwise those tests say how to get it.
chromium:
	@command -v chromium >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

# Fault-injection drills on whole stacks (~5 min); results in var/chaos/results.json,
# `python -m bench.reliability_table` turns them into docs/reliability.md's table.
chaos: $(STAMP)
	$(PY) -m pytest -q -m chaos tests/chaos $(PYTEST_ARGS)

# Wheels for the lent GPU machine (Python 3.12, no package index there): bench/gpu_device.sh installs them.
gpu-wheels: $(STAMP)
	$(PY) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
		--platform manylinux1_x86_64 -d .whl -r bench/gpu_wheels.txt

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# mypy, configured in pyproject.toml: strict on libs/ and placement, basic elsewhere.
typecheck: $(STAMP)
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) var .pytest_cache
