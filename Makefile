# The two contracts: `make demo` runs the main job, `make test` runs the tests. Both create
# .venv and install what they need on a fresh machine (torch pinned to the 2.13.0 CPU wheel).
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow lint clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/agentrl run recipes/demo.yaml

test: $(STAMP)
	$(PY) -m pytest -q

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

clean:
	rm -rf runs .pytest_cache
