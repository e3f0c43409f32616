"""Convert a llama-architecture GGUF file into an HF-style model directory (our own converter).

`convert_gguf(gguf_path, out_dir)` writes into an existing, empty `out_dir`:
  config.json             LlamaForCausalLM config built from the `llama.*` / `tokenizer.ggml.*` metadata
  model.safetensors       every tensor dequantized to float32, under HF Llama names
  quantized_blocks.safetensors  the Q8_0 / Q4_0 / Q4_1 tensors as the file stores them (uint8
                          rows of blocks, q/k rows un-permuted), under HF names, their formats in
                          the metadata: what the runtime keeps quantized (model_files.load_quantized)
  tokenizer.json          built by transformers' GGUF tokenizer converter (+ pre-tokenizer fix below)
  tokenizer_config.json   with the GGUF's `chat_template`, special tokens and `add_bos_token`
  generation_config.json  bos / eos / pad ids
Any problem with the file raises `ModelLoadError` naming the file; the caller (model_files) owns
the atomic placement of `out_dir` in the cache, so a failure here leaves nothing behind there.

Heavy imports (torch, gguf, transformers) happen inside the functions, so that importing
`radixlm.runtime.model.model_files` (which imports this module lazily anyway) stays cheap.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from radixlm.runtime.model.model_files import QUANTIZED_FILE, ModelLoadError

if TYPE_CHECKING:
    import torch
    from gguf import GGUFReader

SUPPORTED_ARCHITECTURES = ("llama",)

# llama.cpp tensor names -> HF Llama names. Per-layer names are `blk.N.<key>.weight`.
_GLOBAL_TENSOR_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_TENSOR_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_LAYER_TENSOR_RE = re.compile(r"blk\.(\d+)\.(\w+)\.weight")

# llama.cpp pre-tokenizer types whose text split is "each digit alone, then the GPT-2 regex"
# (llama-vocab.cpp: `\p{N}` then the GPT-2 pattern). transformers' GGUF converter does not know
# them and would keep plain GPT-2 splitting, which differs e.g. on "a  1" (spaces before a digit).
_DIGIT_SPLIT_PRE_TYPES = frozenset({"smollm", "starcoder", "refact", "codeshell"})


@dataclass(frozen=True)
class LlamaMetadata:
    """The GGUF metadata a Llama config, tokenizer config and generation config need."""

    context_length: int
    hidden_size: int
    num_layers: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int
    bos_token_id: int | None
    eos_token_id: int | None
    pad_token_id: int | None
    unk_token_id: int | None
    add_bos_token: bool
    chat_template: str | None
    tokenizer_pre: str | None


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Write the HF-style files for `gguf_path` into the existing directory `out_dir`."""
    import torch
    from safetensors.torch import save_file

    reader = open_gguf(gguf_path)
    meta = read_llama_metadata(reader, gguf_path)
    tensors = read_llama_tensors(reader, meta, gguf_path)
    blocks, formats = read_quantized_blocks(reader, meta)
    is_tied = "lm_head.weight" not in tensors
    del reader  # drop the memmap before the big write
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    del tensors
    if blocks:
        save_file(blocks, str(out_dir / QUANTIZED_FILE), metadata={"format": "pt", "formats": json.dumps(formats)})
    _write_json(out_dir / "config.json", hf_llama_config(meta, is_tied=is_tied, dtype=torch.float32))
    _write_json(out_dir / "generation_config.json", _generation_config(meta))
    write_tokenizer(gguf_path, out_dir, meta)


def open_gguf(gguf_path: Path) -> GGUFReader:
    """A reader over the whole file, or ModelLoadError if the file is not a complete GGUF."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(gguf_path)
    except Exception as e:  # gguf raises bare ValueErrors ("cannot reshape ...") on truncation
        raise ModelLoadError(f"{gguf_path}: not a readable GGUF file (truncated or corrupt?): {e}") from e
    file_size = gguf_path.stat().st_size
    for tensor in reader.tensors:
        if tensor.data_offset + tensor.n_bytes > file_size:
            raise ModelLoadError(f"{gguf_path}: truncated GGUF file (tensor {tensor.name} ends past the end)")
    return reader


_REQUIRED = object()


def _field(reader: GGUFReader, key: str, default: Any = _REQUIRED) -> Any:
    """The value of metadata `key`; KeyError if it is absent and has no default."""
    field = reader.fields.get(key)
    if field is None:
        if default is _REQUIRED:
            raise KeyError(key)
        return default
    return field.contents()


def read_llama_metadata(reader: GGUFReader, gguf_path: Path) -> LlamaMetadata:
    """Check the architecture is supported and read its hyperparameters from the metadata."""
    try:
        return _read_llama_metadata(reader, gguf_path)
    except KeyError as e:
        raise ModelLoadError(f"{gguf_path}: GGUF metadata key {e.args[0]!r} is missing") from e


def _read_llama_metadata(reader: GGUFReader, gguf_path: Path) -> LlamaMetadata:
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(f"{gguf_path}: unsupported GGUF architecture {arch!r} (supported: llama)")
    if _field(reader, "llama.expert_count", 0):
        raise ModelLoadError(f"{gguf_path}: unsupported GGUF model: mixture-of-experts llama")
    scaling = _field(reader, "llama.rope.scaling.type", "none")
    if scaling != "none":
        raise ModelLoadError(f"{gguf_path}: unsupported GGUF rope scaling {scaling!r}")
    hidden = int(_field(reader, "llama.embedding_length"))
    num_heads = int(_field(reader, "llama.attention.head_count"))
    head_dim = int(_field(reader, "llama.attention.key_length", hidden // num_heads))
    if int(_field(reader, "llama.rope.dimension_count", head_dim)) != head_dim:
        raise ModelLoadError(f"{gguf_path}: unsupported GGUF model: partial rotary embedding")
    tokens_field = reader.fields.get("tokenizer.ggml.tokens")
    n_tokens = len(tokens_field.data) if tokens_field is not None else None
    bos, eos, pad, unk = (
        _field(reader, f"tokenizer.ggml.{k}_token_id", None) for k in ("bos", "eos", "padding", "unknown")
    )
    return LlamaMetadata(
        context_length=int(_field(reader, "llama.context_length")),
        hidden_size=hidden,
        num_layers=int(_field(reader, "llama.block_count")),
        intermediate_size=int(_field(reader, "llama.feed_forward_length")),
        num_heads=num_heads,
        num_kv_heads=int(_field(reader, "llama.attention.head_count_kv", num_heads)),
        head_dim=head_dim,
        rms_norm_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        rope_theta=float(_field(reader, "llama.rope.freq_base", 10000.0)),
        vocab_size=int(_field(reader, "llama.vocab_size", n_tokens)),
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=pad,
        unk_token_id=unk,
        add_bos_token=bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
        chat_template=_field(reader, "tokenizer.chat_template", None),
        tokenizer_pre=_field(reader, "tokenizer.ggml.pre", None),
    )


def hf_tensor_name(gguf_name: str) -> str | None:
    """The HF Llama name of a llama.cpp tensor name, or None if it has none."""
    if gguf_name in _GLOBAL_TENSOR_NAMES:
        return _GLOBAL_TENSOR_NAMES[gguf_name]
    match = _LAYER_TENSOR_RE.fullmatch(gguf_name)
    if match is None or match.group(2) not in _LAYER_TENSOR_NAMES:
        return None
    return f"model.layers.{match.group(1)}.{_LAYER_TENSOR_NAMES[match.group(2)]}.weight"


def expected_shapes(meta: LlamaMetadata) -> dict[str, tuple[int, ...]]:
    """HF name -> shape (torch order: [out_features, in_features]) of every Llama weight."""
    h, f, d = meta.hidden_size, meta.intermediate_size, meta.head_dim
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (meta.vocab_size, h),
        "model.norm.weight": (h,),
        "lm_head.weight": (meta.vocab_size, h),
    }
    per_layer = {
        "self_attn.q_proj": (meta.num_heads * d, h),
        "self_attn.k_proj": (meta.num_kv_heads * d, h),
        "self_attn.v_proj": (meta.num_kv_heads * d, h),
        "self_attn.o_proj": (h, meta.num_heads * d),
        "mlp.gate_proj": (f, h),
        "mlp.up_proj": (f, h),
        "mlp.down_proj": (h, f),
        "input_layernorm": (h,),
        "post_attention_layernorm": (h,),
    }
    for layer in range(meta.num_layers):
        for name, shape in per_layer.items():
            shapes[f"model.layers.{layer}.{name}.weight"] = shape
    return shapes


def undo_rope_permute(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Inverse of llama.cpp's convert-time row permutation of a q_proj / k_proj weight.

    HF Llama rotates the pairs (i, i + d/2) of each head (rotate_half); llama.cpp rotates
    adjacent pairs (2i, 2i + 1), so its converter reorders each head's d rows as
        gguf_row[h*d + 2*i + j] = hf_row[h*d + j*(d/2) + i]     (j in {0, 1}, i < d/2)
    i.e. `w.reshape(heads, 2, d/2, in).swapaxes(1, 2)`. Undoing it: view the GGUF rows as
    (heads, d/2, 2), swap the last two axes back. `num_heads` is the KV head count for k_proj.
    """
    rows, cols = weight.shape
    half = rows // num_heads // 2
    return weight.reshape(num_heads, half, 2, cols).transpose(1, 2).reshape(rows, cols).contiguous()


