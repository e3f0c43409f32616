"""Tests of model resolution, the converted-model cache and the GGUF -> HF conversion.

Fast tests write a tiny random llama GGUF (F32, so the conversion must be exact) into a tmp
cache ($RADIXLM_CACHE). The `slow` tests use the real default model in the user's real cache,
so the suite converts SmolLM2 at most once per machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gguf
import gguf_testing
import pytest
import torch
from gguf_testing import CHAT_TEMPLATE, tiny_vocab
from safetensors.torch import save_file
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

from radixlm.runtime.model import gguf_convert
from radixlm.runtime.model.model_files import (
    MANIFEST_NAME,
    ModelLoadError,
    build_cached,
    cache_dir,
    default_gguf_path,
    float_checkpoint_dir,
    is_complete,
    load_state_dict,
    resolve_model_path,
)


def llama_cpp_permute(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    return gguf_testing.llama_cpp_permute(weight, num_heads)


def tiny_llama(tied: bool = False) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(tiny_vocab()),
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=tied,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn_like(param) * 0.2)  # random norms too, so a mix-up shows
    return model


def write_tiny_gguf(model: LlamaForCausalLM, path: Path, split_max_tensors: int = 0) -> list[Path]:
    """A llama.cpp-style GGUF of `model` (tests/gguf_testing.py: F32, q/k permuted, ChatML tokenizer)."""
    hf_dir = path.with_name(f"{path.stem}-hf")
    model.save_pretrained(hf_dir, safe_serialization=True)
    return gguf_testing.write_gguf(hf_dir, path, "llama", split_max_tensors=split_max_tensors)


@pytest.fixture
def tmp_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("RADIXLM_CACHE", str(cache))
    return cache


@pytest.fixture(scope="module")
def tiny_model() -> LlamaForCausalLM:
    return tiny_llama()


@pytest.fixture
def tiny_gguf(tmp_path: Path, tiny_model: LlamaForCausalLM) -> Path:
    path = tmp_path / "tiny-llama.gguf"
    write_tiny_gguf(tiny_model, path)
    return path


def cache_entries(cache: Path) -> list[str]:
    """Everything in the cache except lock files (temp dirs included)."""
    return sorted(str(p.relative_to(cache)) for p in cache.rglob("*") if not p.name.endswith(".lock"))


# --- the q/k permutation ------------------------------------------------------------------


def test_undo_rope_permute_inverts_llama_cpp_permute() -> None:
    weight = torch.randn(3 * 8, 5)
    permuted = llama_cpp_permute(weight, 3)
    assert not torch.equal(permuted, weight)
    assert torch.equal(gguf_convert.undo_rope_permute(permuted, 3), weight)
    # Row h*d + 2*i + j of the GGUF weight is row h*d + j*(d/2) + i of the HF weight (d = 8).
    assert torch.equal(permuted[8 + 2 * 1 + 1], weight[8 + 1 * 4 + 1])


def test_permutation_maps_rotate_half_rope_to_interleaved_rope() -> None:
    """Why the permutation exists: HF rope on HF rows == llama.cpp rope on permuted rows."""
    num_heads, head_dim, hidden, pos = 2, 8, 6, 5
    weight, x = torch.randn(num_heads * head_dim, hidden), torch.randn(hidden)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    cos, sin = torch.cos(pos * inv_freq), torch.sin(pos * inv_freq)

    q_hf = (weight @ x).view(num_heads, 2, head_dim // 2)  # halves (i, i + d/2) rotate together
    a, b = q_hf[:, 0], q_hf[:, 1]
    rotated_hf = torch.stack([a * cos - b * sin, b * cos + a * sin], dim=1).reshape(-1)

    q_cpp = (llama_cpp_permute(weight, num_heads) @ x).view(num_heads, head_dim // 2, 2)  # pairs (2i, 2i+1)
    a, b = q_cpp[..., 0], q_cpp[..., 1]
    rotated_cpp = torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1).reshape(-1)

    rows = llama_cpp_permute(torch.arange(num_heads * head_dim).unsqueeze(1), num_heads).squeeze(1)
    torch.testing.assert_close(rotated_cpp, rotated_hf[rows])


# --- GGUF conversion (tiny model) -----------------------------------------------------------


def test_tiny_gguf_converts_to_the_original_weights(
    tmp_cache: Path, tiny_gguf: Path, tiny_model: LlamaForCausalLM
) -> None:
    model_dir = resolve_model_path(tiny_gguf)
    assert model_dir.parent == tmp_cache / "gguf" and model_dir.name.startswith("tiny-llama-")
    state_dict = load_state_dict(model_dir)
    original = tiny_model.state_dict()
    assert set(state_dict) == set(original)
    for name, tensor in original.items():
        assert state_dict[name].dtype == torch.float32
        assert torch.equal(state_dict[name], tensor), name

    config = json.loads((model_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    assert config["tie_word_embeddings"] is False and config["dtype"] == "float32"
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (4, 2, 16)
    assert json.loads((model_dir / "generation_config.json").read_text()) == {
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 2,
    }

    reloaded = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([[5, 17, 42, 99, 3, 7]])
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, tiny_model(ids).logits, rtol=0, atol=1e-6)


def test_tied_embeddings_have_no_lm_head(tmp_cache: Path, tmp_path: Path) -> None:
    path = tmp_path / "tied.gguf"
    write_tiny_gguf(tiny_llama(tied=True), path)
    model_dir = resolve_model_path(path)
    assert json.loads((model_dir / "config.json").read_text())["tie_word_embeddings"] is True
    assert "lm_head.weight" not in load_state_dict(model_dir)


def test_tiny_gguf_tokenizer_and_chat_template(tmp_cache: Path, tiny_gguf: Path) -> None:
    model_dir = resolve_model_path(tiny_gguf)
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    assert config["chat_template"] == CHAT_TEMPLATE and config["add_bos_token"] is False
    assert not (model_dir / "chat_template.jinja").exists()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert (tokenizer.bos_token, tokenizer.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert tokenizer.encode("hello world<|im_end|>") == [
        tiny_vocab().index(t) for t in ["hell", "o", "Ġw", "o", "r", "l", "d", "<|im_end|>"]
    ]
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n"


def test_gguf_cache_is_reused_and_keyed_by_mtime(tmp_cache: Path, tiny_gguf: Path) -> None:
    first = resolve_model_path(tiny_gguf)
    manifest = first / MANIFEST_NAME
    built_at = manifest.stat().st_mtime_ns
    assert resolve_model_path(str(tiny_gguf)) == first
    assert manifest.stat().st_mtime_ns == built_at
    assert json.loads(manifest.read_text())["source"] == str(tiny_gguf.resolve())
    os.utime(tiny_gguf, ns=(built_at + 10**9, built_at + 10**9))
    second = resolve_model_path(tiny_gguf)
    assert second != first and is_complete(second)


def test_cache_dir_without_manifest_is_rebuilt(tmp_cache: Path, tiny_gguf: Path) -> None:
    model_dir = resolve_model_path(tiny_gguf)
    (model_dir / MANIFEST_NAME).unlink()
    (model_dir / "model.safetensors").write_bytes(b"half-written")
    assert not is_complete(model_dir)
    assert resolve_model_path(tiny_gguf) == model_dir
    assert is_complete(model_dir)
    assert len(load_state_dict(model_dir)) == len(tiny_llama().state_dict())


def test_failed_build_leaves_nothing(tmp_cache: Path) -> None:
    target = tmp_cache / "gguf" / "broken"
    (tmp_cache / "gguf").mkdir(parents=True)
    (tmp_cache / "gguf" / ".broken.tmp-1-dead").mkdir()  # left by a killed build

    def failing_build(out: Path) -> None:
        (out / "model.safetensors").write_bytes(b"partial")
        raise ModelLoadError("boom")

    with pytest.raises(ModelLoadError, match="boom"):
        build_cached(target, {"source": "test"}, failing_build)
    assert cache_entries(tmp_cache) == ["gguf"]


def test_concurrent_first_calls_convert_once(tmp_cache: Path, tiny_gguf: Path) -> None:
    env = dict(os.environ, RADIXLM_CACHE=str(tmp_cache))
    command = [sys.executable, "-m", "radixlm.runtime.model.model_files", str(tiny_gguf)]
    procs = [
        subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = [proc.communicate(timeout=300) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    dirs = {Path(out.strip()) for out, _ in outputs}
    assert len(dirs) == 1 and is_complete(dirs.pop())
    assert sum("converting" in err for _, err in outputs) == 1
    assert not [e for e in cache_entries(tmp_cache) if ".tmp-" in e]


def test_unsupported_gguf_architecture(tmp_cache: Path, tmp_path: Path) -> None:
    path = tmp_path / "other.gguf"
    writer = gguf.GGUFWriter(path, "mamba")
    writer.add_block_count(2)
    writer.add_tensor("token_embd.weight", torch.zeros(4, 8).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelLoadError, match=r"other\.gguf.*unsupported GGUF architecture 'mamba' \(supported: llama, qwen2"):
        resolve_model_path(path)
    assert not (tmp_cache / "gguf").exists() or cache_entries(tmp_cache) == ["gguf"]


@pytest.mark.parametrize("keep", [0.0001, 0.01, 0.5, 0.999])
def test_truncated_tiny_gguf(tmp_cache: Path, tiny_gguf: Path, keep: float) -> None:
    data = tiny_gguf.read_bytes()
    truncated = tiny_gguf.with_name("truncated.gguf")
    truncated.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(ModelLoadError, match=r"truncated\.gguf.*(truncated|corrupt)"):
        resolve_model_path(truncated)
    assert not (tmp_cache / "gguf").exists() or cache_entries(tmp_cache) == ["gguf"]


def test_garbage_gguf(tmp_cache: Path, tmp_path: Path) -> None:
    path = tmp_path / "garbage.gguf"
    path.write_bytes(b"this is not a gguf file" * 100)
    with pytest.raises(ModelLoadError, match="garbage.gguf"):
        resolve_model_path(path)


# --- HF directories and errors -------------------------------------------------------------


def write_hf_dir(path: Path, tensors: dict[str, torch.Tensor] | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (path / "tokenizer.json").write_text("{}")
    save_file(tensors or {"w": torch.arange(6.0).view(2, 3)}, str(path / "model.safetensors"))
    return path


def test_hf_dir_is_returned_as_is(tmp_path: Path) -> None:
    model_dir = write_hf_dir(tmp_path / "m")
    assert resolve_model_path(model_dir) == model_dir
    assert torch.equal(load_state_dict(model_dir)["w"], torch.arange(6.0).view(2, 3))


def test_sharded_safetensors(tmp_path: Path) -> None:
    model_dir = write_hf_dir(tmp_path / "m")
    (model_dir / "model.safetensors").unlink()
    save_file({"a": torch.ones(2)}, str(model_dir / "model-00001-of-00002.safetensors"))
    save_file({"b": torch.zeros(3)}, str(model_dir / "model-00002-of-00002.safetensors"))
    weight_map = {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}
    (model_dir / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert resolve_model_path(model_dir) == model_dir
    assert sorted(load_state_dict(model_dir)) == ["a", "b"]
    (model_dir / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="missing weight shard model-00002-of-00002"):
        load_state_dict(model_dir)


def test_nonexistent_path(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"nope.*no such file"):
        resolve_model_path(tmp_path / "nope")


def test_dir_without_config_or_gguf(tmp_path: Path) -> None:
    model_dir = write_hf_dir(tmp_path / "m")
    (model_dir / "config.json").unlink()
    with pytest.raises(
        ModelLoadError, match=r"/m: not a model directory \(no config.json, no .gguf file; found \['model.safetensors'"
    ):
        resolve_model_path(model_dir)


def test_dir_holding_one_gguf_resolves_to_it(tmp_cache: Path, tmp_path: Path, tiny_gguf: Path) -> None:
    folder = tmp_path / "downloaded"
    folder.mkdir()
    (folder / "README.md").write_text("a model card")
    os.link(tiny_gguf, folder / tiny_gguf.name)
    assert resolve_model_path(folder) == resolve_model_path(folder / tiny_gguf.name)
    (folder / "mmproj-model-f16.gguf").write_bytes(b"")  # a vision projector beside it is not a model
    assert resolve_model_path(folder) == resolve_model_path(folder / tiny_gguf.name)
    (folder / "config.json").write_text("{}")  # GGUF repos may carry one: no safetensors, so the GGUF counts
    assert resolve_model_path(folder) == resolve_model_path(folder / tiny_gguf.name)
    (folder / "other.gguf").write_bytes(b"")
    with pytest.raises(ModelLoadError, match=r"holds 2 GGUF models \(other.gguf, tiny-llama.gguf\).*pass one"):
        resolve_model_path(folder)


def test_split_gguf_reads_all_shards(tmp_cache: Path, tmp_path: Path, tiny_model: LlamaForCausalLM) -> None:
    shards = write_tiny_gguf(tiny_model, tmp_path / "split" / "tiny.gguf", split_max_tensors=5)
    assert [p.name for p in shards] == [f"tiny-{n:05d}-of-00005.gguf" for n in range(1, 6)]
    for given in (shards[0], shards[0].parent):  # the first shard, or the folder holding the shards
        model_dir = resolve_model_path(given)
        state_dict = load_state_dict(model_dir)
        assert sorted(state_dict) == sorted(tiny_model.state_dict())
        for name, tensor in tiny_model.state_dict().items():
            assert torch.equal(state_dict[name], tensor), name
    with pytest.raises(ModelLoadError, match=r"shard 3 of a split GGUF; pass its first shard, tiny-00001-of-00005.gguf"):
        resolve_model_path(shards[2])
    shards[3].unlink()
    with pytest.raises(ModelLoadError, match=r"tiny-00001-of-00005.gguf: split GGUF of 5 shards lacks tiny-00004-of-00005.gguf"):
        resolve_model_path(shards[0])


def test_split_gguf_shard_from_another_model(tmp_cache: Path, tmp_path: Path, tiny_model: LlamaForCausalLM) -> None:
    shards = write_tiny_gguf(tiny_model, tmp_path / "a" / "m.gguf", split_max_tensors=8)
    other = write_tiny_gguf(tiny_llama(tied=True), tmp_path / "b" / "m.gguf", split_max_tensors=8)
    assert len(shards) == 3 and len(other) == 3
    shards[1].write_bytes(other[2].read_bytes())
    with pytest.raises(ModelLoadError, match=r"m-00002-of-00003.gguf: not shard 2 of 3 of m-00001-of-00003.gguf"):
        resolve_model_path(shards[0])
    assert not (tmp_cache / "gguf").exists() or cache_entries(tmp_cache) == ["gguf"]


@pytest.fixture
def built_kernels() -> Path:
    """The real cache's built C++ kernels (resolved before `tmp_cache` replaces the cache)."""
    return cache_dir() / "extensions"


