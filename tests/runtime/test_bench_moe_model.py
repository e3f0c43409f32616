"""The MoE bench's random model (runtime/bench/moe_model.py), at a tiny shape: the same seed writes
the same bytes, its K-quant blocks decode (by gguf's own dequantizer) to finite weights of the
intended size, and our engine loads the file and generates from it, its experts in the fused
kernel where the C++ kernels run."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from radixlm.runtime.bench.moe_model import MoeShape, write_moe_gguf

TINY = MoeShape(hidden_size=256, num_layers=1, num_experts=4, top_k=2, moe_intermediate_size=256, num_heads=4,
                num_kv_heads=2, head_dim=64, vocab_size=600, context_length=256)


def test_same_seed_same_file_and_valid_blocks(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a.gguf", tmp_path / "b.gguf", tmp_path / "c.gguf"
    write_moe_gguf(a, TINY, seed=3)
    write_moe_gguf(b, TINY, seed=3)
    write_moe_gguf(c, TINY, seed=4)
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()
    tensors = {t.name: t for t in gguf.GGUFReader(a).tensors}
    assert tensors["blk.0.ffn_down_exps.weight"].tensor_type == gguf.GGMLQuantizationType.Q4_K
    assert tensors["output.weight"].tensor_type == gguf.GGMLQuantizationType.Q6_K
    for name, bound in (("blk.0.ffn_gate_exps.weight", 0.2), ("output.weight", 0.1), ("token_embd.weight", 4.0)):
        t = tensors[name]
        w = gguf.quants.dequantize(t.data, t.tensor_type)
        assert np.isfinite(w).all() and 0 < np.abs(w).max() <= bound, name


def test_engine_loads_and_generates(tmp_path: Path) -> None:
    from radixlm.runtime.engine import Engine
    from radixlm.runtime.model.models.moe import SparseMoeBlock

    path = tmp_path / "moe.gguf"
    write_moe_gguf(path, TINY, seed=0)
    engine = Engine(model_path=str(path), quantization="gguf", dtype="float32", max_total_tokens=512)
    try:
        out = engine.generate(input_ids=[[300, 301, 302, 303]],
                              sampling_params={"max_new_tokens": 4, "temperature": 0.0, "ignore_eos": True})
        assert out[0]["meta_info"]["completion_tokens"] == 4
        model = engine.runner.model
        blocks = [m for m in model.modules() if isinstance(m, SparseMoeBlock)]
        assert len(blocks) == 1
        if blocks[0].ext is not None:
            assert blocks[0].fused is not None
    finally:
        engine.shutdown()
