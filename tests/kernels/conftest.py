"""Fixtures of the C++ CPU kernel tests: the built extension (the tests that use it skip, with
the reason, on a CPU without AVX-512)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from radixlm.runtime.model.model_files import load_cpu_kernels


@pytest.fixture(scope="session")
def ext() -> Any:
    module = load_cpu_kernels()
    assert module is not None, "AVX-512 is present, so the kernels must build (see the log for why they did not)"
    return module


@pytest.fixture
def on_thread_counts() -> Callable[[Callable[[], torch.Tensor]], list[torch.Tensor]]:
    """Run a product once per torch thread count 1, 2, 3 (the kernels' work split differs on
    each) and give the outputs; the thread count is restored after."""

    def run(product: Callable[[], torch.Tensor]) -> list[torch.Tensor]:
        threads = torch.get_num_threads()
        try:
            outs = []
            for n in (1, 2, 3):
                torch.set_num_threads(n)
                outs.append(product())
            return outs
        finally:
            torch.set_num_threads(threads)

    return run
