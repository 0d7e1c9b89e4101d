# `make run` and `make test` are the whole set-up on a fresh machine.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: run test bench check clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e .
	touch $(STAMP)

run: $(STAMP)
	$(PY) ias.py

test: $(STAMP)
	$(PY) -m unittest discover -s tests -t .

bench: $(STAMP)
	-$(PY) -m pip install --quiet --disable-pip-version-check jsonschema   # baseline for the validator figure
	$(PY) bench/run.py

check: $(STAMP)
	$(PY) ias.py skills check

clean:
	rm -rf $(VENV) build *.egg-info
