PYTHON ?= python3
HOST   ?= 127.0.0.1
PORT   ?= 8000
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip
STAMP  := $(VENV)/.installed-dev
RUN    := $(VENV)/.installed

.PHONY: test test-fast serve install install-dev lint bench gpu-check openapi docs clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# Runtime install: the package and its dependencies, torch pinned by constraints.txt, with the
# hf extra (the README's Hugging Face walk-through serves a save_pretrained directory). Once,
# and again only when pyproject.toml or constraints.txt change: make serve starts at once.
$(RUN): $(BIN)/python pyproject.toml constraints.txt
	$(PIP) install --quiet -c constraints.txt -e '.[hf,regions]'
	touch $(RUN)

install: $(RUN)

$(STAMP): $(BIN)/python pyproject.toml constraints.txt
	$(PIP) install --quiet -c constraints.txt -e '.[dev,ray,hf,regions]'
	# inseq, a test oracle, without its dependencies (they would move torch and transformers)
	# but the few its import needs
	$(PIP) install --quiet --no-deps inseq==0.7.1 jaxtyping==0.3.11 wadler-lindig treescope==0.1.10
	# context-cite, the oracle of context attribution, likewise (its imports are dev extras)
	$(PIP) install --quiet --no-deps context-cite==0.0.4
	touch $(RUN) $(STAMP)  # the runtime install is part of this one

install-dev: $(STAMP)

# The layer contracts first ([tool.importlinter] in pyproject.toml: layers point one way, no
# import cycles, runtime code never imports benchmarks or tests), then the suite: two
# processes (pytest-xdist), a test file per process at a time, so a module's fixtures (its
# servers) stay in one; measured 539 s against 700 s in one process on this 2-core machine.
test: $(STAMP) $(RUN)
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -n 2 --dist loadfile

# The edit-test loop: every test that starts no process (pytest -m "not processes": no server
# subprocess, no worker process, no tool; their servers' workers are threads of the test
# process, ATTRSERVE_WORKER_MODE=thread), in the two pytest-xdist workers of make test.
test-fast: $(STAMP) $(RUN)
	$(BIN)/python -m pytest -n 2 --dist loadfile -m "not processes"

lint: $(STAMP)
	$(BIN)/ruff check methods service model_registry tests benchmarks
	$(BIN)/mypy
	$(BIN)/lint-imports

serve: install
	$(BIN)/attrserve serve --host $(HOST) --port $(PORT)

bench: $(STAMP)
	$(BIN)/python -m benchmarks

# On a machine with one CUDA GPU (<= 8 minutes): CUDA parity of every method family against the
# CPU float64 result, bfloat16/float16 fidelity, a resident model across requests, OOM retry,
# torch.compile, incremental occlusion, then benchmarks.real --quick on the GPU; one table.
# Without CUDA it prints "no CUDA device" and exits 0 without running anything: the driver is
# asked first, with the system python and no install (the module imports torch only after).
gpu-check:
	@$(PYTHON) -m benchmarks.gpu_check --driver || exit 0; \
	$(MAKE) --no-print-directory $(STAMP) && $(BIN)/python -m benchmarks.gpu_check --out gpu-check

openapi: install
	$(BIN)/attrserve openapi > openapi/openapi.json

# The reference site (mkdocs.yml, docs/) into site/, offline; broken links fail the build.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) build *.egg-info
