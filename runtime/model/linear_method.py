"""How a linear layer multiplies, chosen once when the model takes the C++ CPU kernels (the
LinearMethod pattern): the layer keeps torch's GEMM on its float weight for products beyond the
method's rows, and hands the rest to the method, which holds the weight packed for one kernel:

    float32 panels -> cpu_linear.packed_linear     bf16 pair panels -> cpu_linear.bf16_linear (a path)
    quant groups (GGUF blocks) -> cpu_linear.q_linear (a mode; every row: the only copy)

Which method and how many rows is the kernel policy's choice (kernel_policy.CpuIsa); the layers
see only this typed interface, and `CpuKernels`, the part of the extension module they call.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from radixlm.kernels import cpu_linear, huge_pages, quant


class CpuKernels(Protocol):
    """The C++ CPU kernels' module (kernels/csrc/bindings), as the model's layers call it."""

    DecodeStack: Any  # the class: every decoder layer of a decode step in one call

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor: ...

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor: ...

    def q_columns(self, packed: torch.Tensor, ids: torch.Tensor) -> torch.Tensor: ...


class Product(Protocol):
    """One of cpu_linear's products: (ext, x, packed, n, residual, bias) -> x @ W (+ bias) (+ residual)."""

    def __call__(self, ext: Any, x: torch.Tensor, packed: torch.Tensor, n: int,
                 residual: torch.Tensor | None, bias: torch.Tensor | None) -> torch.Tensor: ...


@dataclass(frozen=True)
class KernelLinear:
    """Products of up to `max_rows` rows through `product` on `packed`; `quant_mode` (quant.MODES)
    for quantized weights, else None. DecodeStack reads `packed`, `bias` and `quant_mode`."""

    ext: CpuKernels
    product: Product
    packed: torch.Tensor
    n: int
    bias: torch.Tensor | None
    max_rows: int
    quant_mode: int | None = None

    def apply(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        return self.product(self.ext, x, self.packed, self.n, residual, self.bias)

    def with_bias(self, bias: torch.Tensor | None) -> KernelLinear:
        return dataclasses.replace(self, bias=padded_bias(bias))


def in_one_arena(methods: list[KernelLinear | None]) -> Iterator[KernelLinear]:
    """The same methods, one at a time, with their packed weights copied in this order into one
    allocation in huge pages (kernels/huge_pages.py): a decode step, given the order it reads them
    in, streams them as one run of 2 MB pages (~5% faster reads of float32 weights than one 4 KB-
    paged allocation each). Each weight starts on a 4 KB boundary. The list gives up each method as
    it is copied, so a caller that puts each placed method in its layer before taking the next
    holds the weights plus one copy at most."""
    def aligned(nbytes: int) -> int:
        return -(-nbytes // 4096) * 4096

    assert all(m is not None for m in methods), "a method to place is missing"
    arena = huge_pages.empty((sum(aligned(m.packed.nbytes) for m in methods if m is not None),), torch.uint8)
    offset = 0
    for i, m in enumerate(methods):
        assert m is not None
        methods[i] = None
        view = arena[offset: offset + m.packed.nbytes].view(m.packed.dtype).view(m.packed.shape)
        view.copy_(m.packed)
        offset += aligned(m.packed.nbytes)
        yield dataclasses.replace(m, packed=view)


def padded_bias(bias: torch.Tensor | None) -> torch.Tensor | None:
    """The bias as the kernels read it: float32, zero-padded to whole 64-column panels."""
    if bias is None:
        return None
    padded = -(-bias.numel() // cpu_linear.PANEL) * cpu_linear.PANEL
    return F.pad(bias.detach().float(), (0, padded - bias.numel())).contiguous()


def float_method(ext: CpuKernels, weight_t: torch.Tensor, bias: torch.Tensor | None, bf16_path: str,
                 max_rows: int) -> KernelLinear:
    """A float weight `[in, out]` packed for our float32 (panels) or bfloat16 (pair panels, on GEMM
    path `bf16_path`) kernel, by its dtype."""
    n = weight_t.shape[1]
    if weight_t.dtype == torch.bfloat16:
        product = partial(cpu_linear.bf16_linear, path=bf16_path)
        return KernelLinear(ext, product, cpu_linear.pack_pairs(weight_t), n, padded_bias(bias), max_rows)
    return KernelLinear(ext, cpu_linear.packed_linear, cpu_linear.pack(weight_t), n, padded_bias(bias), max_rows)


def quantized_method(ext: CpuKernels, packed: torch.Tensor, n: int, bias: torch.Tensor | None,
                     mode: str) -> KernelLinear:
    """Quant groups (quant.pack) through our quantized kernel in `mode` (quant.MODES), every row."""
    code = quant.MODES[mode]
    return KernelLinear(ext, partial(cpu_linear.q_linear, mode=code), packed, n, padded_bias(bias), sys.maxsize, code)
