# Each command creates the environment it needs on first use.
#   make demo       - the main job on the built-in example (build a broken assistant, show it, fix it)
#   make test       - the main test suite
#   make test-vllm  - the vLLM consumer tier (its own environment: vLLM's pins conflict with ModelOpt's)
VENV ?= .venv
VLLM_VENV ?= .venv-vllm
PIP_INSTALL = $(VENV)/bin/pip install --disable-pip-version-check -q -c constraints.txt

$(VENV)/.installed: pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PIP_INSTALL) torch==2.13.0 -e '.[dev]'
	touch $@

.PHONY: demo test test-vllm
demo: $(VENV)/.installed
	$(VENV)/bin/ckpt-repair demo

test: $(VENV)/.installed
	$(VENV)/bin/python -m pytest -m "not vllm and not web"

test-vllm: $(VENV)/.installed
	VLLM_VENV=$(abspath $(VLLM_VENV)) bash tools/vllm_env.sh
	test -x $(VLLM_VENV)/bin/python && test -f $(VLLM_VENV)/legacy/gemma4_mtp_0_24.py
	VLLM_VENV=$(abspath $(VLLM_VENV)) $(VENV)/bin/python -m pytest -m vllm tests/vllm
