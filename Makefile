# atroposlib developer commands. Every target creates .venv on demand.
#   make install     venv + torch==2.13.0 + the vLLM build this machine needs + atroposlib[all]
#   make test        install, prepare the bundled model, run the whole test suite (real vLLM included)
#   make quickstart  install, prepare the bundled model, run the default CPU training loop
#                    (BUDGET=170: a 170 s training budget instead of the config's 840 s)
#   make docs        install, then build the documentation site into site/ (mkdocs --strict, offline)
#   make bench-docs  rewrite the benchmark tables of docs/benchmarks.md and README.md from benchmarks/results/
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export WANDB_MODE ?= offline
export GRADIO_ANALYTICS_ENABLED ?= False
export VLLM_NO_USAGE_STATS ?= 1
export DO_NOT_TRACK ?= 1
# Material for MkDocs prints a banner about its successor on every build; keep the log to what matters.
export NO_MKDOCS_2_WARNING ?= 1
PYTEST_ARGS ?=
# make quickstart BUDGET=SECONDS: the training budget (trainer.max_train_seconds) of that run
BUDGET ?=

.PHONY: install test quickstart lint docs config-docs bench bench-docs clean-venv

$(VENV)/.installed: pyproject.toml scripts/install.sh
	bash scripts/install.sh $(VENV)
	touch $@

install: $(VENV)/.installed

# The bundled model is prepared before pytest starts (a 93 MB download the first time), so the
# tests that need it run on a fresh machine instead of building it mid-run.
test: install
	$(VENV)/bin/atropos-bundled-model
	$(PY) -m pytest $(PYTEST_ARGS)

quickstart: install
	$(VENV)/bin/atropos-bundled-model
	$(VENV)/bin/atropos-launch configs/quickstart-cpu.yaml $(if $(BUDGET),--set trainer.max_train_seconds=$(BUDGET))

lint: install
	$(VENV)/bin/ruff check .

docs: install
	$(VENV)/bin/mkdocs build --strict

# The configuration reference (also the site's Configuration page, generated on every docs build).
config-docs: install
	$(PY) -m atroposlib.envs.config_docs

bench: install
	$(PY) benchmarks/bench_api.py

# The published benchmark figures, regenerated from the result files (a test checks they match).
bench-docs: install
	$(PY) -m benchmarks.bench_docs

clean-venv:
	rm -rf $(VENV)
