"""Convert a GGUF file (or a split GGUF's shards) into an HF-style model directory (our own converter).

`convert_gguf(gguf_path, out_dir)` writes into an existing, empty `out_dir`:
  config.json             the config transformers' class of the file's family holds (gguf_config)
  model.safetensors       every weight our kernels do not read quantized, dequantized to float32 under the
                          HF checkpoint names of that family (gguf_arch): q/k rows un-permuted where
                          llama.cpp permuted them, Gemma norms back from 1 + w to w, stacked experts
                          split per expert (past SHARD_BYTES: model-0000i-of-0000n.safetensors + index)
  gguf_quantized.json     the others (GGUF type, lower-cased, in kernels.quant.FORMATS): where each
                          one's blocks lie in the file, under the same HF names (experts split into
                          their slices, q/k rows to un-permute), and the identity of the file's
                          shards: no copy of them is written; the load reads them from the GGUF
                          (gguf_tensors, model_files.load_quantized)
  tokenizer.json          built by transformers' GGUF tokenizer converter (+ pre-tokenizer fix below)
  tokenizer_config.json   with the GGUF's `chat_template`, special tokens and `add_bos_token`
  generation_config.json  bos / eos / pad ids
`gguf_path` may be the first shard of a split file (`*-00001-of-0000N.gguf`): metadata come from
it, tensors from all shards. Any problem raises `ModelLoadError` naming the file; the caller
(model_files) owns the atomic placement of `out_dir` in the cache, so a failure leaves nothing there.

Heavy imports (torch, gguf, transformers) happen inside the functions, so that importing
`radixlm.runtime.model.model_files` (which imports this module lazily anyway) stays cheap.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from radixlm.runtime.model.gguf_arch import CONFIG_TENSORS, GLOBAL_TENSOR_NAMES, GgufArch
from radixlm.runtime.model.gguf_config import GgufMetadata, read_metadata
from radixlm.runtime.model.model_files import ModelLoadError, gguf_shard_paths

if TYPE_CHECKING:
    import numpy as np
    import torch
    from gguf import GGUFReader
    from gguf.gguf_reader import ReaderTensor

    from radixlm.runtime.model.gguf_tensors import TensorLocation

_LAYER_TENSOR_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
# Mixtral files of early 2024 (older llama.cpp) store each expert apart: blk.N.ffn_gate.E.weight
_LEGACY_EXPERT_RE = re.compile(r"blk\.(\d+)\.(ffn_gate|ffn_up|ffn_down)\.(\d+)\.weight")

# llama.cpp pre-tokenizer types whose text split is "each digit alone, then the GPT-2 regex"
# (llama-vocab.cpp: `\p{N}` then the GPT-2 pattern). transformers' GGUF converter does not know
# them and would keep plain GPT-2 splitting, which differs e.g. on "a  1" (spaces before a digit).
_DIGIT_SPLIT_PRE_TYPES = frozenset({"smollm", "starcoder", "refact", "codeshell"})

_REQUIRED = object()


@dataclass(frozen=True)
class GgufFile:
    """An open GGUF: one reader per shard (one for an unsplit file); metadata live in the first."""

    paths: tuple[Path, ...]
    readers: tuple[GGUFReader, ...]

    def get(self, key: str, default: Any = _REQUIRED) -> Any:
        """The value of metadata `key`; KeyError if it is absent and has no default."""
        field = self.readers[0].fields.get(key)
        if field is None:
            if default is _REQUIRED:
                raise KeyError(key)
            return default
        return field.contents()

    def tensors(self) -> Iterator[ReaderTensor]:
        for reader in self.readers:
            yield from reader.tensors


SHARD_BYTES = 2 << 30  # float weights per model-*.safetensors shard: bounds the conversion's memory


def convert_gguf(gguf_path: Path, out_dir: Path, shard_bytes: int = SHARD_BYTES) -> None:
    """Write the HF-style files for `gguf_path` into the existing directory `out_dir`. The float
    weights go to model.safetensors, or to shards of about `shard_bytes` with an index when larger."""
    from radixlm.runtime.model.gguf_tensors import write_index

    gguf = open_gguf(gguf_path)
    meta = read_gguf_metadata(gguf)
    locations = quantized_locations(gguf, meta)
    shapes = write_float_weights(iter_tensors(gguf, meta, set(locations)), out_dir, shard_bytes)
    check_shapes({**shapes, **{name: (loc.rows, loc.k) for name, loc in locations.items()}}, meta, gguf.paths[0])
    if locations:
        write_index(out_dir, list(gguf.paths), locations)
    _write_json(out_dir / "config.json", meta.config)
    _write_json(out_dir / "generation_config.json", _generation_config(meta))
    write_tokenizer(gguf_path, out_dir, meta)


def write_float_weights(
    tensors: Iterator[tuple[str, torch.Tensor]], out_dir: Path, shard_bytes: int
) -> dict[str, tuple[int, ...]]:
    """Save `tensors` as model.safetensors, or as model-0000i-of-0000n.safetensors shards of about
    `shard_bytes` each plus model.safetensors.index.json; returns name -> shape. Holds one shard in memory."""
    from safetensors.torch import save_file

    shapes: dict[str, tuple[int, ...]] = {}
    shards: list[list[str]] = []
    pending: dict[str, torch.Tensor] = {}
    pending_bytes = 0

    def flush() -> None:
        nonlocal pending, pending_bytes
        save_file(pending, str(out_dir / f".shard-{len(shards)}.safetensors"), metadata={"format": "pt"})
        shards.append(list(pending))
        pending, pending_bytes = {}, 0

    for name, tensor in tensors:
        if name in shapes:
            raise ModelLoadError(f"{out_dir}: two GGUF tensors map to {name}")
        shapes[name] = tuple(tensor.shape)
        if pending and pending_bytes + tensor.nbytes > shard_bytes:
            flush()
        pending[name] = tensor
        pending_bytes += tensor.nbytes
    flush()
    if len(shards) == 1:
        (out_dir / ".shard-0.safetensors").rename(out_dir / "model.safetensors")
        return shapes
    weight_map = {}
    for number, names in enumerate(shards):
        file = f"model-{number + 1:05d}-of-{len(shards):05d}.safetensors"
        (out_dir / f".shard-{number}.safetensors").rename(out_dir / file)
        weight_map.update(dict.fromkeys(names, file))
    _write_json(out_dir / "model.safetensors.index.json", {"metadata": {}, "weight_map": weight_map})
    return shapes


def open_gguf(gguf_path: Path) -> GgufFile:
    """Readers over the file (and its other shards, if split), or ModelLoadError if any is not a
    complete GGUF or the shards do not form one model."""
    paths = gguf_shard_paths(gguf_path)
    readers = tuple(_open_one(path) for path in paths)
    count = readers[0].fields.get("split.count")
    expected = int(count.contents()) if count is not None else 1
    if expected != len(paths):
        raise ModelLoadError(f"{gguf_path}: the file says it is one of {expected} shards, found {len(paths)}")
    for number, (path, reader) in enumerate(zip(paths, readers)):
        field = reader.fields.get("split.no")
        if expected > 1 and (field is None or int(field.contents()) != number):
            raise ModelLoadError(f"{path}: not shard {number + 1} of {expected} of {gguf_path.name}")
    total = readers[0].fields.get("split.tensors.count")
    if total is not None and int(total.contents()) != sum(len(r.tensors) for r in readers):
        raise ModelLoadError(f"{gguf_path}: the shards hold fewer tensors than the file says ({total.contents()})")
    return GgufFile(paths, readers)


def _open_one(path: Path) -> GGUFReader:
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
    except Exception as e:  # gguf raises bare ValueErrors ("cannot reshape ...") on truncation
        raise ModelLoadError(f"{path}: not a readable GGUF file (truncated or corrupt?): {e}") from e
    file_size = path.stat().st_size
    for tensor in reader.tensors:
        if tensor.data_offset + tensor.n_bytes > file_size:
            raise ModelLoadError(f"{path}: truncated GGUF file (tensor {tensor.name} ends past the end)")
    return reader


def read_gguf_metadata(gguf: GgufFile) -> GgufMetadata:
    """The file's architecture, HF config and tokenizer facts (gguf_config.read_metadata)."""
    config_tensors = {t.name: _dequantized(t, gguf.paths[0]).reshape(-1) for t in gguf.tensors() if t.name in CONFIG_TENSORS}
    shapes = {t.name: tuple(int(dim) for dim in reversed(t.shape.tolist())) for t in gguf.tensors()}
    return read_metadata(gguf.get, config_tensors, shapes, str(gguf.paths[0]))


