"""A GGUF writer of our own for tests: tiny random-weight HF models of each family, written as
llama.cpp's converter would write them (names from gguf's own tables, its tensor transforms
redone here independently), with a tiny GPT-2-style BPE tokenizer and a ChatML template.

`FAMILIES`: family -> (transformers model_type, GGUF architecture, config overrides).
`tiny_family_model(family, out_dir)` saves the HF model (its checkpoint: the reference names).
`write_gguf(model_dir, path, arch, split_max_tensors=0)` writes the GGUF (F32 tensors).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from safetensors.torch import load_file

CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["h e", "l l", "Ġ w", "he ll"]
BOS_ID, EOS_ID = 1, 2

_TINY = dict(
    hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=False,
    bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=EOS_ID,
)
_MOE = dict(num_experts_per_tok=2)

# family -> (transformers model_type, GGUF architecture, config overrides of _TINY)
FAMILIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("llama", "llama", {}),
    "llama3": (  # Llama 3 rope scaling: llama.cpp stores it as the tensor rope_freqs; head_dim 64 puts
        "llama",  # 3 frequencies in the smooth band, enough to recover the parameters
        "llama",
        dict(
            head_dim=64, tie_word_embeddings=True, max_position_embeddings=1024,
            rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 256},
        ),
    ),
    "mistral": ("mistral", "llama", dict(sliding_window=None)),
    "mixtral": ("mixtral", "llama", dict(_MOE, num_local_experts=4)),
    "qwen2": ("qwen2", "qwen2", dict(rope_theta=1000000.0)),
    "qwen3": ("qwen3", "qwen3", dict(head_dim=32, tie_word_embeddings=True)),
    "qwen3_moe": ("qwen3_moe", "qwen3moe", dict(_MOE, num_experts=4, moe_intermediate_size=32, norm_topk_prob=True)),
    "gemma2": ("gemma2", "gemma2", dict(sliding_window=32, query_pre_attn_scalar=16, tie_word_embeddings=True)),
    "gemma3": (  # 6 layers: the 6th is global (llama.cpp's and transformers' default pattern)
        "gemma3_text",
        "gemma3",
        dict(sliding_window=32, query_pre_attn_scalar=16, tie_word_embeddings=True, num_hidden_layers=6),
    ),
    "phi3": (
        "phi3",
        "phi3",
        dict(
            head_dim=None,
            original_max_position_embeddings=128,
            rope_parameters={
                "rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
                "long_factor": [1.0, 1.5, 2.0, 3.0, 4.0, 5.0], "short_factor": [1.0, 1.0, 1.1, 1.2, 1.3, 1.4],
                "original_max_position_embeddings": 128,
            },
        ),
    ),
    "olmo2": ("olmo2", "olmo2", {}),
    "granite": (
        "granite",
        "granite",
        dict(embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.2, logits_scaling=4.0),
    ),
    "smollm3": ("smollm3", "smollm3", dict(num_hidden_layers=4)),  # layer 3 has no rope
    "olmoe": ("olmoe", "olmoe", dict(_MOE, num_experts=4, intermediate_size=32)),
}
# Families whose GGUF llama.cpp's converter writes with q/k rows permuted (its LlamaModel subclasses).
PERMUTED = frozenset({"llama", "llama3", "mistral", "mixtral", "granite", "smollm3"})


def byte_alphabet() -> list[str]:
    """GPT-2's printable spelling of the 256 bytes, in byte order."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    spelling, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            spelling[byte] = chr(byte)
        else:
            spelling[byte] = chr(256 + extra)
            extra += 1
    return [spelling[byte] for byte in range(256)]


def tiny_vocab() -> list[str]:
    return SPECIAL_TOKENS + byte_alphabet() + ["he", "ll", "Ġw", "hell"]


def tiny_family_model(family: str, out_dir: Path, seed: int = 0, **overrides: Any) -> torch.nn.Module:
    """A random-weight model of `family` (float32, eval), saved with save_pretrained to `out_dir`."""
    import transformers

    model_type, _, extra = FAMILIES[family]
    fields = {**_TINY, **extra, "vocab_size": len(tiny_vocab()), **overrides}
    if fields.get("head_dim") is None:
        fields.pop("head_dim")
    config = transformers.AutoConfig.for_model(model_type, **fields)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            scale = 0.3 if "norm" in name else 0.2  # norms random too, so a mix-up shows
            param.copy_(torch.randn_like(param) * scale + (1.0 if "norm" in name and not model_type.startswith("gemma") else 0.0))
    model.save_pretrained(out_dir, safe_serialization=True)
    return model


