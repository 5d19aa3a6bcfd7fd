# Two entry points: `make demo` (set up + train tiny CoLA on the built-in corpus) and `make test`.
# `make test` ends with the strict docs build (broken links and missing API references fail); the site goes to .site/.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup demo test bench

$(BIN)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -r requirements.txt
	$(BIN)/pip install -q --no-deps -e .
	touch $@

setup: $(BIN)/.installed

demo: setup
	$(BIN)/tensorslim train

test: setup
	$(BIN)/ruff check tensorslim tests benchmarks experiments
	$(BIN)/ruff format --check tensorslim tests benchmarks experiments
	$(BIN)/pytest -q -n 2 --durations=15
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet
