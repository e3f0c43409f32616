"""The C++ compute kernels are torch ops (csrc/bindings/torch_ops.cpp): each build's under its own
namespace, a meta kernel giving each output's shape without running, profilers and torch.compile
seeing them by name."""

from __future__ import annotations

from typing import Any

import torch

from radixlm.kernels import cpu_linear, quant


def _operands() -> dict[str, tuple[tuple[Any, ...], dict[str, Any]]]:
    """Each op's arguments: small, valid, float32 activations."""
    x = torch.randn(3, 64)
    w = torch.randn(64, 128) * 0.1
    qpacked = quant.pack(quant.quantize(w.t().contiguous(), "q4_1"))
    k_buf = torch.randn(16, 1, 64)
    # two q4_1 experts (H 64, I 32): gate_up [64 -> 64], down [32 -> 64], one arena
    gate_up, down = (quant.pack(quant.quantize(torch.randn(64, k) * 0.1, "q4_1")).view(-1) for k in (64, 32))
    arena = torch.cat([gate_up, down, gate_up, down])
    at = [0, gate_up.numel(), gate_up.numel() + down.numel(), 2 * gate_up.numel() + down.numel()]
    return {
        "packed_linear": ((x, cpu_linear.pack(w), None, None), {}),
        "bf16_linear": ((x, cpu_linear.pack_pairs(w), None, None, 0), {}),
        "q_linear": ((x, qpacked), {"mode": 0}),
        "q_columns": ((qpacked, torch.tensor([0, 5, 127])), {}),
        "rms_norm": ((x, torch.ones(64), 1e-6), {}),
        "silu_mul": ((torch.randn(3, 128),), {}),
        "paged_attention": ((torch.randn(2, 2, 64), k_buf, torch.randn_like(k_buf),
                             torch.arange(16, dtype=torch.int32).view(1, 16), torch.tensor([0]), torch.tensor([5]),
                             torch.tensor([2]), torch.tensor([0]), 0.125), {}),
        "moe_experts": ((x, torch.tensor([[0, 1], [1, 0], [1, 0]]), torch.rand(3, 2), arena,
                         torch.tensor(at).view(2, 2), 32, 2, quant.block_bytes("q4_1"), quant.block_bytes("q4_1"), 0, -1),
                        {}),
    }


def test_every_compute_op_is_registered_with_a_meta_kernel(ext: Any) -> None:
    ops = getattr(torch.ops, cpu_linear.ops_namespace(ext.build))
    operands = _operands()
    assert set(operands) == set(cpu_linear.Extension.OPS)
    for name, (args, kwargs) in operands.items():
        real = getattr(ops, name)(*args, **kwargs)
        meta_args = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]
        meta = getattr(ops, name)(*meta_args, **kwargs)
        assert meta.device.type == "meta"
        assert (meta.shape, meta.dtype) == (real.shape, real.dtype), name


def test_a_profiler_names_the_ops(ext: Any) -> None:
    args, kwargs = _operands()["packed_linear"]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        ext.packed_linear(*args, **kwargs)
    names = {e.name for e in prof.events()}
    assert f"{cpu_linear.ops_namespace(ext.build)}::packed_linear" in names


def test_torch_compile_traces_the_ops_in_one_graph(ext: Any) -> None:
    """fullgraph: dynamo fails on a graph break, so an op it could not trace would fail here."""
    x, packed, _, _ = _operands()["packed_linear"][0]

    def layer(x: torch.Tensor) -> torch.Tensor:
        return ext.silu_mul(ext.packed_linear(ext.rms_norm(x, None, 1e-6), packed, None, None))

    compiled = torch.compile(layer, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), layer(x))


def test_python_packs_the_layouts_the_kernels_read(ext: Any) -> None:
    assert ext.layout() == {"panel": cpu_linear.PANEL, "pair_panel": cpu_linear.PAIR_PANEL,
                            "pair_k": cpu_linear.PAIR_K, "q_group": quant.GROUP, "q_block": quant.BLOCK}
    assert quant.N_MULTIPLE == cpu_linear.PANEL
