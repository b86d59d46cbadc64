# make test: install everything from scratch, then lint, format check, types and every test.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin

.PHONY: test lint unit install clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

lint: install
	$(BIN)/ruff check instinct_fleet scripts tests group_data inventories tasks deploy.py
	$(BIN)/ruff format --check instinct_fleet scripts tests group_data inventories tasks deploy.py
	$(BIN)/mypy

unit: install
	$(BIN)/pytest tests/unit

test: lint unit

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