def hf_names(gguf_name: str, arch: GgufArch, num_experts: int) -> list[str] | None:
    """The HF names of a llama.cpp tensor (several for stacked experts, in expert order), or None."""
    if gguf_name in GLOBAL_TENSOR_NAMES:
        return [GLOBAL_TENSOR_NAMES[gguf_name]]
    legacy = _LEGACY_EXPERT_RE.fullmatch(gguf_name)
    if legacy is not None and arch.expert_names and int(legacy[3]) < num_experts:
        module = arch.expert_names[f"{legacy[2]}_exps"]
        return [f"model.layers.{legacy[1]}.{module.format(e=int(legacy[3]))}.weight"]
    match = _LAYER_TENSOR_RE.fullmatch(gguf_name)
    if match is None:
        return None
    layer, key, suffix = match.groups()
    if key in arch.layer_names:
        return [f"model.layers.{layer}.{arch.layer_names[key]}.{suffix}"]
    if key in arch.expert_names:
        module = arch.expert_names[key]
        return [f"model.layers.{layer}.{module.format(e=e)}.{suffix}" for e in range(num_experts)]
    return None


def undo_rope_permute(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Inverse of llama.cpp's convert-time row permutation of a q_proj / k_proj weight (or bias).

    HF Llama rotates the pairs (i, i + d/2) of each head (rotate_half); llama.cpp rotates
    adjacent pairs (2i, 2i + 1), so its converter reorders each head's d rows as
        gguf_row[h*d + 2*i + j] = hf_row[h*d + j*(d/2) + i]     (j in {0, 1}, i < d/2)
    i.e. `w.reshape(heads, 2, d/2, in).swapaxes(1, 2)`. Undoing it: view the GGUF rows as
    (heads, d/2, 2), swap the last two axes back. `num_heads` is the KV head count for k_proj.
    """
    rows, rest = weight.shape[0], weight.shape[1:]
    half = rows // num_heads // 2
    return weight.reshape(num_heads, half, 2, *rest).transpose(1, 2).reshape(weight.shape).contiguous()


def _fix_rows(tensor: torch.Tensor, hf_name: str, meta: GgufMetadata) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation where its converter applied one (rows of any dtype)."""
    heads = _permute_heads(hf_name, meta)
    return undo_rope_permute(tensor, heads) if heads else tensor


def _dequantized(t: ReaderTensor, path: Path) -> np.ndarray:
    import numpy as np
    from gguf.quants import dequantize

    shape = tuple(int(dim) for dim in reversed(t.shape.tolist()))
    try:
        values = dequantize(t.data, t.tensor_type)
    except (NotImplementedError, ValueError) as e:
        raise ModelLoadError(f"{path}: cannot dequantize {t.name} ({t.tensor_type.name}): {e}") from e
    return np.array(values, dtype=np.float32).reshape(shape)  # a copy, off the memmap


def _split(tensor: torch.Tensor, names: list[str], where: str) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, tensor) pairs: a stacked-experts tensor [n_expert, ...] split along its first axis."""
    if len(names) == 1:
        yield names[0], tensor
        return
    if tensor.dim() < 2 or tensor.shape[0] != len(names):
        raise ModelLoadError(f"{where}: holds {tensor.shape[0]} experts, the metadata says {len(names)}")
    for name, part in zip(names, tensor.unbind(0)):
        yield name, part.contiguous()


def iter_tensors(gguf: GgufFile, meta: GgufMetadata, skip: AbstractSet[str] = frozenset()) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, weight) for every weight but those named in `skip` (a tensor of which all are
    skipped is not read), dequantized to float32 CPU tensors, one GGUF tensor at a
    time: q/k rows un-permuted, Gemma norms back to w, stacked experts split. GGUF lists dimensions
    innermost first; the numpy arrays gguf hands back are already row-major (reversed GGUF shape) =
    torch order. Names are not checked against the config here (check_shapes does that)."""
    import torch

    path = gguf.paths[0]
    for t in gguf.tensors():
        if t.name in CONFIG_TENSORS:
            continue
        names = hf_names(t.name, meta.arch, meta.num_experts)
        if names is None:
            raise ModelLoadError(f"{path}: unexpected tensor {t.name!r} for a {meta.arch.gguf_arch} model")
        if all(name in skip for name in names):
            continue
        tensor = torch.from_numpy(_dequantized(t, path))
        for name, part in _split(tensor, names, f"{path}: tensor {t.name}"):
            part = _fix_rows(part, name, meta)
            if meta.arch.is_norm_plus_one and name.endswith("norm.weight"):
                part = part - 1.0
            yield name, part


