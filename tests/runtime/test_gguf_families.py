"""GGUF files of every issue-35 family, read from the file alone (gguf_convert).

Each family's tiny random-weight model is built by transformers from its config class and saved;
tests/gguf_testing.py writes it as llama.cpp's converter would (F32, so the conversion must be
exact). Checked: (a) transformers' own GGUF loader reads our test file back to the source
weights, where it supports the architecture (validates the test writer independently of our
reader); (b) our config.json equals the one the source model saved and our tensors equal its
checkpoint bit for bit (Gemma norms: llama.cpp stores 1 + w in float32, so w comes back within
one float32 ulp of 1); (c) the runtime on the converted GGUF gives the source model's greedy
output (the families the runtime runs; extend RUNTIME_FAMILIES as it learns more).
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf_testing import FAMILIES, SPM_VOCAB, llama3_rope_freqs, spm_tokenizer, tiny_family_model, write_gguf
from safetensors.torch import load_file

from radixlm.runtime.model.gguf_config import llama3_rope
from radixlm.runtime.model.gguf_convert import convert_gguf
from radixlm.runtime.model.model_files import (
    QUANTIZED_INDEX,
    ModelLoadError,
    float_checkpoint_dir,
    load_quantized,
)
from radixlm.runtime.model.model_runner import weights_of

# Families transformers' GGUF loader reads (its TENSOR_PROCESSORS / config mapping); Mistral's
# file is a `llama` one. It reads no `llama` file with experts (Mixtral), olmo2, granite, smollm3, olmoe.
TRANSFORMERS_READS = ("llama", "llama3", "mistral", "qwen2", "qwen3", "qwen3_moe", "phi3", "gemma2", "gemma3")
RUNTIME_FAMILIES = ("llama", "llama3", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "olmo2", "granite", "smollm3",
                    "qwen3_moe", "mixtral", "olmoe")
GEMMA_NORM_ATOL = 2**-23  # |(1 + w) - 1 - w| after float32 rounding of 1 + w, for |w| < 1


@pytest.fixture(scope="module", params=list(FAMILIES))
def family_files(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, Path]:
    """(family, source HF dir, converted dir) for one family."""
    family = request.param
    root = tmp_path_factory.mktemp(family)
    source, converted = root / "hf", root / "converted"
    source.mkdir()
    converted.mkdir()
    tiny_family_model(family, source)
    write_gguf(source, root / f"{family}.gguf", family)
    convert_gguf(root / f"{family}.gguf", converted)
    return family, source, converted


def test_converted_config_equals_the_source_config(family_files: tuple[str, Path, Path]) -> None:
    family, source, converted = family_files
    want = json.loads((source / "config.json").read_text())
    got = json.loads((converted / "config.json").read_text())
    want.pop("transformers_version")
    if family == "mistral":  # llama.cpp writes Mistral as `llama`: the same model, as LlamaForCausalLM
        assert got.pop("architectures") == ["LlamaForCausalLM"] and got.pop("model_type") == "llama"
        for key in ("architectures", "model_type", "sliding_window"):  # no window: the tiny Mistral has none
            want.pop(key)
        for key in ("attention_bias", "mlp_bias", "pretraining_tp"):  # Llama's fields, at their defaults
            got.pop(key)
    if family == "phi3":  # Phi3Config saves no head_dim; ours states the one it derives
        assert got.pop("head_dim") == want["hidden_size"] // want["num_attention_heads"]
    assert got == want


def test_converted_tensors_equal_the_source_checkpoint(family_files: tuple[str, Path, Path]) -> None:
    family, source, converted = family_files
    want = load_file(source / "model.safetensors")
    got = load_file(converted / "model.safetensors")
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        if family.startswith("gemma") and name.endswith("norm.weight"):
            torch.testing.assert_close(got[name], tensor, rtol=0, atol=GEMMA_NORM_ATOL, msg=name)
        else:
            assert torch.equal(got[name], tensor), name
    assert not (converted / QUANTIZED_INDEX).exists()  # F32 file: nothing kept quantized


def test_transformers_runs_the_converted_model_as_the_source(family_files: tuple[str, Path, Path]) -> None:
    """The converted folder is an HF checkpoint of the family: transformers loads it (config class,
    per-expert names) and computes the source model's logits exactly (Gemma too: 1 + w of the
    converted norm is the float32 1 + w the file stores), over more tokens than a sliding window."""
    import transformers

    _, source, converted = family_files
    ids = torch.tensor([[5, 17, 42, 99, 3, 7] * 8])
    with torch.no_grad():
        want = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()(ids).logits
        got = transformers.AutoModelForCausalLM.from_pretrained(converted, dtype=torch.float32).eval()(ids).logits
    assert torch.equal(got, want)


def test_converted_tokenizer_carries_the_template(family_files: tuple[str, Path, Path]) -> None:
    from transformers import AutoTokenizer

    _, _, converted = family_files
    tokenizer = AutoTokenizer.from_pretrained(converted)
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hell"}], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nhell<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.encode("<|im_start|>hell") == [1, 262]


@pytest.mark.parametrize("family", TRANSFORMERS_READS)
def test_transformers_reads_our_test_gguf_as_the_source(family: str, tmp_path: Path) -> None:
    """Validates the test writer: transformers' own GGUF loader gets the source weights back."""
    import transformers
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    (tmp_path / "hf").mkdir()
    model = tiny_family_model(family, tmp_path / "hf")
    write_gguf(tmp_path / "hf", tmp_path / "m.gguf", family)
    config = model.config
    if family == "mistral":  # a `llama` file: transformers reads it as Llama (same weights and names)
        fields = {k: v for k, v in config.to_dict().items() if k not in ("model_type", "architectures")}
        config = transformers.LlamaConfig(**fields)
    with torch.device("meta"):  # supplies the HF names; the loader reads heads etc. from the file
        skeleton = transformers.AutoModelForCausalLM.from_config(config)
    loaded = load_gguf_checkpoint(tmp_path / "m.gguf", return_tensors=True, model_to_load=skeleton, torch_dtype=torch.float32)
    tensors = loaded["tensors"]
    want = {k: v for k, v in model.state_dict().items() if not (k == "lm_head.weight" and config.tie_word_embeddings)}
    assert sorted(tensors) == sorted(want)
    for name, tensor in want.items():
        atol = GEMMA_NORM_ATOL if family.startswith("gemma") and "norm" in name else 0.0
        torch.testing.assert_close(tensors[name].float().reshape(tensor.shape), tensor, rtol=0, atol=atol, msg=name)