def test_engine_serves_a_split_gguf_with_no_other_flag(
    built_kernels: Path, tmp_cache: Path, tmp_path: Path, tiny_model: LlamaForCausalLM
) -> None:
    """`--model-path <first shard>` alone: dtype, quantization and chat template from the files."""
    from radixlm.runtime.engine import Engine

    tmp_cache.mkdir(parents=True, exist_ok=True)
    (tmp_cache / "extensions").symlink_to(built_kernels)  # the kernels built already, not a rebuild
    shards = write_tiny_gguf(tiny_model, tmp_path / "split" / "tiny.gguf", split_max_tensors=8)
    prompt = [1, 7, 8, 9, 10]
    with Engine(str(shards[0]), max_total_tokens=512, random_seed=0) as engine:
        out = engine.generate(input_ids=prompt, sampling_params={"temperature": 0, "max_new_tokens": 8, "ignore_eos": True})
        chat = engine.tokenizer.apply_chat_template([{"role": "user", "content": "hell"}])
        dtype = engine.runner.cfg.dtype
        assert engine.model_config.architecture == "LlamaForCausalLM" and engine.model_config.num_layers == 2
    assert chat == "<|im_start|>user\nhell<|im_end|>\n<|im_start|>assistant\n"
    assert len(out["output_ids"]) == 8
    if dtype == torch.float32:  # --dtype auto picks bfloat16 on CPUs where it is fast: greedy may then differ
        with torch.no_grad():
            ref = tiny_model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, eos_token_id=None,
                                      pad_token_id=0)
        assert out["output_ids"] == ref[0, len(prompt):].tolist()