def read_llama_tensors(reader: GGUFReader, meta: LlamaMetadata, gguf_path: Path) -> dict[str, torch.Tensor]:
    """All tensors dequantized to float32 CPU tensors under HF names, q/k rows un-permuted.

    Shapes are checked against `meta`: GGUF lists dimensions innermost first, and the numpy
    arrays gguf hands back are already in row-major order (reversed GGUF shape) = torch order.
    """
    import numpy as np
    import torch
    from gguf.quants import dequantize

    shapes = expected_shapes(meta)
    tensors: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        name = hf_tensor_name(t.name)
        if name is None or name not in shapes:
            raise ModelLoadError(f"{gguf_path}: unexpected tensor {t.name!r} for a llama model")
        shape = tuple(int(dim) for dim in reversed(t.shape.tolist()))
        if shape != shapes[name]:
            raise ModelLoadError(f"{gguf_path}: tensor {t.name} has shape {shape}, expected {shapes[name]}")
        try:
            values = dequantize(t.data, t.tensor_type)
        except (NotImplementedError, ValueError) as e:
            raise ModelLoadError(
                f"{gguf_path}: cannot dequantize {t.name} ({t.tensor_type.name}): {e}"
            ) from e
        tensor = torch.from_numpy(np.array(values, dtype=np.float32).reshape(shape))  # a copy, off the memmap
        if name.endswith("q_proj.weight"):
            tensor = undo_rope_permute(tensor, meta.num_heads)
        elif name.endswith("k_proj.weight"):
            tensor = undo_rope_permute(tensor, meta.num_kv_heads)
        tensors[name] = tensor
    missing = sorted(set(shapes) - set(tensors) - {"lm_head.weight"})
    if missing:
        raise ModelLoadError(f"{gguf_path}: GGUF file lacks {len(missing)} tensors, e.g. {missing[0]}")
    return tensors


KEPT_QUANTIZED = ("Q8_0", "Q4_0", "Q4_1")  # the block formats our kernels read (kernels/quant.py)