@pytest.mark.parametrize("family", RUNTIME_FAMILIES)
def test_runtime_on_the_converted_gguf_matches_the_source_greedy(family: str, tmp_path: Path) -> None:
    from radixlm.runtime.engine import Engine

    (tmp_path / "hf").mkdir()
    (tmp_path / "converted").mkdir()
    model = tiny_family_model(family, tmp_path / "hf")
    write_gguf(tmp_path / "hf", tmp_path / "m.gguf", family)
    convert_gguf(tmp_path / "m.gguf", tmp_path / "converted")
    prompts = [[1, 7, 8, 9, 10], list(range(20, 45))]
    with Engine(str(tmp_path / "converted"), dtype="float32", max_total_tokens=1024, random_seed=0) as engine:
        ours = engine.generate(input_ids=prompts, sampling_params={"temperature": 0, "max_new_tokens": 12, "ignore_eos": True})
    for prompt, out in zip(prompts, ours):
        with torch.no_grad():
            ref = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
        assert out["output_ids"] == ref[0, len(prompt):].tolist()


@pytest.mark.parametrize("family,up_proj", [("qwen3_moe", "mlp.experts.{e}.up_proj"), ("mixtral", "block_sparse_moe.experts.{e}.w3")])
def test_quantized_tensors_are_kept_per_expert_and_unpermuted(family: str, up_proj: str, tmp_path: Path) -> None:
    """Q8_0 tensors stay as blocks: a stacked-experts tensor split into each expert's blocks, q/k
    rows (permuted in a Mixtral file) put back; each equals gguf's quantization of the source
    weight, read from the GGUF at load: the converted folder holds no float copy of it."""
    from gguf.quants import dequantize, quantize

    (tmp_path / "hf").mkdir()
    (tmp_path / "out").mkdir()
    tiny_family_model(family, tmp_path / "hf")
    q8 = gguf.GGMLQuantizationType.Q8_0
    kept = ("blk.1.ffn_up_exps.weight", "blk.0.attn_q.weight", "blk.0.attn_k.weight")
    write_gguf(tmp_path / "hf", tmp_path / "m.gguf", family, tensor_types=dict.fromkeys(kept, q8))
    convert_gguf(tmp_path / "m.gguf", tmp_path / "out")
    blocks = load_quantized(tmp_path / "out")
    want_names = [f"model.layers.1.{up_proj.format(e=e)}.weight" for e in range(4)]
    want_names += ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight"]
    assert sorted(blocks) == sorted(want_names)
    source = load_file(tmp_path / "hf" / "model.safetensors")
    floats = load_file(tmp_path / "out" / "model.safetensors")
    for name, qt in blocks.items():
        want = quantize(source[name].numpy(), q8)
        assert qt.fmt == "q8_0" and qt.shape == tuple(source[name].shape), name
        assert np.array_equal(qt.raw.numpy(), want), name
        assert name not in floats, name
    dequantized = weights_of(tmp_path / "out", "none")  # a float load dequantizes them one at a time
    for name in want_names:
        assert np.array_equal(dequantized[name].numpy(), dequantize(quantize(source[name].numpy(), q8), q8)), name


