"""Fixtures of the C++ CPU kernel tests: the built extension (the tests that use it skip, with
the reason, on a CPU without AVX-512)."""

from __future__ import annotations

from typing import Any

import pytest

from radixlm.runtime.model.model_files import load_cpu_kernels


@pytest.fixture(scope="session")
def ext() -> Any:
    module = load_cpu_kernels()
    assert module is not None, "AVX-512 is present, so the kernels must build (see the log for why they did not)"
    return module
