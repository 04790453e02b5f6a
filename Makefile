# Every target installs what it needs into .venv itself.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# `--backend vllm` workers and their tests run from a venv of their own: vLLM's CPU build pins torch 2.13.0+cpu
# and transformers below 5.20, beside the torch 2.14.1 of $(VENV). GPU hosts (nvidia-smi lists a GPU) get vLLM itself.
VLLM_VENV := .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_EXTRA := $(if $(shell nvidia-smi -L 2>/dev/null | grep -m1 GPU),vllm-gpu,vllm)

.PHONY: install vllm demo test test-sessions test-faults test-vllm lint docs bench bench-vllm clean images test-deploy

# Each step says what it installs and how long it usually takes (an idle 2-core machine: about 3-4 minutes in
# all; 8-9 while other work shares the cores).
$(STAMP): pyproject.toml
	@echo "install 1/4: a Python 3.11 venv in $(VENV) (about 5 s)"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "install 2/4: the latest pip (about 10 s)"
	@$(BIN)/pip install --quiet --upgrade pip
	@# torch and torchvision pinned to the builds this machine carries; others resolve from PyPI.
	@echo "install 3/4: torch and torchvision (about 1.5 minutes)"
	@$(BIN)/pip install --quiet torch==2.14.1 torchvision==0.29.1
	@echo "install 4/4: fedqueue and its other dependencies (about 1 minute)"
	@$(BIN)/pip install --quiet -e '.[test]'
	@touch $(STAMP)
	@echo "installed: the fedqueue command is $(BIN)/fedqueue"

install: $(STAMP)

$(VLLM_STAMP): pyproject.toml
	test -x $(VLLM_BIN)/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/pip install --quiet --upgrade pip
	$(VLLM_BIN)/pip install --quiet -e '.[test,$(VLLM_EXTRA)]'
	# The CPU build's torchvision, torchaudio and torchcodec resolve to CUDA builds that cannot load beside a CPU
	# torch (and break `import transformers` models and vLLM's imports); LLM workers need none of them.
	if [ "$(VLLM_EXTRA)" = vllm ]; then $(VLLM_BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec; fi
	touch $(VLLM_STAMP)

vllm: $(VLLM_STAMP)

# Its last lines (from `fedqueue run`) say where the results are and which commands show them.
demo: $(STAMP)
	$(BIN)/fedqueue run examples/digits_fedavg.toml

test: $(STAMP) lint docs
	$(BIN)/python -m pytest -m "not faults and not sessions and not slow"

# Whole command sessions (fedqueue up / run / cancel / logs / Ctrl-C on a terminal, each starting and stopping
# local clusters) and the slowest real-worker runs: minutes, so apart from `make test`; `.ci/run` runs them after it.
test-sessions: $(STAMP)
	$(BIN)/python -m pytest -m "sessions or slow"

# Infrastructure faults with services each test starts, stops and limits (a store that refuses connections,
# a broker killed under a follower); minutes, so apart from `make test`; `.ci/run` runs them after it.
test-faults: $(STAMP)
	$(BIN)/python -m pytest -m faults

# The vLLM backend's tests, run by the vLLM venv's Python so the workers they start have vLLM; required here.
# Apart from `make test` (its venv's first build and the tests take about 4 minutes); `.ci/run` runs both.
test-vllm: $(VLLM_STAMP)
	FEDQUEUE_TEST_VLLM=required $(VLLM_BIN)/python -m pytest tests/llm/test_llm_vllm.py

# Lint, format and type checks; part of `make test`. mypy checks what [tool.mypy] files names in pyproject.toml:
# the package, the docs site's hooks and the tests.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The documentation site, into site/ (open site/index.html): --strict fails on a broken link or anchor, a page
# missing from the nav, and a run-config field or setting without a description (docs/hooks/reference.py).
# Not --quiet: it hides the warnings --strict fails on, and the build passes. Part of `make test`.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# About an hour on an idle 2-core machine (10 minutes of it bench-vllm, which builds the vLLM venv first, and
# about 15 the chaos soak); each timing benchmark first waits (up to 3 minutes) for other work to stop.
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
	$(BIN)/python bench/data_plane.py
	$(BIN)/python bench/state_writes.py
	$(MAKE) bench-vllm
	$(BIN)/python bench/chaos_soak.py

# fedqueue with the vLLM backend against bare vLLM offline, 512 prompts x 64 new tokens (about 8-10 minutes).
bench-vllm: $(VLLM_STAMP)
	$(VLLM_BIN)/python bench/llm_batch.py --vllm

# The compose stack's images with no container registry: Debian (debootstrap) imported into Docker,
# then redis, postgres, python and fedqueue images on it; a second run reuses what is built.
# Needs root, a running Docker engine and debootstrap.
images:
	bash images/build.sh

# The compose stack brought up for real from those images (not part of `make test`: several minutes).
test-deploy: $(STAMP)
	$(BIN)/python -m pytest -m deploy tests/project/test_compose_deploy.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) site fedqueue.db fedqueue.db-wal fedqueue.db-shm fedqueue.db-states
