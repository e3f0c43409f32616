"""GGUF files loaded as they are: quantized tensors read from the file when the model takes them
(no float copy in the converted folder), each kept in its own format, mixed Q4_K_M layers
included, and the random-weight Q4_K mixture-of-experts generator the big-model bench uses, at a
tiny shape. (Conversion of each family: test_gguf_families.py; the kernels: tests/kernels.)"""

from __future__ import annotations

import os
from pathlib import Path

import gguf
import pytest
import torch
from gguf_testing import tiny_family_model, write_gguf
from radixlm_testing import runner_decode, runner_extend
from safetensors import safe_open

from radixlm.kernels import quant
from radixlm.runtime.bench.moe_model import SHAPES, ensure_moe_gguf
from radixlm.runtime.model.model_config import ModelConfig
from radixlm.runtime.model.model_files import ModelLoadError, load_quantized, resolve_model_path
from radixlm.runtime.model.model_runner import ModelRunner, RunnerConfig, weights_of
from radixlm.runtime.model.models.layers import Linear, QuantizedEmbedding

Q4_K, Q5_K, Q6_K = (gguf.GGMLQuantizationType[t] for t in ("Q4_K", "Q5_K", "Q6_K"))
# llama.cpp's Q4_K_M: Q4_K but v and down in Q6_K on some layers, the output in Q6_K; layer 1's
# up in Q5_K besides, so that gate/up are mixed too
Q4_K_M = {
    "token_embd.weight": Q4_K, "output.weight": Q6_K,
    **{f"blk.{i}.{key}.weight": Q4_K for i in range(2)
       for key in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")},
    "blk.0.attn_v.weight": Q6_K, "blk.0.ffn_down.weight": Q6_K, "blk.1.ffn_up.weight": Q5_K,
}


@pytest.fixture(autouse=True)
def tmp_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh model cache sharing the real cache's built C++ kernels."""
    from radixlm.runtime.model.model_files import cache_dir

    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "extensions").symlink_to(cache_dir() / "extensions")
    monkeypatch.setenv("RADIXLM_CACHE", str(cache))
    return cache


@pytest.fixture
def q4_k_m_gguf(tmp_path: Path) -> Path:
    """A tiny Llama (q/k rows permuted in the file) at a width the K-quants take, as Q4_K_M."""
    (tmp_path / "hf").mkdir()
    tiny_family_model("llama", tmp_path / "hf", hidden_size=256, intermediate_size=512, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=64)
    write_gguf(tmp_path / "hf", tmp_path / "m.gguf", "llama", tensor_types=Q4_K_M)
    return tmp_path / "m.gguf"


def _fmt(linear: Linear) -> str | list[str]:
    if linear.parts is not None:
        return [_fmt(part) for part in linear.parts]  # type: ignore[misc, arg-type]
    assert linear.qweight is not None and linear.weight_t is None
    return quant.format_of(linear.qweight)


def _logits(runner: ModelRunner, seqs: list[list[int]], prompt_lens: list[int], steps: int) -> torch.Tensor:
    """Prefill of the prompts, then `steps` teacher-forced decode steps of all together."""
    rows = [runner.req_to_token_pool.alloc() for _ in seqs]
    out = [runner_extend(runner, rows, [0] * len(seqs), [s[:n] for s, n in zip(seqs, prompt_lens)])]
    for step in range(steps):
        out.append(runner_decode(runner, rows, seqs, [n + step for n in prompt_lens]))
    return torch.cat(out).float()


def test_q4_k_m_file_keeps_every_tensor_in_its_format(q4_k_m_gguf: Path) -> None:
    """Every tensor stays in the file's format, the mixed q/k/v and gate/up products as parts;
    the logits equal the same model's on the dequantized weights (a float load of the file)."""
    model_dir = resolve_model_path(q4_k_m_gguf)
    with safe_open(str(model_dir / "model.safetensors"), framework="pt") as floats:
        assert all(name.endswith("norm.weight") for name in floats.keys())  # noqa: SIM118 (no float copy)
    cfg = ModelConfig.from_dir(model_dir)
    runner = ModelRunner(cfg, RunnerConfig(torch.float32, "torch", 512, 4, cfg.context_len, quantization="gguf"),
                         weights_of(model_dir, "gguf"))
    model = runner.model
    first, second = model.layers
    assert _fmt(first.qkv_proj) == ["q4_k", "q6_k"]  # q and k in one Q4_K product, v in Q6_K
    assert (_fmt(first.o_proj), _fmt(first.mlp.gate_up_proj), _fmt(first.mlp.down_proj)) == ("q4_k", "q4_k", "q6_k")
    assert _fmt(second.qkv_proj) == "q4_k" and _fmt(second.mlp.gate_up_proj) == ["q4_k", "q5_k"]
    assert _fmt(model.lm_head) == "q6_k"
    assert isinstance(model.embed_tokens, QuantizedEmbedding) and quant.format_of(model.embed_tokens.packed) == "q4_k"

    reference = ModelRunner(cfg, RunnerConfig(torch.float32, "torch", 512, 4, cfg.context_len),
                            weights_of(model_dir, "none"))
    assert reference.quantized_layers == 0
    seqs = [list(range(3, 40)), [7, 8, 9, 10, 11, 12, 13, 14, 15, 16]]
    got, want = _logits(runner, seqs, [30, 4], 5), _logits(reference, seqs, [30, 4], 5)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)  # another order of float32 additions


