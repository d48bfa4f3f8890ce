# The README's two commands: `make run` (the main job) and `make test`.
# Each sets up .venv on first use; set-up caches models under .cache/ (ignored).

PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
MODELS := .cache/models
export VLLM_HPU_EMULATION ?= 1

.PHONY: setup run test test-unit test-e2e lint models clean

$(VENV)/.installed: requirements-emulation.txt requirements-vllm.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install torch==2.13.0
	$(PY) -m pip install --no-deps vllm==0.32.0
	$(PY) -m pip install -r requirements-emulation.txt
	$(PY) -m pip install --no-deps -e .
	$(PY) scripts/install_torchvision_hook.py
	@$(PY) scripts/check_no_cuda.py
	touch $@

$(MODELS)/.built: $(VENV)/.installed scripts/build_tiny_models.py scripts/tiny_*.py scripts/convert_smollm2.py scripts/build_quant_checkpoints.py scripts/llmcompressor_checkpoints.py
	$(PY) scripts/build_tiny_models.py $(MODELS)
	$(PY) scripts/convert_smollm2.py $(MODELS)
	$(PY) scripts/build_quant_checkpoints.py $(MODELS)
	touch $@

setup: $(VENV)/.installed $(MODELS)/.built

models: $(MODELS)/.built

run: setup
	$(PY) examples/offline_inference.py --model $(MODELS)/smollm2-135m-instruct

test: setup
	$(PY) -m pytest -q tests

test-unit: setup
	$(PY) -m pytest -q tests/unit

test-e2e: setup
	$(PY) -m pytest -q tests/e2e

# The edit-test loop (under 3 minutes on 2 cores): tests not marked slow, and
# the slow ones marked smoke (tiny-llama against transformers, sampling).
.PHONY: test-fast
test-fast: setup
	$(PY) -m pytest -q -m "not slow or smoke" tests

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check vllm_hpu tests scripts benchmarks examples
	$(VENV)/bin/ruff format --check vllm_hpu tests scripts benchmarks examples
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) .cache