@pytest.mark.parametrize("factor,high", [(8.0, 4.0), (32.0, 4.0), (16.0, 2.0)])
def test_llama3_rope_is_recovered_from_rope_freqs(factor: float, high: float) -> None:
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": factor, "low_freq_factor": 1.0,
            "high_freq_factor": high, "original_max_position_embeddings": 8192}
    assert llama3_rope(llama3_rope_freqs(rope, 128), 500000.0, 128) == rope


# On text starting with a space, llama.cpp's sentencepiece tokenizer (a prefix space, then spaces
# as "▁": " hello" -> "▁", "▁hello") and transformers' Llama tokenizer (Metaspace: "▁hello") differ;
# the converted tokenizer follows transformers.
SPM_TEXTS = ["hello world", " hello", "héllo  wörld!", "hello\nworld", "world hello hello"]


@pytest.mark.parametrize(
    "family,add_bos", [("mistral", None), ("mistral", False), ("mistral", True), ("gemma2", True), ("gemma3", True)]
)
def test_sentencepiece_vocabulary_converts_to_the_source_tokenizer(family: str, add_bos: bool | None, tmp_path: Path) -> None:
    """A `llama` (sentencepiece) tokenizer, as Mistral / Llama 2 / Gemma GGUFs carry: the converted
    tokenizer splits text as the source tokenizer does, and adds BOS as llama.cpp does (the file's
    add_bos_token; without one, it adds BOS)."""
    from transformers import AutoTokenizer

    (tmp_path / "hf").mkdir()
    (tmp_path / "out").mkdir()
    tiny_family_model(family, tmp_path / "hf", vocab_size=len(SPM_VOCAB))
    write_gguf(tmp_path / "hf", tmp_path / "m.gguf", family, tokenizer="spm", add_bos_token=add_bos)
    convert_gguf(tmp_path / "m.gguf", tmp_path / "out")
    ours, source = AutoTokenizer.from_pretrained(tmp_path / "out"), spm_tokenizer(family)
    for text in SPM_TEXTS:
        want = source.encode(text, add_special_tokens=False)
        assert ours.encode(text, add_special_tokens=False) == want, text
        assert ours.encode(text) == ([1] if add_bos is not False else []) + want, text
        assert ours.decode(want) == source.decode(want), text
    assert (ours.bos_token, ours.eos_token, ours.unk_token) == ("<s>", "</s>", "<unk>")
    assert json.loads((tmp_path / "out" / "tokenizer_config.json").read_text())["add_bos_token"] is (add_bos is not False)


def test_byte_level_vocabulary_adds_bos_when_the_file_says_so(tmp_path: Path) -> None:
    """Llama 3 GGUFs: a GPT-2-style vocabulary with add_bos_token true; the tokenizer adds BOS."""
    from transformers import AutoTokenizer

    (tmp_path / "hf").mkdir()
    (tmp_path / "out").mkdir()
    tiny_family_model("llama", tmp_path / "hf")
    write_gguf(tmp_path / "hf", tmp_path / "m.gguf", "llama", add_bos_token=True)
    convert_gguf(tmp_path / "m.gguf", tmp_path / "out")
    ours = AutoTokenizer.from_pretrained(tmp_path / "out")
    assert ours.encode("hell wo") == [1, 262, 261, 3 + ord("o")]  # "o": byte 111 after 3 specials
    assert ours.decode(ours.encode("hell wo"), skip_special_tokens=True) == "hell wo"