def read_quantized_blocks(reader: GGUFReader, meta: LlamaMetadata) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors in a format of KEPT_QUANTIZED as the file stores them: HF name -> uint8
    `[rows, bytes per row]` (q/k rows un-permuted, whole rows of blocks moved), and HF name ->
    format ("q4_1", ...). Shapes were checked by read_llama_tensors."""
    import numpy as np
    import torch

    blocks: dict[str, torch.Tensor] = {}
    formats: dict[str, str] = {}
    for t in reader.tensors:
        name = hf_tensor_name(t.name)
        if name is None or t.tensor_type.name not in KEPT_QUANTIZED:
            continue
        raw = torch.from_numpy(np.array(t.data, dtype=np.uint8))  # [rows, bytes]: a copy, off the memmap
        if name.endswith("q_proj.weight"):
            raw = undo_rope_permute(raw, meta.num_heads)
        elif name.endswith("k_proj.weight"):
            raw = undo_rope_permute(raw, meta.num_kv_heads)
        blocks[name] = raw
        formats[name] = t.tensor_type.name.lower()
    return blocks, formats


def hf_llama_config(meta: LlamaMetadata, *, is_tied: bool, dtype: torch.dtype) -> dict[str, Any]:
    """A transformers-loadable LlamaForCausalLM config.json (rope given in both old and new keys)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": meta.hidden_size,
        "intermediate_size": meta.intermediate_size,
        "num_hidden_layers": meta.num_layers,
        "num_attention_heads": meta.num_heads,
        "num_key_value_heads": meta.num_kv_heads,
        "head_dim": meta.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": meta.context_length,
        "rms_norm_eps": meta.rms_norm_eps,
        "rope_theta": meta.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": meta.rope_theta},
        "attention_bias": False,
        "mlp_bias": False,
        "vocab_size": meta.vocab_size,
        "tie_word_embeddings": is_tied,
        "bos_token_id": meta.bos_token_id,
        "eos_token_id": meta.eos_token_id,
        "pad_token_id": meta.pad_token_id,
        "torch_dtype": str(dtype).removeprefix("torch."),
        "use_cache": True,
    }


def _generation_config(meta: LlamaMetadata) -> dict[str, Any]:
    ids = {
        "bos_token_id": meta.bos_token_id,
        "eos_token_id": meta.eos_token_id,
        "pad_token_id": meta.pad_token_id,
    }
    return {key: value for key, value in ids.items() if value is not None}


def write_tokenizer(gguf_path: Path, out_dir: Path, meta: LlamaMetadata) -> None:
    """Build the tokenizer from the GGUF vocabulary (via transformers) and save it to `out_dir`.

    Afterwards tokenizer_config.json carries the chat template (no separate chat_template.jinja),
    `add_bos_token` as the GGUF states it, and `model_max_length` = the context length.
    """
    from tokenizers import pre_tokenizers
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(
            str(gguf_path.parent), gguf_file=str(gguf_path), local_files_only=True
        )
    except Exception as e:
        raise ModelLoadError(f"{gguf_path}: cannot build a tokenizer from the GGUF metadata: {e}") from e
    if meta.tokenizer_pre in _DIGIT_SPLIT_PRE_TYPES:
        tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    if meta.eos_token_id is not None and tokenizer.eos_token_id != meta.eos_token_id:
        raise ModelLoadError(f"{gguf_path}: tokenizer eos id {tokenizer.eos_token_id} != {meta.eos_token_id}")
    tokenizer.save_pretrained(str(out_dir))
    (out_dir / "chat_template.jinja").unlink(missing_ok=True)
    config_path = out_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    for key in ("is_local", "local_files_only", "name_or_path"):
        config.pop(key, None)
    config.update(add_bos_token=meta.add_bos_token, add_eos_token=False, model_max_length=meta.context_length)
    if meta.chat_template is not None:
        config["chat_template"] = meta.chat_template
    _write_json(config_path, config)


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
