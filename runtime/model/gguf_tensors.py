"""A converted GGUF's quantized tensors, read from the GGUF file itself when the model takes them.

A conversion (gguf_convert) writes no copy of a tensor our kernels read quantized
(kernels.quant.FORMATS): it records in QUANTIZED_INDEX where each one's blocks lie in the file
(shard, byte offset, rows, bytes per row), its format, and the row permutation to undo (llama.cpp's
q/k RoPE permutation), together with the identity (path, size, mtime) of every shard. Loading
(`GgufQuantizedTensors`) then reads one tensor's bytes at a time, as the model asks for it:

    index (HF name -> location) --pread--> uint8 [rows, bytes per row] --rows un-permuted-->
    QuantizedTensor --model: quant.pack into our kernel layout--> the layer's packed weight

so a load holds the model's quantized bytes plus the tensor in flight, never a float copy. The
bytes are read with `os.preadv` into a fresh buffer rather than through a memory map: pages of a
map stay counted in the process's resident set while it lives, and the file is often as large
as the machine's memory; the kernel's page cache serves the reads either way.

`DequantizedTensors` gives the same tensors as float32, one at a time (gguf's own dequantizer),
for loads that need float weights (--quantization none, another format at load, no C++ kernels).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from radixlm.kernels.quant import FORMATS, QuantizedTensor
from radixlm.runtime.model.model_files import QUANTIZED_INDEX, ModelLoadError

_MAX_READ = 1 << 30  # bytes per preadv call (Linux reads at most ~2 GiB at once)


@dataclass(frozen=True)
class TensorLocation:
    """Where one HF-named quantized weight lies in a GGUF: `rows` rows of `row_bytes` bytes from
    byte `offset` of shard `shard`, in format `fmt`; `permute_heads` > 0: rows permuted by
    llama.cpp's converter over that many heads (gguf_convert.undo_rope_permute undoes it)."""

    shard: int
    offset: int
    rows: int
    row_bytes: int
    fmt: str
    permute_heads: int = 0

    @property
    def k(self) -> int:
        gguf_bytes, block_k = FORMATS[self.fmt]
        return self.row_bytes // gguf_bytes * block_k


def shard_identity(path: Path) -> dict[str, Any]:
    """What a cached index trusts a shard by: its absolute path, size and modification time."""
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def write_index(out_dir: Path, shards: list[Path], locations: dict[str, TensorLocation]) -> None:
    """Record `locations` and the identity of `shards` in `out_dir`/QUANTIZED_INDEX."""
    record = {
        "shards": [shard_identity(path) for path in shards],
        "tensors": {name: vars(loc) for name, loc in locations.items()},
    }
    (out_dir / QUANTIZED_INDEX).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")