def test_mixtral_with_experts_stored_apart(tmp_path: Path) -> None:
    """Older llama.cpp wrote Mixtral's experts one tensor each (blk.N.ffn_gate.E.weight)."""
    (tmp_path / "hf").mkdir()
    (tmp_path / "out").mkdir()
    tiny_family_model("mixtral", tmp_path / "hf")
    write_gguf(tmp_path / "hf", tmp_path / "m.gguf", "mixtral", legacy_experts=True)
    assert "blk.0.ffn_gate.3.weight" in {t.name for t in gguf.GGUFReader(tmp_path / "m.gguf").tensors}
    convert_gguf(tmp_path / "m.gguf", tmp_path / "out")
    want, got = load_file(tmp_path / "hf" / "model.safetensors"), load_file(tmp_path / "out" / "model.safetensors")
    assert sorted(got) == sorted(want)
    assert all(torch.equal(got[name], tensor) for name, tensor in want.items())


def _set(key: str, value: object, kind: gguf.GGUFValueType) -> object:
    return lambda kv: kv.__setitem__(key, gguf.GGUFValue(value, kind))


@pytest.mark.parametrize(
    "family,edit,message",
    [
        ("qwen3", lambda kv: kv.pop("qwen3.embedding_length"), r"GGUF metadata key 'qwen3.embedding_length' is missing"),
        ("qwen3", _set("qwen3.rope.scaling.type", "su", gguf.GGUFValueType.STRING),
         r"unsupported GGUF model: rope scaling 'su' \(supported: none, linear, yarn"),
        ("qwen2", _set("qwen2.rope.dimension_count", 8, gguf.GGUFValueType.UINT32),
         r"unsupported GGUF model: partial rotary embedding \(8 of 16 dimensions\)"),
        ("qwen3_moe", _set("qwen3moe.expert_count", 0, gguf.GGUFValueType.UINT32),
         r"unsupported GGUF model: a 'qwen3moe' file with no experts \(qwen3moe.expert_count\)"),
        ("olmoe", _set("olmoe.expert_count", 3, gguf.GGUFValueType.UINT32),
         r"tensor blk.0.ffn_\w+_exps.weight: holds 4 experts, the metadata says 3"),
        ("llama", _set("llama.attention.head_count_kv", [2, 1], gguf.GGUFValueType.ARRAY),
         r"unsupported GGUF model: llama.attention.head_count_kv differs between layers \(\[2, 1\]\)"),
        ("llama", _set("llama.block_count", 3, gguf.GGUFValueType.UINT32), r"lacks the tensor for model.layers.2"),
        ("qwen2", _set("qwen2.embedding_length", 32, gguf.GGUFValueType.UINT32),
         r"model.embed_tokens.weight has shape \(263, 64\), expected \(263, 32\)"),
    ],
)
def test_unusable_metadata_is_refused_naming_the_file(family: str, edit: object, message: str, tmp_path: Path) -> None:
    (tmp_path / "hf").mkdir()
    (tmp_path / "out").mkdir()
    tiny_family_model(family, tmp_path / "hf")
    write_gguf(tmp_path / "hf", tmp_path / "bad.gguf", family, edit_metadata=edit)  # type: ignore[arg-type]
    with pytest.raises(ModelLoadError, match=r"bad\.gguf: .*(" + message + ")"):
        convert_gguf(tmp_path / "bad.gguf", tmp_path / "out")


def test_large_conversions_are_written_in_shards(tmp_path: Path) -> None:
    """Past `shard_bytes` the float weights go to model-*-of-*.safetensors with an index (memory
    bounded by one shard), which the loader reads like any sharded HF folder."""
    from radixlm.runtime.model.model_files import load_state_dict, safetensors_files, validate_model_dir

    (tmp_path / "hf").mkdir()
    (tmp_path / "out").mkdir()
    tiny_family_model("qwen3_moe", tmp_path / "hf")
    write_gguf(tmp_path / "hf", tmp_path / "m.gguf", "qwen3_moe")
    convert_gguf(tmp_path / "m.gguf", tmp_path / "out", shard_bytes=100_000)
    files = safetensors_files(tmp_path / "out")
    assert len(files) > 2 and files[0].name == f"model-00001-of-{len(files):05d}.safetensors"
    assert not (tmp_path / "out" / "model.safetensors").exists() and not list((tmp_path / "out").glob(".shard-*"))
    validate_model_dir(tmp_path / "out")
    want, got = load_file(tmp_path / "hf" / "model.safetensors"), load_state_dict(tmp_path / "out")
    assert sorted(got) == sorted(want)
    assert all(torch.equal(got[name], tensor) for name, tensor in want.items())