def test_converted_folder_refuses_a_changed_gguf(q4_k_m_gguf: Path) -> None:
    """The folder reads its quantized tensors from the file it was converted from: once that file
    changes, loading the folder says so, and the file itself converts again (a new cache key)."""
    model_dir = resolve_model_path(q4_k_m_gguf)
    assert len(load_quantized(model_dir)) == 2 * 7 + 2
    st = q4_k_m_gguf.stat()
    os.utime(q4_k_m_gguf, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    with pytest.raises(ModelLoadError, match="changed since"):
        load_quantized(model_dir)
    again = resolve_model_path(q4_k_m_gguf)
    assert again != model_dir and len(load_quantized(again)) == 2 * 7 + 2
    q4_k_m_gguf.unlink()
    with pytest.raises(ModelLoadError, match="is gone"):
        load_quantized(again)


def test_random_moe_gguf_loads_quantized_and_generates(tmp_path: Path) -> None:
    """The bench's generator at a tiny shape: a Qwen3-MoE file of random Q4_K blocks serves with
    every matrix in Q4_K (the experts, each product once; the output Q6_K) and a float copy of only the norms and routers."""
    from radixlm.runtime.engine import Engine

    tiny = SHAPES["tiny"]
    path = ensure_moe_gguf(tiny, 0, tmp_path / "gen")
    assert ensure_moe_gguf(tiny, 0, tmp_path / "gen") == path  # cached
    with Engine(str(path), max_total_tokens=512, random_seed=0, quantization="gguf") as engine:
        model = engine.runner.model
        experts = [e for layer in model.layers for e in layer.mlp.experts]
        assert len(experts) == tiny.num_layers * tiny.num_experts
        assert {_fmt(lin) for e in experts for lin in (e.gate_up_proj, e.down_proj)} == {"q4_k"}
        assert {_fmt(layer.qkv_proj) for layer in model.layers} == {"q4_k"}
        out = engine.generate(input_ids=[3, 4, 5, 6], sampling_params={"temperature": 0, "max_new_tokens": 6,
                                                                       "ignore_eos": True})
        assert len(out["output_ids"]) == 6
    model_dir = resolve_model_path(path)
    float_bytes = sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))
    assert float_bytes < 64 * 1024 < path.stat().st_size  # the norms: ~4 KB a layer


@pytest.mark.parametrize("n,k", [(64, 256), (100, 768), (1536, 512)])  # 100: rows padded to 64
def test_q4_k_fast_repack_equals_the_value_by_value_one(n: int, k: int) -> None:
    """kquants' Q4_K repacking by whole bytes (what a big file's load runs) gives the bytes of the
    generic value-by-value repacking, on random valid blocks (the bench generator's)."""
    import numpy as np

    from radixlm.kernels import kquants
    from radixlm.runtime.bench.moe_model import random_q4_k

    raw = torch.from_numpy(random_q4_k(np.random.default_rng(n), n, k, 1.0))
    assert torch.equal(kquants.pack(raw, k, "q4_k", 64), kquants._pack_values(raw, k, "q4_k", 64))


LOAD_PEAK_SCRIPT = """
import sys
from pathlib import Path
import torch
from radixlm.runtime.model.model_config import ModelConfig
from radixlm.runtime.model.model_files import resolve_model_path
from radixlm.runtime.model.model_runner import weights_of
from radixlm.runtime.model.models.llama import LlamaForCausalLM

def status(key):
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(key))

model_dir = resolve_model_path(Path(sys.argv[1]))
cfg = ModelConfig.from_dir(model_dir)
with torch.device("meta"):
    model = LlamaForCausalLM(cfg, None, 2048)
model = model.to_empty(device="cpu")
before = status("VmRSS:")
open("/proc/self/clear_refs", "w").write("5")  # the peak (VmHWM) from here
model.load_weights(weights_of(model_dir, "gguf"), None, "int8")
print(status("VmHWM:") - before, status("VmRSS:") - before)
"""


def test_a_quantized_load_holds_the_weights_about_once(tmp_path: Path) -> None:
    """Loading a K-quant MoE GGUF (~185 MB: 6 layers of 32 experts) peaks at its weights plus a
    layer in flight: the read buffers and packed copies of a few MB each, freed into malloc's
    heap, are given back layer by layer (a 17 GB Qwen3-30B-A3B-shaped file peaked at ~1.4x the
    weights without it, more than a 24 GiB machine holds)."""
    import subprocess
    import sys

    from radixlm.runtime.bench.moe_model import MoeShape

    shape = MoeShape(hidden_size=1024, num_layers=6, num_experts=32, top_k=4, moe_intermediate_size=512,
                     num_heads=8, num_kv_heads=2, head_dim=128, vocab_size=4096, context_length=2048)
    path = ensure_moe_gguf(shape, 0, tmp_path / "gen")
    resolve_model_path(path)  # converted (the index and the norms) here, not in the measured process
    out = subprocess.run([sys.executable, "-c", LOAD_PEAK_SCRIPT, str(path)], capture_output=True, text=True,
                         check=True, timeout=300, env=os.environ)
    peak, held = (int(v) for v in out.stdout.split())
    weights = path.stat().st_size
    assert 0.9 * weights < held < 1.1 * weights
    assert peak < 1.2 * weights, f"peak {peak / weights:.2f}x the weights"
