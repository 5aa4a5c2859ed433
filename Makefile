# `make test` is the one command CI runs (.ci/run). Each target creates .venv when missing.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# On these machines the CPU wheel of torch 2.13.0 lies on disk; elsewhere override, e.g. TORCH=torch
TORCH ?= torch==2.13.0
EXTRAS ?= test

.PHONY: install test test-slow demo clean

$(VENV)/.installed: pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	touch $@

install: $(VENV)/.installed

test: $(VENV)/.installed
	$(PY) -m pytest -q

# the shipped models at work, offline (needs the `plot` extra for the PNG)
$(VENV)/.demo-installed: $(VENV)/.installed
	$(PY) -m pip install -q -e ".[plot,eval]"
	touch $@

demo: $(VENV)/.demo-installed
	$(PY) -m setdlm demo

test-slow: $(VENV)/.installed
	$(PY) -m pytest -q -m slow

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache
