# `make run` and `make test` are the whole set-up on a fresh machine.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: run test test-fast bench check clean

# The pgserver wheel's PostgreSQL server, installed only when the system has no server binaries
# (PATH, /usr/lib/postgresql/*/bin) and no database URL is set (in the variable named $(1), if any).
ensure_server = if $(if $(1),[ -z "$${$(1):-}" ] &&) ! $(PY) -c 'from ias.pgcluster import find_bindir; find_bindir()' 2>/dev/null; then \
	echo "no PostgreSQL server binaries on this system: installing the pgserver wheel (pip install -e '.[embedded]')"; \
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[embedded]'; fi

# bubblewrap gives skills and MCP servers their sandbox (docs/skills.md, Sandbox): installed with apt-get when
# missing and we are root, else one line saying what to install (iAs then reports `sandbox: none`).
ensure_bwrap = if ! command -v bwrap >/dev/null 2>&1; then \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "bubblewrap (bwrap) is missing: installing it (apt-get install -y bubblewrap)"; \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null || \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; }; \
	else echo "bubblewrap (bwrap) is missing: install it (e.g. sudo apt-get install bubblewrap) for the full sandbox level"; fi; fi

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e .
	touch $(STAMP)

# The `qr` extra (segno) draws the WeChat login's QR code in the terminal; `make test` does not need it.
$(VENV)/.qr: $(STAMP)
	@$(PY) -m pip install --quiet --disable-pip-version-check -e '.[qr]' && touch $@ || \
		echo "could not install segno: WeChat login will show a link instead of a QR code"

# The `media` extra (cryptography) decrypts WeChat images and files; `make test` needs it (the media tests).
$(VENV)/.media: $(STAMP)
	@$(PY) -m pip install --quiet --disable-pip-version-check -e '.[media]' && touch $@ || \
		echo "could not install cryptography: WeChat images and files will be answered with a note"

# No LLM configured (environment or ias.env in the data directory) and a person at the terminal: `ias setup` first.
run: $(STAMP) $(VENV)/.qr $(VENV)/.media
	@$(ensure_bwrap)
	@$(call ensure_server,IAS_DATABASE_URL)
	@if [ -t 0 ] && $(PY) -c 'import sys; from ias.setup import needed; sys.exit(0 if needed() else 1)'; then \
		$(PY) ias.py setup || exit 1; fi
	$(PY) ias.py

test: $(STAMP) $(VENV)/.media
	@$(ensure_bwrap)
	@$(call ensure_server,IAS_TEST_DATABASE_URL)
	IAS_TEST_FAST= $(PY) -m unittest discover -s tests -t .

# The suite without the slow end-to-end and cluster tests (they skip themselves, naming this target), for
# the edit-test loop: its modules spread over a few processes, each with a database of its own
# (tests/parallel.py; JOBS=N to choose how many; a module that prints anything fails it). `make test`
# (and CI) run everything with unittest's discover.
JOBS ?= 3
test-fast: $(STAMP) $(VENV)/.media
	@$(ensure_bwrap)
	@$(call ensure_server,IAS_TEST_DATABASE_URL)
	IAS_TEST_FAST=1 $(PY) -m tests.parallel -j $(JOBS)

bench: $(STAMP) $(VENV)/.media
	@$(ensure_bwrap)
	@$(call ensure_server)
	-$(PY) -m pip install --quiet --disable-pip-version-check jsonschema   # baseline for the validator figure
	$(PY) bench/run.py

check: $(STAMP)
	$(PY) ias.py skills check

clean:
	rm -rf $(VENV) build *.egg-info
