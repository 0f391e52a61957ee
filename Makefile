# hacpo-trl developer commands. `make install` then `make test` is all a fresh clone needs.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The exact pin matters: a bare `torch` or an open range can pull a multi-GB CUDA build.
TORCH_PIN ?= torch==2.13.0

.PHONY: install test lint format clean

install: $(BIN)/activate
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install "$(TORCH_PIN)"
	$(BIN)/pip install -e ".[dev]"

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)

test:
	$(BIN)/python -m pytest tests

lint:
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests

format:
	$(BIN)/ruff check --fix src tests
	$(BIN)/ruff format src tests

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .ruff_cache
