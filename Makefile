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

# The tests also check a GGUF export against llama.cpp itself. llama-cpp-python ships as source only, so it is built
# here for the tests alone (10 minutes on 2 cores): only the library, without the multimodal part and the tools.
LLAMA_CPP_ARGS := -DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
	-DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF
$(BIN)/.installed-llama-cpp: $(BIN)/.installed
	CMAKE_ARGS="$(LLAMA_CPP_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=2 $(BIN)/pip install -q torch==2.13.0 llama-cpp-python==0.3.36
	touch $@

demo: setup
	$(BIN)/tensorslim train

test: setup $(BIN)/.installed-llama-cpp
	$(BIN)/ruff check tensorslim tests benchmarks experiments
	$(BIN)/ruff format --check tensorslim tests benchmarks experiments
	$(BIN)/pytest -q -n 2 --durations=15
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet
