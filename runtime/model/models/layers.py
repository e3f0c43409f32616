"""The building blocks of our decoders: a Linear layer that runs our packed CPU kernels for
decode-sized products, an RMSNorm that may have its weight folded into the next layer, and an
embedding held block-quantized (see models/llama.py for how the model uses them)."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.kernels import cpu_linear, quant
from radixlm.runtime.model.kernel_policy import CpuIsa, load_cpu_kernels
from radixlm.runtime.model.linear_method import CpuKernels, KernelLinear, float_method, quantized_method


def native_repack(ext: cpu_linear.Extension | None) -> quant.Repack | None:
    """The C++ extension's repack of GGUF blocks into quant groups (quant.pack's fast path), or None
    where the extension cannot run (quant.pack then repacks in torch)."""
    return None if ext is None else ext.ops.quant_repack.default


class Linear(nn.Module):
    """y = x @ weight_t (+ bias) with the weight stored transposed, `[in, out]`: on CPU, MKL's
    matrix-vector and small-batch products run markedly faster in this layout than
    `F.linear` on the HF `[out, in]` layout. Once the model takes the C++ kernels, products of up
    to `method.max_rows` rows go through its method (linear_method.py); a block-quantized layer
    (`quantize_`) holds only its packed blocks and its method takes every product. A product whose
    row blocks come in different formats (`quantize_parts_`: a Q4_K_M file's q/k in Q4_K, v in
    Q6_K) holds one quantized Linear per part in `parts`, and its output is theirs side by side."""

    def __init__(self, in_features: int, out_features: int, bias: bool):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight_t = nn.Parameter(torch.empty(in_features, out_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.register_buffer("qweight", None)  # block-quantized weight (quantize_): then the only copy
        self.method: KernelLinear | None = None
        self.parts: nn.ModuleList | None = None  # quantize_parts_: then weight_t, qweight and method are None

    @property
    def max_rows(self) -> int:
        """Products of up to this many rows go through `method`."""
        return self.method.max_rows if self.method is not None else 0

    def quantize_(self, weight: quant.QuantizedTensor, mode: str) -> None:
        """Hold `weight` ([out, in], block-quantized) packed for our quantized kernel, in `mode`
        (kernels/quant.py MODES), instead of a float weight: every product runs that kernel."""
        ext = load_cpu_kernels()
        if ext is None:
            raise RuntimeError("quantized weights need the C++ CPU kernels, which cannot run here (no C++ compiler, or their build failed)")
        self.register_parameter("weight_t", None)
        self.register_buffer("qweight", quant.pack(weight, native_repack(ext)))
        self.method = quantized_method(ext, self.qweight, self.out_features, self.bias, mode)

    def quantize_parts_(self, weights: list[quant.QuantizedTensor], mode: str) -> None:
        """Hold `weights` (row blocks of the `[out, in]` weight, in order, each block-quantized in
        its own format) as one quantized Linear each (`quantize_`), instead of a float weight."""
        if sum(w.shape[0] for w in weights) != self.out_features or any(w.shape[1] != self.in_features for w in weights):
            raise ValueError(f"parts of shapes {[w.shape for w in weights]} do not make a [{self.out_features}, "
                             f"{self.in_features}] weight")
        self.register_parameter("weight_t", None)
        parts = []
        for weight in weights:
            with torch.device("meta"):  # no float weight: quantize_ drops it
                part = Linear(self.in_features, weight.shape[0], bias=False)
            part.quantize_(weight, mode)
            parts.append(part)
        self.parts = nn.ModuleList(parts)

    def kernel_linears(self) -> list[Linear]:
        """The Linears whose `method` holds this layer's weight: itself, or its parts."""
        return [self] if self.parts is None else [p for p in self.parts if isinstance(p, Linear)]

    def use_packed(self, ext: CpuKernels, bf16_path: str, chosen: CpuIsa) -> None:
        """Route products of up to `chosen.kernel_max_rows` rows through our kernel (bf16
        weights on GEMM path `bf16_path`); a quantized layer keeps its kernel."""
        if self.method is not None or self.parts is not None:  # quantized: its kernel(s) already
            return
        weight_t = self.weight_t.detach()
        self.method = float_method(ext, weight_t, self.bias, bf16_path,
                                   chosen.kernel_max_rows(weight_t.dtype, bf16_path))

    def place(self, method: KernelLinear) -> None:
        """Take `method`, its weight moved (linear_method.in_one_arena); a quantized layer's
        blocks are that weight."""
        self.method = method
        if self.qweight is not None:
            self.qweight = method.packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.parts is not None:
            out = torch.cat([part(x) for part in self.parts], dim=-1)
            return out if self.bias is None else out.add_(self.bias)
        if self.method is not None and x.shape[0] <= self.method.max_rows:
            return self.method.apply(x)
        if self.bias is None:
            return torch.mm(x, self.weight_t)
        return torch.addmm(self.bias, x, self.weight_t)

    def forward_add(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """residual + linear(x) in one GEMM (the residual is the accumulator)."""
        if self.parts is not None:
            return residual + self.forward(x)
        if self.method is not None and x.shape[0] <= self.method.max_rows:
            return self.method.apply(x, residual)
        out = torch.addmm(residual, x, self.weight_t)
        return out if self.bias is None else out.add_(self.bias)


class RMSNorm(nn.Module):
    """RMSNorm; `has_weight=False` where the checkpoint's norm weight is folded into the input
    rows of the linear layer that follows (one elementwise op less per norm)."""

    def __init__(self, dim: int, eps: float, has_weight: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim)) if has_weight else None
        self.shape = (dim,)
        self.eps = eps
        self.ext: CpuKernels | None = None  # the C++ kernels' fused row-wise norm, once use_kernel ran
        self.weight_f32: torch.Tensor | None = None

    def set_weight(self, weight: torch.Tensor) -> None:
        """Give a weightless norm its weight (the layer after it is quantized and cannot absorb it)."""
        self.weight = nn.Parameter(weight.detach().clone().to(torch.float32))

    def use_kernel(self, ext: CpuKernels) -> None:
        self.ext = ext
        if self.weight is not None:
            self.weight_f32 = self.weight.detach().float().contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.ext is not None and x.dim() == 2:
            return self.ext.rms_norm(x, self.weight_f32, self.eps)
        return F.rms_norm(x, self.shape, self.weight, self.eps)


class QuantizedEmbedding(nn.Module):
    """An embedding held as block-quantized rows (quant groups whose columns are the tokens, the
    layout of a tied lm_head, which can share them): a lookup dequantizes only its rows, in the
    model's dtype (that of `self.dtype_marker`, which follows `.to()`). With the C++ kernels
    (`use_cpu_kernels`) a lookup is one call (`q_columns`: a decode step's one row in ~2.5 us,
    where the torch ops of `quant.unpack_columns` take ~60 us); both give GGUF's values."""

    def __init__(self, packed: torch.Tensor):
        super().__init__()
        self.register_buffer("packed", packed)
        self.dtype_marker = nn.Parameter(torch.empty(0))
        self.ext: CpuKernels | None = None  # the C++ kernels, once use_cpu_kernels ran

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1)
        if self.ext is not None:  # set by use_cpu_kernels, on CPU only
            rows = self.ext.q_columns(self.packed, flat.to(torch.int64).contiguous())
        else:
            rows = quant.unpack_columns(self.packed, flat)
        return rows.to(self.dtype_marker.dtype).reshape(*ids.shape, rows.shape[-1])


@functools.cache
def _libc_malloc_trim() -> object | None:
    name = ctypes.util.find_library("c")
    lib = ctypes.CDLL(name) if name else None
    return getattr(lib, "malloc_trim", None)


def release_freed_memory() -> None:
    """Give the pages of freed heap memory back to the OS (glibc's malloc_trim; elsewhere a no-op).
    Weights of under a few MB come from malloc's heap, which keeps what they free: a load that
    copies the weights one by one into one arena (LlamaForCausalLM._place_weights) calls this as it
    goes, so that it holds the weights about once, not twice."""
    trim = _libc_malloc_trim()
    if trim is not None:
        trim(0)  # type: ignore[operator]
