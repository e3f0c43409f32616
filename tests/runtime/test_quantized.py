"""Quantized weights in whole models: the runner with block-quantized linear layers (quantized at
load, or kept from the default model's Q4_1 GGUF) against the same model holding the
dequantized weights in float32, through the torch path (prefill, extend) and DecodeStack (decode);
the int8 mode; what `--quantization auto` picks (and where no kernel can run); and that no
float copy of a quantized weight exists. (The kernels alone: tests/kernels/test_quant_gemm.py; through the server:
tests/server/test_quantized_http.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from radixlm_testing import runner_decode, runner_extend, save_tiny_model
from safetensors.torch import load_file

from radixlm.kernels import cpu_linear, isa, quant
from radixlm.runtime.config.server_args import ServerArgs
from radixlm.runtime.model import kernel_policy, model_files
from radixlm.runtime.model.kernel_policy import CpuIsa
from radixlm.runtime.model.model_config import ModelConfig
from radixlm.runtime.model.model_runner import ModelRunner, RunnerConfig, weights_of
from radixlm.runtime.model.models.llama import Linear, QuantizedEmbedding

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _dequantized(state: dict[str, torch.Tensor], fmt: str) -> dict[str, torch.Tensor]:
    """The checkpoint with every decoder linear weight replaced by its quantized-then-dequantized self."""
    return {name: quant.quantize(w, fmt).dequantize() if name.split(".")[-2] in LINEARS and name.endswith(".weight")
            else w
            for name, w in state.items()}


def _logits(runner: ModelRunner, seqs: list[list[int]], prompt_lens: list[int], steps: int) -> torch.Tensor:
    """Every position's logits: prefill of the prompts (torch path), then `steps` teacher-forced
    decode steps of all requests together (DecodeStack where the kernels run)."""
    rows = [runner.req_to_token_pool.alloc() for _ in seqs]
    out = [runner_extend(runner, rows, [0] * len(seqs), [s[:n] for s, n in zip(seqs, prompt_lens)])]
    for step in range(steps):
        out.append(runner_decode(runner, rows, seqs, [n + step for n in prompt_lens]))
    return torch.cat(out).float()


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3", "llama3-rope"])  # qwen2: q/k/v biases
@pytest.mark.parametrize("fmt", ["q8_0", "q4_0", "q4_1", "w8a8_int8"])
@pytest.mark.parametrize("cpu_kernels", [True, False], ids=["decode-stack", "torch-ops"])
def test_weight_only_matches_the_dequantized_float_model(tmp_path: Path, kind: str, fmt: str, cpu_kernels: bool) -> None:
    save_tiny_model(tmp_path, kind)
    cfg = ModelConfig.from_dir(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    seqs = [list(range(3, 40)), [7, 8, 9, 10, 11, 12, 13, 14, 15, 16]]
    ref = ModelRunner(cfg, RunnerConfig(torch.float32, "torch", 512, 4, cfg.context_len), _dequantized(state, fmt))
    runner = ModelRunner(cfg, RunnerConfig(torch.float32, "torch", 512, 4, cfg.context_len, cpu_kernels=cpu_kernels,
                                           quantization=fmt, quant_mode="float32"), state)
    assert runner.quantized_layers == 4 * cfg.num_layers  # qkv, o, gate_up, down; embedding and lm_head stay float
    assert (runner.model.decode_stack is not None) == cpu_kernels
    got, want = _logits(runner, seqs, [30, 4], 6), _logits(ref, seqs, [30, 4], 6)
    assert (got - want).abs().max().item() <= 1e-4


def test_int8_mode_runs_and_stays_close(tmp_path: Path) -> None:
    """The int8 x int8 mode (at this process's ISA level: every level has an int8 dot product)."""
    from radixlm.runtime.model.kernel_policy import load_cpu_kernels

    save_tiny_model(tmp_path, "qwen3")
    cfg = ModelConfig.from_dir(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    seqs = [list(range(3, 40))]
    ref = _logits(ModelRunner(cfg, RunnerConfig(torch.float32, "torch", 512, 4, cfg.context_len),
                              _dequantized(state, "q8_0")), seqs, [30], 6)
    ext = load_cpu_kernels()
    calls = ext.num_vnni_calls()
    runner = ModelRunner(cfg, RunnerConfig(torch.float32, "torch", 512, 4, cfg.context_len, quantization="q8_0",
                                           quant_mode="int8"), state)
    assert runner.model.decode_stack.quant_mode == quant.MODES["int8"]
    got = _logits(runner, seqs, [30], 6)
    assert ext.num_vnni_calls() > calls  # the prefill's products and the decode steps'
    err = (got - ref).abs().max().item()
    assert 0 < err <= 0.05 * ref.abs().max().item(), err  # int8 activations: close (~2% here), not equal


def test_default_model_q4_1_weight_only_within_1e3_of_its_dequantized_float32(default_model_dir: Path) -> None:
    """The default model's own Q4_1 weights, kept as blocks, against the same weights dequantized
    to float32 (another order of additions): every position of a prefill and 64 decode steps."""
    from radixlm.runtime.model.model_files import load_quantized
    from radixlm.runtime.tokenizer.tokenizer import Tokenizer

    cfg = ModelConfig.from_dir(default_model_dir)
    text = ("Quantized weights keep a model small: each block of thirty-two values shares one scale, and the "
            "products read the blocks as they are stored. The scheduler batches requests continuously, the radix "
            "cache keeps every shared prefix, and constrained decoding masks the logits at sampling time. ") * 3
    ids = Tokenizer(default_model_dir).encode(text)[:112]
    runner_cfg = RunnerConfig(torch.float32, "torch", 1024, 4, cfg.context_len, quantization="gguf", quant_mode="float32")
    runner = ModelRunner(cfg, runner_cfg, weights_of(default_model_dir, "gguf"))
    ref = ModelRunner(cfg, RunnerConfig(torch.float32, "torch", 1024, 4, cfg.context_len), weights_of(default_model_dir, "none"))
    got, want = _logits(runner, [ids], [48], 64), _logits(ref, [ids], [48], 64)
    assert got.shape == (112, cfg.vocab_size)
    assert (got - want).abs().max().item() <= 1e-3

    # no float copy of a quantized weight: parameter bytes are the file's blocks (<= 1.1x)
    model = runner.model
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    assert all(m.qweight is not None and m.weight_t is None for m in linears)
    assert isinstance(model.embed_tokens, QuantizedEmbedding)
    assert model.embed_tokens.packed.data_ptr() == model.lm_head.qweight.data_ptr()  # tied: one copy
    assert (model.embed_tokens.ext is not None) == runner.cpu_kernels  # the logits above looked rows up in C++
    gguf_bytes = sum(t.nbytes for t in load_quantized(default_model_dir).values())
    held = sum(m.qweight.numel() for m in linears)
    assert held <= 1.1 * gguf_bytes
    float_params = sum(p.numel() for p in model.parameters())
    assert float_params < 100_000  # the norms' weights


def test_quantization_auto_keeps_a_gguf_only_with_dtype_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RADIXLM_AUTO_QUANTIZATION", raising=False)
    assert ServerArgs().resolved_quantization == "auto"  # a GGUF's quantized tensors, if the model has any
    assert ServerArgs(dtype="float32").resolved_quantization == "none"
    assert ServerArgs(dtype="float32", quantization="q4_0").resolved_quantization == "q4_0"
    monkeypatch.setenv("RADIXLM_AUTO_QUANTIZATION", "none")
    assert ServerArgs().resolved_quantization == "none"
    monkeypatch.setenv("RADIXLM_AUTO_QUANTIZATION", "q5_k")
    with pytest.raises(ValueError, match="RADIXLM_AUTO_QUANTIZATION must be one of"):
        ServerArgs().resolved_quantization  # noqa: B018
    with pytest.raises(ValueError, match="quantization must be one of"):
        ServerArgs(quantization="q5_k")
    with pytest.raises(ValueError, match="w8a8_int8 quantizes activations"):
        ServerArgs(quantization="w8a8_int8", quantized_activations="float32")


def test_quantized_activations_follow_the_cpu() -> None:
    """int8 where the level has a vector int8 dot product that beats float32 activations (every x86
    level but generic, ARM with dotprod), float32 elsewhere; named modes are kept. (Every answer is checked on every machine.)"""
    for fast in (True, False):
        assert ServerArgs().quant_mode(fast) == ("int8" if fast else "float32")
        assert ServerArgs(quantization="w8a8_int8").quant_mode(fast) == "int8_row"
        assert ServerArgs(quantized_activations="float32").quant_mode(fast) == "float32"
    assert CpuIsa("avx512", frozenset({"avx512_vnni"})).int8_dot_is_fast
    assert CpuIsa("avx2_vnni", frozenset({"avx2", "avx_vnni"})).int8_dot_is_fast
    assert CpuIsa("neon_dotprod", frozenset({"neon", "dotprod"})).int8_dot_is_fast
    assert CpuIsa("avx2", frozenset({"avx2", "fma", "f16c"})).int8_dot_is_fast
    assert not CpuIsa("neon", frozenset({"neon"})).int8_dot_is_fast
    assert not CpuIsa("generic", frozenset()).int8_dot_is_fast


def test_quantization_where_no_kernel_can_run(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """No kernel here (no compiler, a failed build): `--quantization auto` loads float weights with
    one log line saying why and what it costs; an explicit quantization is refused at start."""
    monkeypatch.delenv("RADIXLM_AUTO_QUANTIZATION", raising=False)
    from radixlm.runtime.model import kernel_policy

    monkeypatch.setattr(kernel_policy, "load_cpu_kernels", lambda: None)
    cfg = _tiny_config()
    with caplog.at_level("WARNING", logger=kernel_policy.__name__):
        runner = RunnerConfig.from_server_args(ServerArgs(max_total_tokens=64), cfg, quantized=True)
    assert runner.quantization == "none" and runner.quantize_to is None
    (warning,) = [r.getMessage() for r in caplog.records if r.name == kernel_policy.__name__]
    assert "loaded as float32 instead" in warning and "cannot run here" in warning
    for explicit in ("gguf", "q4_0", "w8a8_int8"):
        with pytest.raises(ValueError, match=f"--quantization {explicit} needs the C\\+\\+ CPU kernels"):
            RunnerConfig.from_server_args(ServerArgs(quantization=explicit, max_total_tokens=64), cfg, quantized=True)


def _tiny_config() -> ModelConfig:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        save_tiny_model(Path(d), "llama")
        return ModelConfig.from_dir(d)


def test_quantized_auto_dtype_is_float32_over_a_bf16_pool_where_the_cpu_has_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """--dtype auto with quantized weights: float32 activations (what the kernels take), the KV
    pool in bfloat16 where the CPU multiplies bf16 in hardware (the paged kernel takes every extend), else
    float32; float weights keep `auto`'s own choice; an explicit --dtype is kept."""
    import torch

    monkeypatch.delenv("RADIXLM_CPU_AUTO_DTYPE", raising=False)
    cfg = _tiny_config()
    own = kernel_policy.load_cpu_kernels()
    assert own is not None, "the suite builds the C++ CPU kernels (make test)"
    for bf16 in (True, False):
        chosen = CpuIsa("avx512", frozenset({"avx512_bf16"} if bf16 else set()))
        monkeypatch.setattr(kernel_policy, "cpu_isa", lambda chosen=chosen: chosen)
        # this CPU's own kernels, not the level's: it may be above this CPU (only the dtype choice is tested)
        monkeypatch.setattr(kernel_policy, "load_cpu_kernels", lambda: own)
        monkeypatch.setattr(cpu_linear, "prefers_bf16", lambda in_hardware, load_ext: in_hardware)
        quantized = RunnerConfig.from_server_args(ServerArgs(max_total_tokens=64), cfg, quantized=True)
        assert quantized.dtype == torch.float32
        assert quantized.kv_dtype == (torch.bfloat16 if bf16 else torch.float32)
        plain = RunnerConfig.from_server_args(ServerArgs(max_total_tokens=64), cfg, quantized=False)
        assert plain.dtype == plain.kv_dtype == (torch.bfloat16 if bf16 else torch.float32)
        explicit = RunnerConfig.from_server_args(ServerArgs(dtype="float32", max_total_tokens=64), cfg, quantized=True)
        assert explicit.dtype == explicit.kv_dtype == torch.float32


@pytest.mark.parametrize("cpu_kernels", [True, False], ids=["paged-kernel", "torch-ops"])
def test_float32_activations_over_a_bf16_pool(tmp_path: Path, cpu_kernels: bool) -> None:
    """A quantized model's float32 activations over a bfloat16 KV pool (prefill, then decode steps)
    stay as close to the float32 pool as rounding K/V to bfloat16 allows."""
    save_tiny_model(tmp_path, "qwen3", head_dim=64)
    cfg = ModelConfig.from_dir(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    seqs = [list(range(3, 60)), [9, 8, 7, 6, 5, 4, 3, 2, 1, 10, 11, 12]]
    logits = {}
    for kv in (torch.float32, torch.bfloat16):
        runner = ModelRunner(cfg, RunnerConfig(torch.float32, "torch", 512, 4, cfg.context_len, cpu_kernels=cpu_kernels,
                                               quantization="q8_0", quant_mode="float32", kv_dtype=kv), state)
        assert runner.kv_pool.k_buffer[0].dtype == kv
        logits[kv] = _logits(runner, seqs, [40, 5], 6)
    err = (logits[torch.bfloat16] - logits[torch.float32]).abs().max().item()
    assert 0 < err < 0.05 * logits[torch.float32].abs().max().item(), err


def test_the_generic_level_loads_float_weights_for_quantization_auto(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """At the generic ISA level (which every CPU runs; the real build is loaded) our quantized
    kernels lose to torch's float32 GEMM: `--quantization auto` loads float weights with one log
    line saying why, an explicit quantization is kept, and float32 products take our kernel up to
    GENERIC_FLOAT32_MAX_ROWS rows only."""
    from radixlm.runtime.model import kernel_policy

    monkeypatch.delenv("RADIXLM_AUTO_QUANTIZATION", raising=False)
    features = isa.probe(model_files.cache_dir() / "extensions")
    assert features is not None
    generic = isa.choose_level(features, "generic")
    monkeypatch.setitem(kernel_policy._chosen, "isa", CpuIsa(generic.name, frozenset(features.present & generic.allows)))
    cfg = _tiny_config()
    with caplog.at_level("WARNING", logger=kernel_policy.__name__):
        runner = RunnerConfig.from_server_args(ServerArgs(max_total_tokens=64), cfg, quantized=True)
    assert runner.quantization == "none" and runner.quant_mode == "float32"
    (warning,) = [r.getMessage() for r in caplog.records if r.name == kernel_policy.__name__]
    assert "loaded as float32 instead" in warning and "generic ISA level" in warning
    explicit = RunnerConfig.from_server_args(ServerArgs(quantization="gguf", max_total_tokens=64), cfg, quantized=True)
    assert explicit.quantization == "gguf"
    assert kernel_policy.cpu_isa().kernel_max_rows(torch.float32, "emulated") == kernel_policy.GENERIC_FLOAT32_MAX_ROWS


def test_k_quants_kept_from_a_file_match_the_dequantized_float_model(tmp_path: Path) -> None:
    """Q4_K_M's mix as a GGUF load hands it over (QuantizedTensors in the state): Q4_K for q / k /
    v / o / gate / up, Q6_K for down, and a Q6_K embedding tied to the lm_head, through the torch
    path and DecodeStack, against the same model holding gguf's dequantized weights. The K-quants
    need K a multiple of 256: a 256-wide model."""
    save_tiny_model(tmp_path, "llama", hidden_size=256, intermediate_size=512, tie_word_embeddings=True)
    cfg = ModelConfig.from_dir(tmp_path)
    state = load_file(tmp_path / "model.safetensors")

    def fmt_of(name: str) -> str | None:
        if name == "model.embed_tokens.weight" or name.endswith("down_proj.weight"):
            return "q6_k"
        return "q4_k" if name.split(".")[-2] in LINEARS and name.endswith(".weight") else None

    blocks = {name: quant.quantize(w, fmt) for name, w in state.items() if (fmt := fmt_of(name))}
    seqs = [list(range(3, 40)), [7, 8, 9, 10, 11, 12, 13, 14, 15, 16]]
    ref = ModelRunner(cfg, RunnerConfig(torch.float32, "torch", 512, 4, cfg.context_len),
                      {**state, **{name: b.dequantize() for name, b in blocks.items()}})
    runner = ModelRunner(cfg, RunnerConfig(torch.float32, "torch", 512, 4, cfg.context_len, quant_mode="float32"),
                         {**state, **blocks})
    # qkv, o, gate_up, down per layer, and the lm_head tied to the Q6_K embedding
    assert runner.quantized_layers == 4 * cfg.num_layers + 1 and runner.model.decode_stack is not None
    assert isinstance(runner.model.embed_tokens, QuantizedEmbedding)
    got, want = _logits(runner, seqs, [30, 4], 6), _logits(ref, seqs, [30, 4], 6)
    assert (got - want).abs().max().item() <= 1e-4
