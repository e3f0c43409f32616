"""A realistic-width mixture-of-experts test model for the MoE bench: a Qwen3-MoE-shaped GGUF with
random weights, written straight as random valid K-quant blocks (no quantizer runs: any bytes
are a valid Q4_K / Q6_K block once its float16 scales are sane), regenerated from a seed into
the cache.

    MoeShape (frozen) + seed -> <cache>/bench/moe/<name>.gguf (written once; a temp name, then renamed)
    python -m radixlm.runtime.bench.moe_model --shape qwen3-30b-a3b --seed 0 [--cache-dir DIR]

Shapes (SHAPES): `bench` (the default, the MoE bench's), `qwen3-30b-a3b` (Qwen3-30B-A3B's: 48
layers, 128 experts, vocab 151,936; ~17 GB) and `tiny` (tests). Tensors are written one at a
time, straight to the file (the largest a layer's stacked experts: 113 MB at the 30B shape), so
writing never holds the model in memory.

Formats, as llama.cpp's Q4_K_M mostly chooses them: every 2-D weight Q4_K (attention, experts,
token embedding) but the output head, Q6_K; the router (`ffn_gate_inp`) and the norms F32, as
llama.cpp's converter keeps them. (Q4_K_M also gives some attn_v / ffn_down tensors Q6_K; here
they are Q4_K, so every expert has the format the fused MoE kernel is measured on.)

The weights are random, so the text is noise: the bench feeds token ids and ignores EOS. The
vocabulary is a GPT-2-style BPE one of the byte alphabet and pairs of its printable characters
(with their merges), then fillers past the pairs, so both runtimes load a tokenizer of the
model's full size.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

Q4_K_BYTES, Q6_K_BYTES, SUPER_K = 144, 210, 256  # GGUF's super-block: bytes per 256 weights


@dataclass(frozen=True)
class MoeShape:
    """The model's shape. The default is 2.2 B parameters (1.2 GB as Q4_K), ~0.7 B active per
    token: Qwen3-30B-A3B's hidden width, expert width, top-k and head layout, with fewer layers
    and experts (12 x 32 in place of 48 x 128)."""

    hidden_size: int = 2048
    num_layers: int = 12
    num_experts: int = 32
    top_k: int = 8
    moe_intermediate_size: int = 768
    num_heads: int = 32
    num_kv_heads: int = 4
    head_dim: int = 128
    vocab_size: int = 32000
    context_length: int = 4096

    @property
    def name(self) -> str:
        return (f"qwen3moe-h{self.hidden_size}-l{self.num_layers}-e{self.num_experts}x{self.moe_intermediate_size}"
                f"-k{self.top_k}-v{self.vocab_size}")

    @property
    def num_parameters(self) -> int:
        h, d = self.hidden_size, self.head_dim
        attention = h * d * (2 * self.num_heads + 2 * self.num_kv_heads)
        experts = self.num_experts * 3 * h * self.moe_intermediate_size + self.num_experts * h
        return self.num_layers * (attention + experts) + 2 * self.vocab_size * h


SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def byte_alphabet() -> list[str]:
    """GPT-2's byte-to-unicode alphabet: 256 characters, one per byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    chars, extra = [], 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def vocabulary(size: int) -> tuple[list[str], list[str]]:
    """(tokens, merges): the specials, the byte alphabet, then pairs of alphabet characters (each
    with its merge), then fillers, up to `size` tokens."""
    alphabet = byte_alphabet()
    tokens = SPECIALS + alphabet
    merges: list[str] = []
    for a in alphabet:
        for b in alphabet:
            if len(tokens) >= size:
                return tokens, merges
            tokens.append(a + b)
            merges.append(f"{a} {b}")
    return tokens + [f"<|filler_{i}|>" for i in range(size - len(tokens))], merges


