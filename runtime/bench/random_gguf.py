"""Random-weight Qwen3-MoE GGUF files of a given shape, every matrix Q4_K, for benchmarks of models
no machine here can download (issue 35: a Qwen3-30B-A3B-shaped file, ~17 GB).

`random_moe_gguf(shape, seed, cache_dir)` returns `<cache_dir>/<shape.name>-seed<seed>.gguf`,
writing it first if absent (to a temp name, renamed when complete). The blocks are random bytes
made valid: each Q4_K super-block's two float16 scales (d, dmin) set to small positive values, so
every weight is finite and the forward pass stays in range; its 6-bit sub-block scales and 4-bit
values are the random bytes. They are written straight to disk, one tensor at a time (the largest,
the embedding, ~175 MB for the 30B shape): no float weights, no quantizer. Norms are ones (F32).
The tokenizer is a byte-level BPE vocabulary of `shape.vocab_size` tokens (ChatML specials, the
256 byte tokens, fillers) with a ChatML template: enough to serve requests, not to read them.

    python -m radixlm.runtime.bench.random_gguf --shape qwen3-30b-a3b --seed 0 --cache-dir DIR
"""

from __future__ import annotations

import argparse
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import gguf

Q4K_BLOCK_BYTES, Q4K_BLOCK_K = 144, 256  # GGUF's Q4_K super-block: d, dmin (float16), scales[12], qs[128]
_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass(frozen=True)
class MoeShape:
    """A Qwen3-MoE model's shape (HF Qwen3MoeConfig's names). K of every matrix (hidden_size,
    num_heads * head_dim, moe_intermediate_size) must be a multiple of 256 (Q4_K)."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_experts: int
    top_k: int
    moe_intermediate_size: int
    vocab_size: int
    context_length: int = 40960

    def __post_init__(self) -> None:
        widths = (self.hidden_size, self.num_heads * self.head_dim, self.moe_intermediate_size)
        if any(k % Q4K_BLOCK_K for k in widths):
            raise ValueError(f"{self.name}: every matrix's K must be a multiple of {Q4K_BLOCK_K}, got {widths}")
        if self.vocab_size < len(_SPECIALS) + 256:
            raise ValueError(f"{self.name}: vocab_size must hold the {len(_SPECIALS) + 256} byte and special tokens")

    def matrices(self) -> list[tuple[str, tuple[int, ...]]]:
        """(GGUF name, torch-order shape) of every Q4_K tensor, in file order."""
        h, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        e, i = self.num_experts, self.moe_intermediate_size
        out: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (self.vocab_size, h))]
        for layer in range(self.num_layers):
            b = f"blk.{layer}."
            out += [(b + "attn_q.weight", (q, h)), (b + "attn_k.weight", (kv, h)), (b + "attn_v.weight", (kv, h)),
                    (b + "attn_output.weight", (h, q)), (b + "ffn_gate_inp.weight", (e, h)),
                    (b + "ffn_gate_exps.weight", (e, i, h)), (b + "ffn_up_exps.weight", (e, i, h)),
                    (b + "ffn_down_exps.weight", (e, h, i))]
        return out + [("output.weight", (self.vocab_size, h))]

    def norms(self) -> list[tuple[str, int]]:
        """(GGUF name, length) of every F32 norm weight."""
        out = [("output_norm.weight", self.hidden_size)]
        for layer in range(self.num_layers):
            b = f"blk.{layer}."
            out += [(b + "attn_norm.weight", self.hidden_size), (b + "ffn_norm.weight", self.hidden_size),
                    (b + "attn_q_norm.weight", self.head_dim), (b + "attn_k_norm.weight", self.head_dim)]
        return out


QWEN3_30B_A3B = MoeShape("qwen3-30b-a3b", num_layers=48, hidden_size=2048, num_heads=32, num_kv_heads=4, head_dim=128,
                         num_experts=128, top_k=8, moe_intermediate_size=768, vocab_size=151936)
TINY = MoeShape("tiny-moe", num_layers=2, hidden_size=256, num_heads=4, num_kv_heads=2, head_dim=64, num_experts=8,
                top_k=2, moe_intermediate_size=256, vocab_size=512, context_length=2048)
SHAPES = {s.name: s for s in (QWEN3_30B_A3B, TINY)}


def random_moe_gguf(shape: MoeShape, seed: int, cache_dir: Path) -> Path:
    """The file of `shape` and `seed` in `cache_dir`, written first if absent."""
    path = Path(cache_dir) / f"{shape.name}-seed{seed}.gguf"
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        write_random_moe_gguf(shape, tmp, seed)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def random_q4k_blocks(rng: np.random.Generator, rows: int, k: int) -> np.ndarray:
    """uint8 `[rows, k / 256 * 144]`: random Q4_K super-blocks with d, dmin in [2^-14, 2^-12)
    (float16), so |w| <= 63 * 15 * d stays below ~0.25."""
    blocks = np.frombuffer(rng.bytes(rows * k // Q4K_BLOCK_K * Q4K_BLOCK_BYTES), dtype=np.uint8).copy()
    blocks = blocks.reshape(-1, Q4K_BLOCK_BYTES)
    scales = (2.0 ** -14 * (1.0 + 3.0 * rng.random((blocks.shape[0], 2)))).astype(np.float16)
    blocks[:, 0:4] = scales.view(np.uint8).reshape(-1, 4)
    return blocks.reshape(rows, -1)


def write_random_moe_gguf(shape: MoeShape, path: Path, seed: int) -> None:
    """Write the GGUF of `shape` with random Q4_K matrices drawn from `seed` to `path`."""
    import gguf

    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(path, "qwen3moe")
    _write_metadata(writer, shape)
    q4k = gguf.GGMLQuantizationType.Q4_K
    for name, dims in shape.matrices():
        byte_shape = (*dims[:-1], dims[-1] // Q4K_BLOCK_K * Q4K_BLOCK_BYTES)
        writer.add_tensor_info(name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=q4k)
    for name, length in shape.norms():
        writer.add_tensor_info(name, (length,), np.dtype(np.float32), 4 * length)
    writer.write_header_to_file(path)
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, dims in shape.matrices():
        rows = int(np.prod(dims[:-1]))
        writer.write_tensor_data(random_q4k_blocks(rng, rows, dims[-1]))
    for _, length in shape.norms():
        writer.write_tensor_data(np.ones(length, dtype=np.float32))
    writer.close()


def _write_metadata(w: gguf.GGUFWriter, shape: MoeShape) -> None:
    w.add_context_length(shape.context_length)
    w.add_embedding_length(shape.hidden_size)
    w.add_block_count(shape.num_layers)
    w.add_feed_forward_length(shape.top_k * shape.moe_intermediate_size)
    w.add_head_count(shape.num_heads)
    w.add_head_count_kv(shape.num_kv_heads)
    w.add_key_length(shape.head_dim)
    w.add_value_length(shape.head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1000000.0)
    w.add_expert_count(shape.num_experts)
    w.add_expert_used_count(shape.top_k)
    w.add_expert_feed_forward_length(shape.moe_intermediate_size)
    tokens = _vocabulary(shape.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([3] * len(_SPECIALS) + [1] * (len(tokens) - len(_SPECIALS)))
    w.add_token_merges(["h e", "l l", "he ll"])
    w.add_eos_token_id(_SPECIALS.index("<|im_end|>"))
    w.add_pad_token_id(_SPECIALS.index("<|endoftext|>"))
    w.add_bos_token_id(_SPECIALS.index("<|endoftext|>"))
    w.add_add_bos_token(False)
    w.add_chat_template(_CHAT_TEMPLATE)


def _vocabulary(size: int) -> list[str]:
    """ChatML specials, GPT-2's spelling of the 256 bytes, the merges' tokens, then fillers."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    spelling, extra = [], 0
    for byte in range(256):
        if byte in printable:
            spelling.append(chr(byte))
        else:
            spelling.append(chr(256 + extra))
            extra += 1
    tokens = [*_SPECIALS, *spelling, "he", "ll", "hell"]
    return tokens + [f"<|filler_{i}|>" for i in range(size - len(tokens))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m radixlm.runtime.bench.random_gguf", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default=QWEN3_30B_A3B.name)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    print(random_moe_gguf(SHAPES[args.shape], args.seed, args.cache_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
