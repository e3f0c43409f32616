"""Fixtures of the C++ CPU kernel tests: the extension at every ISA level this CPU runs
(kernels/isa.py: an AVX-512 machine also checks its AVX2 and generic builds; levels above the
CPU are not offered, they are not skipped tests)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from levels import LEVELS, level_module


@pytest.fixture(params=LEVELS)
def ext(request: pytest.FixtureRequest) -> Any:
    """The kernels built for one ISA level, told the features of that level (levels sharing a
    build share its module, so this is set anew for each test). Tests of a path some levels do
    not run take `ext` with the path from levels.level_params instead."""
    return level_module(request.param)


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