def random_q4_k(rng: np.random.Generator, rows: int, cols: int, scale: float) -> np.ndarray:
    """`rows` x `cols` (a multiple of 256) random Q4_K weights as GGUF stores them, uint8
    [rows, cols / 256 * 144]: per super-block d and dmin (float16, ~`scale` / 500, so weights
    d * sc * u - dmin * m lie within ~±`scale`), then 12 bytes of 6-bit scales and mins and 128
    bytes of nibbles, random."""
    supers = rows * cols // SUPER_K
    blocks = rng.integers(0, 256, size=(supers, Q4_K_BYTES), dtype=np.uint8)
    half = (rng.uniform(0.5, 1.5, size=(supers, 2)) * scale / 500).astype(np.float16)
    blocks[:, :4] = half.view(np.uint8).reshape(supers, 4)
    return blocks.reshape(rows, cols // SUPER_K * Q4_K_BYTES)


def random_q6_k(rng: np.random.Generator, rows: int, cols: int, scale: float) -> np.ndarray:
    """As random_q4_k for Q6_K (210 bytes per 256: 128 + 64 bytes of values, 16 int8 scales, d
    float16 last): weights d * sc * (u - 32) within ~±`scale`."""
    supers = rows * cols // SUPER_K
    blocks = rng.integers(0, 256, size=(supers, Q6_K_BYTES), dtype=np.uint8)
    d = (rng.uniform(0.5, 1.5, size=(supers, 1)) * scale / 4096).astype(np.float16)
    blocks[:, 208:] = d.view(np.uint8).reshape(supers, 2)
    return blocks.reshape(rows, cols // SUPER_K * Q6_K_BYTES)


def write_moe_gguf(path: Path, shape: MoeShape, seed: int = 0) -> None:
    """Write the random model of `shape` from `seed` to `path` (the same bytes for the same seed)."""
    import gguf

    if shape.hidden_size % SUPER_K or shape.moe_intermediate_size % SUPER_K:
        raise ValueError("hidden_size and moe_intermediate_size must be multiples of 256 (K-quant super-blocks)")
    rng = np.random.default_rng(seed)
    h, d, inter = shape.hidden_size, shape.head_dim, shape.moe_intermediate_size
    writer = gguf.GGUFWriter(path, "qwen3moe")
    writer.add_name(shape.name)
    writer.add_context_length(shape.context_length)
    writer.add_embedding_length(h)
    writer.add_block_count(shape.num_layers)
    writer.add_feed_forward_length(inter)
    writer.add_expert_feed_forward_length(inter)
    writer.add_head_count(shape.num_heads)
    writer.add_head_count_kv(shape.num_kv_heads)
    writer.add_key_length(d)
    writer.add_value_length(d)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(1000000.0)
    writer.add_expert_count(shape.num_experts)
    writer.add_expert_used_count(shape.top_k)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    tokens, merges = vocabulary(shape.vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))
    writer.add_token_merges(merges)
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    q4k, q6k = gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q6_K
    tensors = _tensors(shape)
    for name, dims, kind in tensors:  # the header first: every tensor's name, type and byte shape
        if kind == "f32":
            writer.add_tensor_info(name, dims, np.dtype(np.float32), 4 * int(np.prod(dims)))
            continue
        block_bytes, qtype = (Q4_K_BYTES, q4k) if kind == "q4_k" else (Q6_K_BYTES, q6k)
        byte_shape = (*dims[:-1], dims[-1] // SUPER_K * block_bytes)
        writer.add_tensor_info(name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=qtype)
    writer.write_header_to_file(path)
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for name, dims, kind in tensors:  # then the data, one tensor at a time
        writer.write_tensor_data(_random_tensor(rng, name, dims, kind))
    writer.close()


def _tensors(shape: MoeShape) -> list[tuple[str, tuple[int, ...], str]]:
    """(GGUF name, torch-order shape, kind: q4_k / q6_k / f32) of every tensor, in file order."""
    h, d, inter, e = shape.hidden_size, shape.head_dim, shape.moe_intermediate_size, shape.num_experts
    q, kv = shape.num_heads * d, shape.num_kv_heads * d
    out: list[tuple[str, tuple[int, ...], str]] = [("token_embd.weight", (shape.vocab_size, h), "q4_k")]
    for i in range(shape.num_layers):
        p = f"blk.{i}."
        out += [(p + "attn_norm.weight", (h,), "f32"), (p + "attn_q.weight", (q, h), "q4_k"),
                (p + "attn_k.weight", (kv, h), "q4_k"), (p + "attn_v.weight", (kv, h), "q4_k"),
                (p + "attn_output.weight", (h, q), "q4_k"), (p + "attn_q_norm.weight", (d,), "f32"),
                (p + "attn_k_norm.weight", (d,), "f32"), (p + "ffn_norm.weight", (h,), "f32"),
                (p + "ffn_gate_inp.weight", (e, h), "f32"), (p + "ffn_gate_exps.weight", (e, inter, h), "q4_k"),
                (p + "ffn_up_exps.weight", (e, inter, h), "q4_k"), (p + "ffn_down_exps.weight", (e, h, inter), "q4_k")]
    return out + [("output_norm.weight", (h,), "f32"), ("output.weight", (shape.vocab_size, h), "q6_k")]


def _random_tensor(rng: np.random.Generator, name: str, dims: tuple[int, ...], kind: str) -> np.ndarray:
    """The tensor's data: norms ~1, the router ~N(0, 0.05), blocks as random_q4_k / random_q6_k
    (the embedding's values within ~±1, the others' ~±0.05)."""
    rows = int(np.prod(dims[:-1]))
    if kind == "q6_k":
        return random_q6_k(rng, rows, dims[-1], 0.05)
    if kind == "q4_k":
        return random_q4_k(rng, rows, dims[-1], 1.0 if name == "token_embd.weight" else 0.05)
    if name.endswith("ffn_gate_inp.weight"):
        return (rng.standard_normal(dims) * 0.05).astype(np.float32)
    return (1.0 + 0.1 * rng.standard_normal(dims)).astype(np.float32)


def ensure_moe_gguf(shape: MoeShape = MoeShape(), seed: int = 0, out_dir: Path | None = None) -> Path:
    """The model of `shape` and `seed`, written once into `out_dir` (default <cache>/bench/moe/)."""
    if out_dir is None:
        from radixlm.runtime.model import model_files

        out_dir = model_files.cache_dir() / "bench" / "moe"
    target = out_dir / f"{shape.name}-seed{seed}.gguf"
    if target.is_file():
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    part = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        write_moe_gguf(part, shape, seed)
        os.replace(part, target)
    finally:
        part.unlink(missing_ok=True)
    return target


SHAPES = {
    "bench": MoeShape(),
    "qwen3-30b-a3b": MoeShape(num_layers=48, num_experts=128, vocab_size=151936, context_length=40960),
    "tiny": MoeShape(hidden_size=256, num_layers=2, num_experts=8, top_k=2, moe_intermediate_size=256, num_heads=4,
                     num_kv_heads=2, head_dim=64, vocab_size=512, context_length=2048),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m radixlm.runtime.bench.moe_model",
                                     description="write (once) a random Q4_K Qwen3-MoE GGUF and print its path")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="bench")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-dir", type=Path, default=None, help="default: <cache>/bench/moe/")
    args = parser.parse_args(argv)
    print(ensure_moe_gguf(SHAPES[args.shape], args.seed, args.cache_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
