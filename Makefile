# Two entry points, each sets up .venv/ on a fresh machine first.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test bench docs clean

# uv installs what pip would, from pip's own configuration (scripts/install_env.py: 32 s instead of pip's
# 430 s on a loaded 2-core machine; pip if uv fails). No bytecode is compiled at install; then only what the
# platform imports is (scripts/warm_bytecode.py): compiling every file of every package took 66 of the
# 103 s of an idle pip install here, mostly modules nothing imports. The venv's own pip is not upgraded: it
# only installs uv and is uv's fallback (upgrading it was 3 of the 9 s before uv's install).
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet uv
	$(VENV)/bin/python scripts/install_env.py -e '.[dev]'
	env -u PYTHONDONTWRITEBYTECODE $(VENV)/bin/python scripts/warm_bytecode.py
	touch $(STAMP)

# Bytecode writing on (see test): a module the warm-up did not reach is compiled once, not per process.
demo: $(STAMP)
	env -u PYTHONDONTWRITEBYTECODE $(VENV)/bin/ladder demo

# Two workers, whole files each, started in tests/conftest.py's order (longest measured file first):
# xdist's default reorder (most tests first) started the few-test, long files last.
# PYTHONDONTWRITEBYTECODE (set on these machines) made each of the suite's hundreds of Python processes
# (CLI runs, Ray workers, ranks) compile the project's modules again: ~0.5 s of CPU each.
test: $(STAMP)
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff check .
	env -u PYTHONDONTWRITEBYTECODE $(VENV)/bin/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=25

bench: $(STAMP)
	$(VENV)/bin/python -m benchmarks --quick --json

# The documentation site from docs/ (MkDocs Material; the CLI reference is generated from the parsers),
# served with live reload. make test builds it with warnings as errors (tests/test_docs.py).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

clean:
	rm -rf $(VENV) runs/ site/ .pytest_cache
