# Two commands on a fresh machine: `make run` (the gateway on its embedded demo) and `make test`.
VENV ?= .venv
PYTHON ?= python3
BIN = $(VENV)/bin

.PHONY: install run test test-engine test-packaging bench clean

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

test-engine: install
	$(BIN)/pytest -q -m engine

# The wheel installed alone into a fresh venv, and docker-compose.yml's services run on loopback (~2 min).
test-packaging: install
	$(BIN)/pytest -q -m packaging

bench: install
	$(BIN)/python bench/overhead.py

clean:
	rm -rf $(VENV) var .pytest_cache
