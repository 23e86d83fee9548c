# Two commands do all the set-up; each creates the environment it needs on first use.
#   make demo   - the main job on the built-in example (build a broken assistant, show it, fix it)
#   make test   - the test suite
VENV ?= .venv
PIP_INSTALL = $(VENV)/bin/pip install --disable-pip-version-check -q -c constraints.txt

$(VENV)/.installed: pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PIP_INSTALL) torch==2.13.0 -e '.[dev]'
	touch $@

.PHONY: demo test
demo: $(VENV)/.installed
	$(VENV)/bin/ckpt-repair demo

test: $(VENV)/.installed
	$(VENV)/bin/python -m pytest
