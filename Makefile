# radixlm: `make serve` runs the main job on the embedded default model, `make test` runs the suite.
# Both create .venv when missing, install the project into it and fetch the default model.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.radixlm-installed

.PHONY: setup model kernels-all test-prereqs tools-and-model browser arm-tools serve serve-replicas test lint bench bench-peers clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch pinned first: the CPU build on disk; an unpinned torch pulls a multi-GB CUDA build
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[runtime,test]'
	touch $(STAMP)

model: setup
	$(BIN)/python -m radixlm.runtime.model.model_files --fetch-default
	# the C++ CPU decode kernels, compiled once into the cache (~30 s on 2 cores the first time)
	$(BIN)/python -m radixlm.runtime.model.model_files --build-kernels

# the kernels of every ISA level the tests run, built side by side (before `model` builds this CPU's
# own: found built) rather than one after another at the tests' collection
kernels-all: setup
	$(BIN)/python -m radixlm.runtime.model.model_files --build-all-levels

serve: model
	$(BIN)/radixlm serve $(ARGS)

# N replicas of `make serve` behind sglang-router (cache_aware) on :30000; replicas on :30001...
N ?= 2
serve-replicas: model
	$(BIN)/python -m radixlm.runtime.server.replicas --num-replicas $(N) $(ROUTER_ARGS) -- $(ARGS)

# the dashboard's browser test runs Debian's chromium (CI runs as root, with apt)
CHROMIUM := /usr/bin/chromium
browser:
	test -x $(CHROMIUM) || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium)

# the C++ vector layer's aarch64 test (tests/kernels/test_vec_layer.py) cross-compiles and runs under
# qemu-user: Debian's aarch64 g++ and qemu-user, installed when missing
arm-tools:
	command -v aarch64-linux-gnu-g++ >/dev/null && command -v qemu-aarch64 >/dev/null || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++-aarch64-linux-gnu qemu-user)

# The suite in TEST_WORKERS processes (pytest-xdist), each taking a whole test file at a time so a
# file's module-scoped servers start once, in the order tests/conftest.py gives them (the longest
# first; TEST_WORKERS=0: in this one process); then the tests
# marked `alone` (they watch the machine's load), by themselves. Exit 5 = nothing selected.
TEST_WORKERS ?= 2
# what the tests need, two things at a time: the kernels' builds (CPU) beside the system tools'
# installs and the model's fetch (network, disk), these one after another (apt takes one at a time)
test-prereqs: setup
	$(MAKE) --no-print-directory -j2 kernels-all tools-and-model

tools-and-model: setup
	$(MAKE) --no-print-directory -j1 browser arm-tools model

test: test-prereqs
	TRITON_INTERPRET=1 $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not alone" $(ARGS) || [ $$? -eq 5 ]
	TRITON_INTERPRET=1 $(BIN)/python -m pytest -m alone $(ARGS) || [ $$? -eq 5 ]

lint: setup
	$(BIN)/ruff check lang runtime kernels tests examples

bench: model
	$(BIN)/python -m radixlm.runtime.bench $(ARGS)

# Optional peers for `bench --peers llama.cpp`, never needed by `make test`: llama-cpp-python built
# from source for this CPU (~10 min on 2 cores, once; pip skips it when installed). torch is named
# beside it so that pip keeps the pinned CPU build whatever the peer's dependencies ask for.
LLAMA_CPP_PYTHON := llama-cpp-python==0.3.36
# A second build for the AVX2 level beside the native one (into the cache's peers/), which the
# bench takes when RADIXLM_CPU_ISA=avx2 caps radixlm at that level (runtime/bench/llamacpp_peer.py).
PEERS_DIR := $(or $(RADIXLM_CACHE),$(HOME)/.cache/radixlm)/peers
LLAMA_CPP_AVX2 := -DGGML_NATIVE=OFF -DGGML_AVX512=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX_VNNI=OFF
# On a CPU that reports AMX, a build for AVX-512 without AMX beside them: where a VM does not let
# the native build's AMX kernels run, the bench runs this one (runtime/bench/llamacpp_peer.py).
LLAMA_CPP_NOAMX := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
	-DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON \
	-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
bench-peers: model
	CMAKE_ARGS="-DGGML_NATIVE=ON $(CMAKE_ARGS)" $(BIN)/python -m pip install \
		--no-binary llama-cpp-python '$(LLAMA_CPP_PYTHON)' torch==2.13.0
	$(BIN)/python -m pip install -q diskcache  # the AVX2 build is installed without dependencies
	test -d $(PEERS_DIR)/llama-cpp-avx2/llama_cpp || CMAKE_ARGS="$(LLAMA_CPP_AVX2)" $(BIN)/python -m pip install \
		--no-binary llama-cpp-python --no-deps --no-cache-dir --target $(PEERS_DIR)/llama-cpp-avx2 '$(LLAMA_CPP_PYTHON)'
	! grep -qw amx_tile /proc/cpuinfo || test -d $(PEERS_DIR)/llama-cpp-noamx/llama_cpp || CMAKE_ARGS="$(LLAMA_CPP_NOAMX)" \
		$(BIN)/python -m pip install --no-binary llama-cpp-python --no-deps --no-cache-dir \
		--target $(PEERS_DIR)/llama-cpp-noamx '$(LLAMA_CPP_PYTHON)'

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
