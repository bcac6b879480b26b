# Two commands do all set-up (see README):
#   make lab   — create .venv, install everything, open JupyterLab on notebooks/
#   make test  — same set-up when needed, then the whole test suite (on PYTEST_WORKERS
#                pytest-xdist workers; PYTEST_WORKERS=0 runs it in one process)
# torch is pinned and installed *before* the project so the project's torch>=… range is
# already satisfied (no multi-GB CUDA download on CPU machines).

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH  ?= torch==2.13.0
PYTEST_WORKERS ?= 2
ROOT_FLAG := $(shell [ "$$(id -u)" = "0" ] && echo --allow-root)

.PHONY: lab test setup clean-course exercises layers

# jupyter-events pulls in rfc3987-syntax (jsonschema[format-nongpl]), which builds ~35
# Earley parsers whenever jsonschema is imported: 2.4 s of CPU in every Ray worker, nbgrader
# command and Jupyter server on a 2-core laptop; nothing here checks IRIs (docs/developing.md)
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet -e ".[dev]"
	$(PY) -m pip uninstall --quiet --yes rfc3987-syntax
	touch $@

setup: $(VENV)/.installed

lab: $(VENV)/.installed
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks $(ROOT_FLAG)

test: $(VENV)/.installed
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadgroup

exercises: $(VENV)/.installed
	$(VENV)/bin/labkit course release

clean-course:
	rm -rf course/

# Redraw the picture of labkit's layers at the top of docs/developing.md from the import graph
layers: $(VENV)/.installed
	$(PY) tools/layers.py