@pytest.fixture
def tmp_cache_with_kernels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh model cache ($RADIXLM_CACHE) that shares the real cache's built C++ kernels."""
    from radixlm.runtime.model.model_files import cache_dir

    kernels = cache_dir() / "extensions"
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "extensions").symlink_to(kernels)
    monkeypatch.setenv("RADIXLM_CACHE", str(cache))
    return cache


def test_engine_keeps_a_quantized_gguf_quantized_with_no_flag(tmp_cache_with_kernels: Path, tmp_path: Path) -> None:
    """`--model-path x.gguf` alone on a file with Q8_0 linear weights: they stay quantized, and the
    greedy output is transformers' on the dequantized weights (where --dtype auto picked float32)."""
    import transformers

    from radixlm.runtime.engine import Engine
    from radixlm.runtime.model.model_files import resolve_model_path

    (tmp_path / "hf").mkdir()
    tiny_family_model("qwen3", tmp_path / "hf")
    linears = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
    kept = {f"blk.{i}.{key}.weight": gguf.GGMLQuantizationType.Q8_0 for i in range(2) for key in linears}
    write_gguf(tmp_path / "hf", tmp_path / "q8.gguf", "qwen3", tensor_types=kept)
    prompt = [1, 7, 8, 9, 10]
    with Engine(str(tmp_path / "q8.gguf"), max_total_tokens=512, random_seed=0) as engine:
        assert engine.runner.quantized_layers == 4 * 2  # qkv, o, gate_up, down per layer
        dtype = engine.runner.cfg.dtype
        out = engine.generate(input_ids=prompt, sampling_params={"temperature": 0, "max_new_tokens": 8, "ignore_eos": True})
    assert len(out["output_ids"]) == 8
    if dtype == torch.float32:
        model_dir = float_checkpoint_dir(resolve_model_path(tmp_path / "q8.gguf"))
        hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0)
        assert out["output_ids"] == ref[0, len(prompt):].tolist()


def test_quantized_experts_of_a_gguf_stay_quantized(tmp_cache_with_kernels: Path, tmp_path: Path) -> None:
    """A Qwen3-MoE GGUF whose stacked experts are Q8_0 (gate, up) and Q4_0 (down), kept (float32
    activations): every expert product holds only its blocks, and the greedy output is
    transformers' on the dequantized weights."""
    import transformers

    from radixlm.runtime.engine import Engine
    from radixlm.runtime.model.model_files import resolve_model_path
    from radixlm.runtime.model.models.moe import SparseMoeBlock

    (tmp_path / "hf").mkdir()
    tiny_family_model("qwen3_moe", tmp_path / "hf")
    q8, q4 = gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0
    kept = {f"blk.{i}.ffn_{kind}_exps.weight": q4 if kind == "down" else q8 for i in range(2)
            for kind in ("gate", "up", "down")}
    write_gguf(tmp_path / "hf", tmp_path / "moe.gguf", "qwen3_moe", tensor_types=kept)
    prompts = [[1, 7, 8, 9, 10], list(range(20, 45))]
    with Engine(str(tmp_path / "moe.gguf"), max_total_tokens=512, random_seed=0, dtype="float32",
                quantization="gguf", quantized_activations="float32") as engine:
        blocks = [layer.mlp for layer in engine.runner.model.layers]
        assert all(isinstance(b, SparseMoeBlock) for b in blocks)
        formats = {(lin.qweight is not None, lin.weight_t is None) for b in blocks for e in b.experts
                   for lin in (e.gate_up_proj, e.down_proj)}
        assert formats == {(True, True)}
        ours = engine.generate(input_ids=prompts, sampling_params={"temperature": 0, "max_new_tokens": 12,
                                                                    "ignore_eos": True})
    hf = transformers.AutoModelForCausalLM.from_pretrained(float_checkpoint_dir(resolve_model_path(tmp_path / "moe.gguf")),
                                                          dtype=torch.float32).eval()
    for prompt, out in zip(prompts, ours):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=None,
                              pad_token_id=0)
        assert out["output_ids"] == ref[0, len(prompt):].tolist()