def check_shapes(shapes: dict[str, tuple[int, ...]], meta: GgufMetadata, path: Path) -> None:
    """Every weight of the HF model is present with its shape, and nothing else (experts: the
    per-expert names are checked against the fused expert parameters transformers builds)."""
    expected = expected_shapes(meta)
    for name, shape in expected.items():
        if name not in shapes:
            if name == "lm_head.weight" and meta.config.get("tie_word_embeddings"):
                continue
            raise ModelLoadError(f"{path}: GGUF file lacks the tensor for {name}")
        if shapes[name] != shape:
            raise ModelLoadError(f"{path}: {name} has shape {shapes[name]}, expected {shape}")
    extra = sorted(set(shapes) - set(expected))
    if extra:
        raise ModelLoadError(f"{path}: unexpected tensor {extra[0]} for this {meta.arch.architecture} config")


def expected_shapes(meta: GgufMetadata) -> dict[str, tuple[int, ...]]:
    """HF checkpoint name -> shape of every weight of the model `meta.config` describes: the
    transformers model built on the meta device, its fused expert parameters ([n, 2f, h] gate_up,
    [n, h, f] down) spelled as the per-expert names of the checkpoints."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**{**meta.config, "model_type": meta.arch.model_type})
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    shapes: dict[str, tuple[int, ...]] = {}
    for name, tensor in model.state_dict().items():
        shape = tuple(tensor.shape)
        if name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
            prefix = name.rsplit(".", 1)[0]
            kind = name.rsplit(".", 1)[1]
            shapes.update(_expert_shapes(meta.arch, prefix, kind, shape))
        else:
            for old, new in meta.arch.checkpoint_renames.items():
                name = name.replace(old, new)
            shapes[name] = shape
    return shapes


def _expert_shapes(arch: GgufArch, prefix: str, kind: str, shape: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
    layer = prefix.split(".")[2]
    num, rows, cols = shape
    modules = arch.expert_names
    if kind == "gate_up_proj":
        keys, row_shape = ("ffn_gate_exps", "ffn_up_exps"), (rows // 2, cols)
    else:
        keys, row_shape = ("ffn_down_exps",), (rows, cols)
    return {
        f"model.layers.{layer}.{modules[key].format(e=e)}.weight": row_shape for key in keys for e in range(num)
    }


def quantized_locations(gguf: GgufFile, meta: GgufMetadata) -> dict[str, TensorLocation]:
    """HF name -> where its blocks lie, for every tensor in a format of kernels.quant.FORMATS: a
    stacked-experts tensor gives each expert its slice, q/k rows carry the permutation to undo.
    Reads no tensor data."""
    from radixlm.kernels.quant import FORMATS
    from radixlm.runtime.model.gguf_tensors import TensorLocation

    locations: dict[str, TensorLocation] = {}
    for shard, reader in enumerate(gguf.readers):
        for t in reader.tensors:
            fmt = t.tensor_type.name.lower()
            names = hf_names(t.name, meta.arch, meta.num_experts)
            shape = tuple(int(dim) for dim in reversed(t.shape.tolist()))  # ([experts,] rows, k)
            if names is None or fmt not in FORMATS or len(shape) != (3 if len(names) > 1 else 2):
                continue  # not ours, or not kept quantized (vectors are dequantized with the float weights)
            if len(names) > 1 and shape[0] != len(names):
                raise ModelLoadError(f"{gguf.paths[0]}: tensor {t.name} holds {shape[0]} experts, "
                                     f"the metadata says {len(names)}")
            rows, per_part = shape[-2], int(t.n_bytes) // len(names)
            for e, name in enumerate(names):
                locations[name] = TensorLocation(shard, int(t.data_offset) + e * per_part, rows, per_part // rows,
                                                 fmt, _permute_heads(name, meta))
    return locations


def _permute_heads(hf_name: str, meta: GgufMetadata) -> int:
    """The heads over which llama.cpp permuted this weight's rows (_fix_rows), or 0."""
    if not meta.arch.is_rope_permuted:
        return 0
    if ".q_proj." in hf_name:
        return meta.num_heads
    if ".k_proj." in hf_name:
        return meta.num_kv_heads
    return 0