def llama_cpp_permute(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """What llama.cpp's convert_hf_to_gguf.py does to q/k rows (written here independently)."""
    rows = weight.shape[0]
    return weight.reshape(num_heads, 2, rows // num_heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def _checkpoint_tensors(model_dir: Path, family: str, config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors as llama.cpp's converter hands them to its writer: experts stacked
    (under the name without the expert index), q/k permuted, Gemma norms as 1 + w."""
    state = load_file(model_dir / "model.safetensors")
    stacked: dict[str, list[tuple[int, torch.Tensor]]] = {}
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        match = re.fullmatch(r"(.*\.experts)\.(\d+)\.(.*)", name)
        if match is not None:
            stacked.setdefault(f"{match[1]}.{match[3]}", []).append((int(match[2]), tensor))
            continue
        if family in PERMUTED and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = config["num_attention_heads"] if "q_proj" in name else config["num_key_value_heads"]
            tensor = llama_cpp_permute(tensor, heads)
        if family.startswith("gemma") and name.endswith("norm.weight"):
            tensor = tensor + 1.0
        out[name] = tensor
    for name, parts in stacked.items():
        out[name] = torch.stack([t for _, t in sorted(parts, key=lambda p: p[0])])
    return out


def write_gguf(
    model_dir: Path, path: Path, family: str, split_max_tensors: int = 0, tensor_types: dict[str, Any] | None = None,
    tokenizer: str = "bpe", add_bos_token: bool | None = None, legacy_experts: bool = False,
    edit_metadata: Callable[[dict[str, Any]], None] | None = None,
) -> list[Path]:
    """Write `model_dir`'s model as llama.cpp would; returns the files written (shards if split).
    `tensor_types`: GGUF name -> gguf.GGMLQuantizationType for tensors to quantize (with gguf's own
    quantizer; K-quants with ours), the rest stay F32. `tokenizer`: "bpe" (tiny_vocab) or "spm" (spm_vocab; the model's
    vocab_size must be len(SPM_VOCAB)). `legacy_experts`: each expert apart, `blk.N.ffn_gate.E.weight`
    (older llama.cpp's Mixtral files), not stacked. `edit_metadata(kv)` may change the key -> GGUFValue
    dict before it is written (tests of bad files)."""
    config = json.loads((model_dir / "config.json").read_text())
    arch_name = FAMILIES[family][1]
    arch = next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch_name)
    names = gguf.get_tensor_name_map(arch, config["num_hidden_layers"])
    writer = gguf.GGUFWriter(path, arch_name, split_max_tensors=split_max_tensors)
    _write_metadata(writer, config, family)
    if tokenizer == "spm":
        write_spm_tokenizer_metadata(writer, add_bos_token)
    else:
        write_tokenizer_metadata(writer, bool(add_bos_token))
    for name, tensor in _checkpoint_tensors(model_dir, family, config).items():
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if legacy_experts and tensor.dim() == 3:
            for e, part in enumerate(tensor):
                writer.add_tensor(gguf_name.replace("_exps.weight", f".{e}.weight"), part.numpy().astype(np.float32))
            continue
        assert gguf_name is not None, name
        _add_tensor(writer, gguf_name, tensor.numpy().astype(np.float32), (tensor_types or {}).get(gguf_name))
    for gguf_name, values in _rope_tensors(config).items():
        writer.add_tensor(gguf_name, values)
    if edit_metadata is not None:
        edit_metadata(writer.kv_data[0])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if split_max_tensors:
        return sorted(path.parent.glob(f"{path.stem}-*-of-*.gguf"))
    return [path]


def _add_tensor(writer: gguf.GGUFWriter, name: str, values: np.ndarray, qtype: Any) -> None:
    """`values` as F32, or quantized to `qtype`: by gguf's quantizer, or for the K-quants (which
    gguf cannot quantize) by our reference quantizer (kernels/kquants.py), row by row of blocks."""
    if qtype is None:
        writer.add_tensor(name, values)
        return
    from gguf.quants import quantize

    from radixlm.kernels import kquants

    fmt = qtype.name.lower()
    if fmt in kquants.KQUANTS:
        rows = values.reshape(-1, values.shape[-1])
        raw = kquants.quantize(torch.from_numpy(np.ascontiguousarray(rows)), fmt).numpy()
        writer.add_tensor(name, raw.reshape(*values.shape[:-1], raw.shape[-1]), raw_dtype=qtype)
        return
    writer.add_tensor(name, quantize(values, qtype), raw_dtype=qtype)


def llama3_rope_freqs(rope: dict[str, Any], head_dim: int) -> np.ndarray:
    """llama.cpp's converter's `rope_freqs` for Llama 3 rope scaling (written here independently):
    per frequency, the divisor of the frequency."""
    theta, factor, old = rope["rope_theta"], rope["factor"], rope["original_max_position_embeddings"]
    low, high = rope["low_freq_factor"], rope["high_freq_factor"]
    out = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * np.pi * theta ** (i / head_dim)
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def _rope_tensors(config: dict[str, Any]) -> dict[str, np.ndarray]:
    rope = config.get("rope_parameters") or {}
    if rope.get("rope_type") == "llama3":
        return {"rope_freqs.weight": llama3_rope_freqs(rope, config["head_dim"])}
    if rope.get("rope_type") != "longrope":
        return {}
    return {
        "rope_factors_long.weight": np.array(rope["long_factor"], dtype=np.float32),
        "rope_factors_short.weight": np.array(rope["short_factor"], dtype=np.float32),
    }


def _write_metadata(writer: gguf.GGUFWriter, cfg: dict[str, Any], family: str) -> None:
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    rope = cfg.get("rope_parameters") or {}
    rope = rope.get("full_attention", rope)
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(cfg["num_key_value_heads"])
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    writer.add_rope_freq_base(rope["rope_theta"])
    writer.add_rope_dimension_count(int(head_dim * rope.get("partial_rotary_factor", 1.0)))
    if family in ("granite", "olmoe"):  # most llama.cpp files have no vocab_size key: test both forms
        writer.add_vocab_size(cfg["vocab_size"])
    num_experts = cfg.get("num_local_experts") or cfg.get("num_experts")
    if num_experts:
        writer.add_expert_count(num_experts)
        writer.add_expert_used_count(cfg["num_experts_per_tok"])
    if family == "qwen3_moe":
        writer.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    if family.startswith("gemma"):
        writer.add_sliding_window(cfg["sliding_window"])
        if cfg.get("attn_logit_softcapping") is not None:
            writer.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
        if cfg.get("final_logit_softcapping") is not None:
            writer.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    if family == "phi3":
        writer.add_rope_scaling_orig_ctx_len(cfg["original_max_position_embeddings"])
    if family == "granite":
        writer.add_attention_scale(cfg["attention_multiplier"])
        writer.add_embedding_scale(cfg["embedding_multiplier"])
        writer.add_residual_scale(cfg["residual_multiplier"])
        writer.add_logit_scale(cfg["logits_scaling"])


def write_tokenizer_metadata(writer: gguf.GGUFWriter, add_bos_token: bool = False) -> None:
    """The tiny GPT-2-style BPE vocabulary, ChatML special tokens and template."""
    vocab = tiny_vocab()
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(vocab)
    writer.add_token_types([3] * len(SPECIAL_TOKENS) + [1] * (len(vocab) - len(SPECIAL_TOKENS)))
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(BOS_ID)
    writer.add_eos_token_id(EOS_ID)
    writer.add_pad_token_id(EOS_ID)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(add_bos_token)
    writer.add_chat_template(CHAT_TEMPLATE)


# A tiny SentencePiece-style BPE vocabulary (Llama 2 / Mistral shape: "▁" for spaces, byte fallback).
SPM_PIECES = ["▁", "h", "e", "l", "o", "w", "r", "d", "▁h", "he", "ll", "▁he", "▁hell", "▁hello", "▁w", "or", "▁wor",
              "▁worl", "▁world"]
SPM_MERGES = [("▁", "h"), ("h", "e"), ("l", "l"), ("▁h", "e"), ("▁he", "ll"), ("▁hell", "o"), ("▁", "w"), ("o", "r"),
              ("▁w", "or"), ("▁wor", "l"), ("▁worl", "d")]
SPM_VOCAB = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + SPM_PIECES


def spm_tokenizer(family: str = "mistral") -> Any:
    """The source tokenizer of SPM_VOCAB: transformers' Gemma tokenizer for Gemma, its Llama
    tokenizer (as Llama 2 / Mistral repos have) otherwise."""
    from transformers import GemmaTokenizer, LlamaTokenizer

    vocab = {t: i for i, t in enumerate(SPM_VOCAB)}
    if family.startswith("gemma"):
        return GemmaTokenizer(vocab=vocab, merges=SPM_MERGES, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                              pad_token="<unk>")
    return LlamaTokenizer(vocab=vocab, merges=SPM_MERGES)


def write_spm_tokenizer_metadata(writer: gguf.GGUFWriter, add_bos_token: bool | None = None) -> None:
    """SPM_VOCAB as llama.cpp writes a sentencepiece vocabulary: model "llama", a score per piece
    (a merged piece ranks by its merge; single characters below all merges), token types (2 unknown,
    3 control, 6 byte, 1 normal). `add_bos_token` None: no key (llama.cpp then adds BOS)."""
    merged = {a + b: i for i, (a, b) in enumerate(SPM_MERGES)}
    scores, types = [], []
    for index, token in enumerate(SPM_VOCAB):
        scores.append(-float(merged[token]) if token in merged else -1000.0 - index)
        types.append(2 if token == "<unk>" else 3 if token in ("<s>", "</s>") else 6 if token.startswith("<0x") else 1)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(SPM_VOCAB)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    if add_bos_token is not None:
        writer.add_add_bos_token(add_bos_token)
    writer.add_chat_template(CHAT_TEMPLATE)
