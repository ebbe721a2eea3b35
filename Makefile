# Two commands on a fresh machine: `make run` (the gateway on its embedded demo) and `make test`.
VENV ?= .venv
PYTHON ?= python3
BIN = $(VENV)/bin

.PHONY: install run test lint test-engine test-packaging test-agents fuzz-drift bench docs clean

$(BIN)/.installed: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $@

install: $(BIN)/.installed

run: install
	$(BIN)/gateway demo

test: install
	$(BIN)/pytest -q

# ruff over the code, mypy over the package (their settings: pyproject.toml); seconds, so CI runs it first.
lint: install
	$(BIN)/ruff check gateway tests bench scripts
	$(BIN)/mypy gateway

test-engine: install
	$(BIN)/pytest -q -m engine

# The wheel installed alone into a fresh venv, and docker-compose.yml's services run on loopback (~2 min).
test-packaging: install
	$(BIN)/pytest -q -m packaging

# The drift classifier's labelled-mutation fuzzer at length (make test runs 2,000 examples).
fuzz-drift: install
	FUZZ_DRIFT_EXAMPLES=$${FUZZ_DRIFT_EXAMPLES:-50000} $(BIN)/pytest -q tests/test_drift_fuzz.py

# Real agent CLIs (Codex, Claude Code, Qwen Code, OpenCode), pinned in tests/agents/package.json and
# installed there with npm, and the OpenAI Agents SDK (the `agents` extra), each running a session
# against the gateway on the demo's emulated lane.
test-agents: install
	npm install --prefix tests/agents --no-audit --no-fund --loglevel=error
	$(BIN)/pip install -q -e '.[agents]'
	$(BIN)/pytest -q -m agents tests/agents

# The docs site into site/ (strict: a broken link or a stale generated page fails).
docs: install
	$(BIN)/pip install -q -e '.[docs]'
	$(BIN)/python scripts/gen_docs.py --check
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

bench: install
	$(BIN)/python bench/overhead.py

clean:
	rm -rf $(VENV) var .pytest_cache site tests/agents/node_modules