def _generation_config(meta: GgufMetadata) -> dict[str, Any]:
    ids = {
        "bos_token_id": meta.bos_token_id,
        "eos_token_id": meta.eos_token_id,
        "pad_token_id": meta.pad_token_id,
    }
    return {key: value for key, value in ids.items() if value is not None}


def write_tokenizer(gguf_path: Path, out_dir: Path, meta: GgufMetadata) -> None:
    """Build the tokenizer from the GGUF vocabulary (via transformers) and save it to `out_dir`.

    Afterwards tokenizer_config.json carries the chat template (no separate chat_template.jinja),
    `add_bos_token` as the GGUF states it, and `model_max_length` = the context length.
    """
    from tokenizers import pre_tokenizers
    from transformers import TokenizersBackend

    # The backend class directly: AutoTokenizer would first ask transformers' GGUF model loader
    # for a config, which refuses architectures it cannot load (olmo2, granite, ...); the
    # tokenizer it builds is this class for every architecture anyway.
    try:
        tokenizer = TokenizersBackend.from_pretrained(
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
    _make_bos_agree(tokenizer, meta.add_bos_token, meta.bos_token_id)
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


def _make_bos_agree(tokenizer: Any, add_bos: bool, bos_id: int | None) -> None:
    """Make `tokenizer.encode` add BOS iff the file says llama.cpp does (transformers' builder adds
    it to every sentencepiece vocabulary, whatever the file's `add_bos_token`)."""
    from tokenizers import processors

    if bos_id is None:
        return
    adds_bos = tokenizer.backend_tokenizer.encode("a", add_special_tokens=True).ids[:1] == [bos_id]
    if adds_bos == add_bos:
        return
    bos = tokenizer.convert_ids_to_tokens(bos_id)
    if add_bos:
        template = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B:1", special_tokens=[(bos, bos_id)])
    else:
        template = processors.TemplateProcessing(single="$A", pair="$A $B:1", special_tokens=[])
    current = tokenizer.backend_tokenizer.post_processor
    is_template = current is None or isinstance(current, processors.TemplateProcessing)
    tokenizer.backend_tokenizer.post_processor = template if is_template else processors.Sequence([current, template])


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