def read_index(model_dir: Path) -> tuple[list[Path], dict[str, TensorLocation]]:
    """The shards and locations of `model_dir`'s index; ModelLoadError if it is unreadable or a
    shard is gone or changed since the conversion (the index would point at the wrong bytes)."""
    file = model_dir / QUANTIZED_INDEX
    try:
        record = json.loads(file.read_text())
        locations = {name: TensorLocation(**loc) for name, loc in record["tensors"].items()}
        shards = [dict(s) for s in record["shards"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ModelLoadError(f"{file}: unreadable index of quantized GGUF tensors ({e})") from e
    paths = []
    for shard in shards:
        path = Path(shard["path"])
        try:
            now = shard_identity(path)
        except OSError as e:
            raise ModelLoadError(f"{model_dir}: the GGUF it was converted from is gone ({path}: {e}); "
                                 "load the .gguf file itself") from e
        if now != shard:
            raise ModelLoadError(f"{model_dir}: the GGUF it was converted from changed since ({path}); "
                                 "load the .gguf file itself to convert it again")
        paths.append(path)
    return paths, locations


class GgufQuantizedTensors(Mapping[str, QuantizedTensor]):
    """HF name -> QuantizedTensor, each read from its GGUF shard when asked for (a new tensor per
    access: the caller keeps what it needs). Holds one open descriptor per shard."""

    def __init__(self, model_dir: Path):
        self._paths, self._locations = read_index(Path(model_dir))
        self._fds: dict[int, int] = {}

    def formats(self) -> dict[str, str]:
        """HF name -> format, without reading any tensor."""
        return {name: loc.fmt for name, loc in self._locations.items()}

    def _fd(self, shard: int) -> int:
        if shard not in self._fds:
            self._fds[shard] = os.open(self._paths[shard], os.O_RDONLY)
        return self._fds[shard]

    def __getitem__(self, name: str) -> QuantizedTensor:
        from radixlm.runtime.model.gguf_convert import undo_rope_permute

        loc = self._locations[name]
        raw = torch.from_numpy(_pread(self._fd(loc.shard), loc.offset, loc.rows * loc.row_bytes, self._paths[loc.shard]))
        raw = raw.view(loc.rows, loc.row_bytes)
        if loc.permute_heads:
            raw = undo_rope_permute(raw, loc.permute_heads)
        return QuantizedTensor(loc.fmt, raw, loc.k)

    def __contains__(self, name: object) -> bool:  # Mapping's would read the tensor
        return name in self._locations

    def __iter__(self) -> Iterator[str]:
        return iter(self._locations)

    def __len__(self) -> int:
        return len(self._locations)

    def __del__(self) -> None:
        for fd in getattr(self, "_fds", {}).values():
            os.close(fd)


class DequantizedTensors(Mapping[str, torch.Tensor]):
    """The tensors of `blocks` as float32 `[N, K]`, each dequantized when asked for."""

    def __init__(self, blocks: Mapping[str, QuantizedTensor]):
        self._blocks = blocks

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._blocks[name].dequantize()

    def __contains__(self, name: object) -> bool:
        return name in self._blocks

    def __iter__(self) -> Iterator[str]:
        return iter(self._blocks)

    def __len__(self) -> int:
        return len(self._blocks)


def _pread(fd: int, offset: int, nbytes: int, path: Path) -> np.ndarray:
    """`nbytes` bytes of the file from `offset`, in a new uint8 array."""
    out = np.empty(nbytes, dtype=np.uint8)
    done = 0
    while done < nbytes:
        got = os.preadv(fd, [memoryview(out[done: done + min(_MAX_READ, nbytes - done)])], offset + done)
        if got <= 0:
            raise ModelLoadError(f"{path}: ends inside a tensor (read {done} of {nbytes} bytes at {offset})")
        done += got
    return out


def write_float_checkpoint(model_dir: Path, out_dir: Path) -> None:
    """Write into the empty `out_dir` a plain HF checkpoint of the converted GGUF `model_dir`: its
    files, with every weight in float32 safetensors, the quantized ones dequantized one at a time
    (gguf_convert.write_float_weights holds one shard). For readers of HF folders only, such as
    transformers as a reference; radixlm itself loads `model_dir`."""
    import shutil
    from collections import ChainMap

    from radixlm.runtime.model.gguf_convert import SHARD_BYTES, write_float_weights
    from radixlm.runtime.model.model_files import MANIFEST_NAME, load_state_dict

    weights: Mapping[str, torch.Tensor] = ChainMap(DequantizedTensors(GgufQuantizedTensors(model_dir)),  # type: ignore[arg-type]
                                                   load_state_dict(model_dir))
    write_float_weights(((name, weights[name]) for name in sorted(weights)), out_dir, SHARD_BYTES)
    for file in model_dir.iterdir():
        is_weights = file.suffix == ".safetensors" or file.name == "model.safetensors.index.json"
        if file.is_file() and not is_weights and file.name not in (QUANTIZED_INDEX, MANIFEST_NAME):
            shutil.copyfile(file, out_dir / file.name)