def test_unparseable_config(tmp_path: Path) -> None:
    model_dir = write_hf_dir(tmp_path / "m")
    (model_dir / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match=r"/m/config.json: not valid JSON"):
        resolve_model_path(model_dir)


def test_dir_without_weights_or_tokenizer(tmp_path: Path) -> None:
    model_dir = write_hf_dir(tmp_path / "m")
    (model_dir / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError, match="no tokenizer"):
        resolve_model_path(model_dir)
    (model_dir / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=r"no \*.safetensors weight files$"):
        resolve_model_path(model_dir)
    (model_dir / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(ModelLoadError, match=r"no \*.safetensors weight files \(found pytorch_model.bin: only safetensors"):
        resolve_model_path(model_dir)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_corrupt_safetensors(tmp_path: Path, damage: str) -> None:
    model_dir = write_hf_dir(tmp_path / "m", {"w": torch.randn(64, 64)})
    weights = model_dir / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes({"truncate": data[:-100], "garbage": os.urandom(len(data)), "empty": b""}[damage])
    with pytest.raises(ModelLoadError, match=r"model\.safetensors: .*(corrupt|truncated)"):
        resolve_model_path(model_dir)
    with pytest.raises(ModelLoadError, match=r"model\.safetensors"):
        load_state_dict(model_dir)


def test_neither_dir_nor_gguf(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    path.write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="not a model directory or a .gguf file \\(expected an HF model directory"):
        resolve_model_path(path)
    model_dir = write_hf_dir(tmp_path / "m")
    with pytest.raises(ModelLoadError, match=r"model.safetensors: not a model directory .*; pass its folder, .*/m$"):
        resolve_model_path(model_dir / "model.safetensors")


def test_cache_dir_follows_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RADIXLM_CACHE", str(tmp_path))
    assert cache_dir() == tmp_path
    monkeypatch.setenv("RADIXLM_CACHE", "")
    assert cache_dir() == Path.home() / ".cache" / "radixlm"


# --- the real default model (user's cache; converted at most once per machine) --------------


@pytest.fixture(scope="module")
def default_dir() -> Path:
    return resolve_model_path(None)


@pytest.fixture(scope="module")
def real_gguf(default_dir: Path) -> Path:
    """The default model's GGUF kept in the real cache (module scope: resolved before tmp_cache)."""
    return default_gguf_path()


@pytest.fixture(scope="module")
def reference_tokenizer(real_gguf: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(str(real_gguf.parent), gguf_file=real_gguf.name)


def transformers_gguf_state_dict(gguf_path: Path, model_dir: Path) -> dict[str, torch.Tensor]:
    """Weights as transformers' own GGUF loader dequantizes and un-permutes them (float32).

    `from_pretrained(gguf_file=...)` needs accelerate, which we do not depend on; without it, call
    the loader function it falls back on. `model_dir`'s config only supplies the HF tensor names:
    that loader takes the head counts for its q/k un-permutation from the GGUF metadata.
    """
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    from transformers.utils import is_accelerate_available

    if is_accelerate_available():
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
        )
        return dict(model.state_dict())
    with torch.device("meta"):
        skeleton = LlamaForCausalLM(LlamaConfig.from_pretrained(model_dir))
    loaded = load_gguf_checkpoint(
        gguf_path, return_tensors=True, model_to_load=skeleton, torch_dtype=torch.float32
    )
    return loaded["tensors"]


@pytest.mark.slow
def test_default_model_resolves_from_cache_without_rebuilding(default_dir: Path) -> None:
    assert default_dir.name == "SmolLM2-135M-Instruct" and is_complete(default_dir)
    built_at = (default_dir / MANIFEST_NAME).stat().st_mtime_ns
    code = "import sys; from radixlm.runtime.model.model_files import resolve_model_path as r; print(r(None)); "
    code += "print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == [str(default_dir), "False"]  # cache hit: no torch, no conversion
    assert (default_dir / MANIFEST_NAME).stat().st_mtime_ns == built_at


@pytest.mark.slow
def test_default_model_weights_equal_transformers_gguf_loader(default_dir: Path, real_gguf: Path) -> None:
    ours = load_state_dict(float_checkpoint_dir(default_dir))
    reference = transformers_gguf_state_dict(real_gguf, default_dir)
    reference.pop("lm_head.weight", None)  # tied: transformers' state_dict lists it, our file does not
    assert set(ours) == set(reference)
    for name, tensor in reference.items():
        torch.testing.assert_close(ours[name], tensor.float(), rtol=0, atol=1e-6, msg=name)


@pytest.mark.slow
def test_default_model_config(default_dir: Path) -> None:
    config = json.loads((default_dir / "config.json").read_text())
    expected = {
        "num_hidden_layers": 30,
        "hidden_size": 576,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
    }
    assert {k: config[k] for k in expected} == expected
    assert (config["vocab_size"], config["tie_word_embeddings"], config["eos_token_id"]) == (49152, True, 2)


@pytest.mark.slow
def test_default_tokenizer_matches_transformers_gguf_tokenizer(
    default_dir: Path, reference_tokenizer: PreTrainedTokenizerBase
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(default_dir)
    messages = [
        {"role": "system", "content": "Answer in JSON."},
        {"role": "user", "content": "Héllo, wörld! What's the capital of France?\n\tThanks."},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nAnswer in JSON.<|im_end|>\n<|im_start|>user\n")
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert text == reference_tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    ids = tokenizer.encode(text)
    assert ids == reference_tokenizer.encode(text)
    assert ids[0] == 1 and ids.count(2) == 2  # <|im_start|>, <|im_end|> are single tokens; no BOS added
    assert tokenizer.encode("hello") == [28120]
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (1, 2, 2)
    default_prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert default_prompt.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert tokenizer.decode(ids, skip_special_tokens=False) == text


@pytest.mark.slow
def test_default_tokenizer_splits_digits_like_llama_cpp(
    default_dir: Path, reference_tokenizer: PreTrainedTokenizerBase
) -> None:
    """SmolLM's pre-tokenizer isolates each digit first (llama.cpp "smollm"); plain GPT-2 does not."""
    tokenizer = AutoTokenizer.from_pretrained(default_dir)
    assert tokenizer.tokenize("a  1") == ["a", "ĠĠ", "1"]
    assert reference_tokenizer.tokenize("a  1") == ["a", "Ġ", "Ġ", "1"]  # transformers ignores "smollm"
    assert tokenizer.tokenize("year 2024") == reference_tokenizer.tokenize("year 2024")


@pytest.mark.slow
def test_default_model_answers(default_dir: Path) -> None:
    model = LlamaForCausalLM.from_pretrained(float_checkpoint_dir(default_dir), dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(default_dir)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, ids["input_ids"].shape[1] :])


@pytest.mark.slow
def test_truncated_real_gguf(real_gguf: Path, tmp_cache: Path, tmp_path: Path) -> None:
    truncated = tmp_path / "SmolLM2-truncated.gguf"
    with open(real_gguf, "rb") as src:
        truncated.write_bytes(src.read(1 << 20))
    with pytest.raises(ModelLoadError, match=r"SmolLM2-truncated\.gguf: .*truncated"):
        resolve_model_path(truncated)
    assert not (tmp_cache / "gguf").exists() or cache_entries(tmp_cache) == ["gguf"]
