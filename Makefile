# Each command creates the environment it needs on first use.
#   make demo       - the main job on the built-in example (build a broken assistant, show it, fix it)
#   make test       - the main test suite
#   make test-vllm  - the vLLM consumer tier (its own environment: vLLM's pins conflict with ModelOpt's)
#   make test-sglang - the SGLang consumer tier (its own environment: SGLang without its CUDA dependencies)
#   make test-web   - the web page in a real browser (its own environment: the CLI's light install plus the web extra)
VENV ?= .venv
VLLM_VENV ?= .venv-vllm
SGLANG_VENV ?= .venv-sglang
WEB_VENV ?= .venv-web
CHROMIUM ?= /usr/bin/chromium
PIP_INSTALL = $(VENV)/bin/pip install --disable-pip-version-check -q -c constraints.txt

$(VENV)/.installed: pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PIP_INSTALL) torch==2.13.0 -e '.[dev]'
	touch $@

# The web tier's environment is what `pip install 'ckpt-repair[web]'` gives a user (no ModelOpt, no transformers),
# plus the test tools; torch comes through constraints.txt as everywhere.
$(WEB_VENV)/.installed: pyproject.toml constraints.txt
	python3 -m venv $(WEB_VENV)
	$(WEB_VENV)/bin/pip install --disable-pip-version-check -q -c constraints.txt torch==2.13.0 -e '.[web-test]'
	touch $@

# Debian's chromium (Playwright drives it through executable_path; `playwright install` is never run).
$(CHROMIUM):
	apt-get update -q
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium

.PHONY: demo test test-vllm test-sglang test-web
demo: $(VENV)/.installed
	$(VENV)/bin/ckpt-repair demo

test: $(VENV)/.installed
	$(VENV)/bin/python -m pytest -m "not vllm and not sglang and not web"

test-vllm: $(VENV)/.installed
	VLLM_VENV=$(abspath $(VLLM_VENV)) bash tools/vllm_env.sh
	test -x $(VLLM_VENV)/bin/python && test -f $(VLLM_VENV)/legacy/gemma4_mtp_0_24.py
	VLLM_VENV=$(abspath $(VLLM_VENV)) $(VENV)/bin/python -m pytest -m vllm tests/vllm

# SGLANG_USE_CPU_ENGINE is cleared: it makes SGLang's loaders pad instead of failing (tools/sglang_runtime.py)
test-sglang: $(VENV)/.installed
	env -u SGLANG_USE_CPU_ENGINE SGLANG_VENV=$(abspath $(SGLANG_VENV)) bash tools/sglang_env.sh
	env -u SGLANG_USE_CPU_ENGINE SGLANG_VENV=$(abspath $(SGLANG_VENV)) $(VENV)/bin/python -m pytest -m sglang tests/sglang

test-web: $(WEB_VENV)/.installed $(CHROMIUM)
	CHROMIUM=$(CHROMIUM) $(WEB_VENV)/bin/python -m pytest -m web tests/web
