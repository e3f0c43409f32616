"""Suite-wide setup. Triton runs in its interpreter on CPU tensors (no GPU here): the variable
must be set before anything imports triton; likewise the runtime's OpenMP spin count before
anything imports torch. The shipped defaults (`--dtype auto`, `--quantization auto`, the kernels
at the CPU's own ISA level) are what the suite runs: a test that needs another setting asks for
it by name."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
# the thread governor (runtime/model/cpu_threads.py) follows the machine's load; the suite keeps
# the thread count fixed so no comparison depends on it (tests/runtime/test_cpu_threads.py tests it)
os.environ.setdefault("RADIXLM_ADAPTIVE_THREADS", "0")

from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

from radixlm.runtime.config.envs import set_process_defaults  # noqa: E402

set_process_defaults()  # before anything loads torch

# Property tests do not depend on the machine's speed (no per-example deadline, no too-slow
# health check) and are the same on every run (derandomized, no example database).
settings.register_profile(
    "radixlm", deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("radixlm")

# The files that take longest (a fresh venv compiling the kernels, qemu drivers, schemathesis),
# run first: `make test` deals whole files to its two workers in collection order (xdist's
# --no-loadscope-reorder: by default it deals the files with most tests first), and a long file
# dealt last would finish alone while the other worker idles.
LONG_FILES_FIRST = (
    "test_wheel_install.py",
    "server/test_openapi_contract.py",
    "kernels/test_cpu_linear.py",
    "kernels/test_quant_gemm.py",
    "kernels/test_paged_attention.py",
    "server/test_model_families_http.py",
    "kernels/test_bf16_gemm.py",
    "kernels/test_vec_layer.py",
    "runtime/test_tensor_parallel.py",
    "server/test_examples.py",
    "runtime/test_jump_forward.py",
    "runtime/test_model_families.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests_dir = Path(__file__).parent

    def rank(item: pytest.Item) -> int:
        name = item.path.relative_to(tests_dir).as_posix() if item.path.is_relative_to(tests_dir) else ""
        return LONG_FILES_FIRST.index(name) if name in LONG_FILES_FIRST else len(LONG_FILES_FIRST)

    items.sort(key=rank)  # stable: the order within a file, and of the other files, is kept


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The embedded default model (converted once per machine into the user cache)."""
    from radixlm.runtime.model.model_files import resolve_model_path

    return resolve_model_path(None)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> Path:
    """A tiny random-weight Llama with the default model's tokenizer (so text round-trips)."""
    from radixlm_testing import save_tiny_model

    path = tmp_path_factory.mktemp("tiny-llama")
    save_tiny_model(path, "llama", vocab_size=49152, tokenizer_dir=default_model_dir)
    return path


@pytest.fixture(scope="session")
def tiny_engine(tiny_model_dir: Path) -> Any:
    """An in-process Engine on the tiny model (4,096-token pool), shared by the engine tests."""
    from radixlm.runtime.engine import Engine

    # float32 by name: the tests that share it compare outputs across batch shapes and schedules,
    # which bf16 (what `--dtype auto` takes on a CPU with fast bf16) rounds differently per shape;
    # the shipped defaults run in default_server and the default-model tests
    engine = Engine(str(tiny_model_dir), max_total_tokens=4096, random_seed=0, dtype="float32")
    yield engine
    engine.shutdown()


@pytest.fixture(scope="session")
def scripted_model_dir(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> Path:
    """A tiny llama (the default model's tokenizer) whose greedy output after a newline is
    REASONING_SCRIPT, DeepSeek-R1 style: reasoning, `</think>` (3 tokens here), the answer, EOS."""
    from radixlm_testing import FALLBACK_DIGIT, REASONING_SCRIPT, save_tiny_model, script_weights

    from radixlm.runtime.tokenizer.tokenizer import Tokenizer

    tokenizer = Tokenizer(default_model_dir)
    newline, = tokenizer.encode_plain("\n")
    digit, = tokenizer.encode_plain(FALLBACK_DIGIT)
    chain = [newline, *tokenizer.encode_plain("".join(REASONING_SCRIPT))]
    assert tokenizer.eos_token_id is not None and digit not in chain
    path = tmp_path_factory.mktemp("scripted-llama")
    save_tiny_model(path, "llama", vocab_size=49152, tokenizer_dir=default_model_dir,
                    set_weights=script_weights(chain, tokenizer.eos_token_id, {digit: 2.0}))
    return path


@pytest.fixture(scope="session")
def family_models(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> dict[str, tuple[Any, Path]]:
    """Each of radixlm_testing.FAMILY_CONFIGS' tiny models with the default model's tokenizer:
    the transformers model and its saved directory, for the Engine and server greedy tests."""
    from radixlm_testing import FAMILY_CONFIGS, save_tiny_model

    out = {}
    for kind in sorted(FAMILY_CONFIGS):
        path = tmp_path_factory.mktemp(f"family-{kind}")
        out[kind] = (save_tiny_model(path, kind, vocab_size=49152, tokenizer_dir=default_model_dir), path)
    return out
