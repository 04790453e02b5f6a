# Every target installs what it needs into .venv itself.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test lint bench clean images test-deploy

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch and torchvision pinned to the builds this machine carries; others resolve from PyPI.
	$(BIN)/pip install --quiet torch==2.14.1 torchvision==0.29.1
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/fedqueue run examples/digits_fedavg.toml

test: $(STAMP) lint
	$(BIN)/python -m pytest

# Lint, format and type checks; part of `make test`.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# About 35 minutes on an idle 2-core machine; each benchmark first waits (up to 3 minutes) for other work to stop.
bench: $(STAMP)
	$(BIN)/python bench/fl_round.py
	$(BIN)/python bench/overhead.py
	$(BIN)/python bench/scaling.py
	$(BIN)/python bench/llm_batch.py
	$(BIN)/python bench/packing.py
	$(BIN)/python bench/defaults.py
	$(BIN)/python bench/async_overhead.py
	$(BIN)/python bench/sync_vs_async.py
	$(BIN)/python bench/startup.py

# The compose stack's images with no container registry: Debian (debootstrap) imported into Docker,
# then redis, postgres, python and fedqueue images on it; a second run reuses what is built.
# Needs root, a running Docker engine and debootstrap.
images:
	bash images/build.sh

# The compose stack brought up for real from those images (not part of `make test`: several minutes).
test-deploy: $(STAMP)
	$(BIN)/python -m pytest -m deploy tests/test_compose_deploy.py

clean:
	rm -rf $(VENV) fedqueue.db fedqueue.db-wal fedqueue.db-shm
