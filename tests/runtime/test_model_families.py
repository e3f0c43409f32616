"""The dense families beside Llama/Qwen (issue 35) against transformers, on tiny random-weight
models that transformers builds from each family's config class (radixlm_testing.FAMILY_CONFIGS:
windows shorter than the sequences, soft-caps the logits reach, multipliers away from 1, partial
rotary with longrope crossing its original length, a layer without RoPE).

References are transformers' own cached calls, chunk for chunk as our runner takes them (prefill,
extend over the cached prefix, one decode step at a time): LongRoPE picks its factors per call,
so only the same chunks give the same numbers. The greedy test runs the Engine against
`generate`; tests/server/test_model_families_http.py does the same through the server."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from radixlm_testing import FAMILY_CONFIGS, runner_decode, runner_extend, save_tiny_model
from safetensors.torch import load_file

from radixlm.runtime.model.model_config import ModelConfig, UnsupportedModelError
from radixlm.runtime.model.model_runner import ModelRunner, RunnerConfig
from radixlm.runtime.model.tp_sharding import check_tp_size

FAMILIES = sorted(FAMILY_CONFIGS)
ATOL = 1e-4
# the families whose every option DecodeStack (the C++ decode step) implements
IN_DECODE_STACK = {"granite", "phi3"}


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[torch.nn.Module, Path]]:
    out = {}
    for kind in FAMILIES:
        path = tmp_path_factory.mktemp(kind)
        out[kind] = (save_tiny_model(path, kind), path)
    return out


def hf_chunks(hf: torch.nn.Module, seq: list[int], cuts: list[int]) -> list[torch.Tensor]:
    """transformers' logits for seq[cuts[i]:cuts[i+1]], each chunk one call over the cache of those before."""
    cache, out = None, []
    with torch.no_grad():
        for start, stop in zip(cuts, cuts[1:]):
            res = hf(torch.tensor([seq[start:stop]]), cache=cache, use_cache=True)
            cache = res.cache
            out.append(res.logits[0])
    return out


@pytest.mark.parametrize("batch_size", [1, 7, 32])
@pytest.mark.parametrize("kind", FAMILIES)
def test_prefill_extend_and_decode_match_hf(family_dirs: dict[str, tuple[torch.nn.Module, Path]], kind: str,
                                            batch_size: int) -> None:
    """fp32 logits within 1e-4 of transformers: a batch's prefill, its extend over the cached
    prefixes, three decode steps, over scattered pool slots (our C++ kernels where they run)."""
    check_batch(*family_dirs[kind], kind, batch_size, cpu_kernels=True)


@pytest.mark.parametrize("kind", FAMILIES)
def test_torch_ops_path_matches_hf(family_dirs: dict[str, tuple[torch.nn.Module, Path]], kind: str) -> None:
    """The same on torch ops alone (no C++ kernels: every layer's attention on the torch path)."""
    check_batch(*family_dirs[kind], kind, 7, cpu_kernels=False)


def check_batch(hf: torch.nn.Module, path: Path, kind: str, batch_size: int, cpu_kernels: bool) -> None:
    cfg = ModelConfig.from_dir(path)
    runner = ModelRunner(cfg, RunnerConfig(torch.float32, "torch", 8192, batch_size + 1, cfg.context_len,
                                           cpu_kernels=cpu_kernels), load_file(path / "model.safetensors"))
    if runner.cpu_kernels:
        assert (runner.model.decode_stack is not None) == (kind in IN_DECODE_STACK)
    gen = torch.Generator().manual_seed(batch_size)
    seqs = [torch.randint(0, 256, (int(torch.randint(12, 40, (1,), generator=gen)),), generator=gen).tolist()
            for _ in range(batch_size)]
    cached, mid = [len(s) - 9 for s in seqs], [len(s) - 3 for s in seqs]
    refs = [hf_chunks(hf, s, [0, c, m, m + 1, m + 2, m + 3]) for s, c, m in zip(seqs, cached, mid)]
    held = runner.kv_pool.alloc(2 * sum(len(s) for s in seqs))  # free every other slot: the requests' slots scatter
    assert held is not None
    runner.kv_pool.free(held[::2].clone())
    rows = [runner.req_to_token_pool.alloc() for _ in seqs]
    got = runner_extend(runner, rows, [0] * batch_size, [s[:c] for s, c in zip(seqs, cached)])
    assert (got - torch.cat([r[0] for r in refs])).abs().max().item() <= ATOL
    got = runner_extend(runner, rows, cached, [s[c:m] for s, c, m in zip(seqs, cached, mid)])
    assert (got - torch.cat([r[1] for r in refs])).abs().max().item() <= ATOL
    for step in range(3):
        got = runner_decode(runner, rows, seqs, [m + step for m in mid])
        assert (got - torch.cat([r[2 + step] for r in refs])).abs().max().item() <= ATOL, step
    if runner.cpu_kernels and batch_size > 1 and kind in ("gemma3", "phi3"):  # windows without a soft-cap
        assert runner.attn_backend.num_window_view_forwards == 3  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", ["mixtral", "qwen3_moe"])
def test_quantization_at_load_quantizes_every_expert(family_dirs: dict[str, tuple[torch.nn.Module, Path]],
                                                     kind: str) -> None:
    """--quantization q8_0: each expert's two products hold only their blocks (the router and
    Qwen3-MoE's dense layer as every dense family's: router float, dense MLP quantized). The
    block's numbers on such blocks are tests/runtime/test_moe.py's."""
    from radixlm.runtime.model.models.moe import SparseMoeBlock

    _, path = family_dirs[kind]
    cfg = ModelConfig.from_dir(path)
    runner = ModelRunner(cfg, RunnerConfig(torch.float32, "torch", 512, 2, cfg.context_len, quantization="q8_0"),
                         load_file(path / "model.safetensors"))
    blocks = [layer.mlp for layer in runner.model.layers if isinstance(layer.mlp, SparseMoeBlock)]
    assert len(blocks) == (1 if kind == "qwen3_moe" else 2)
    experts = [lin for block in blocks for e in block.experts for lin in (e.gate_up_proj, e.down_proj)]
    assert len(experts) == 2 * 4 * len(blocks)
    assert all(lin.qweight is not None and lin.weight_t is None for lin in experts)
    assert all(block.gate.dtype == torch.float32 for block in blocks)
    if runner.model.layers[0].qkv_proj.method is not None:  # the C++ kernels run here: one fused call a layer
        assert all(block.fused is not None for block in blocks)


def hf_greedy(hf: torch.nn.Module, prompt: list[int], steps: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=steps, do_sample=False, eos_token_id=None,
                          pad_token_id=0)
    return out[0, len(prompt):].tolist()


# past the windows (6, 20); Phi-3's longrope (original length 24): one request short throughout,
# one long from its prompt on (generate recomputes the whole cache when a sequence crosses the
# original length; we do not: see models/rotary.py)
GREEDY_PROMPTS = [[200, 13, 13, 7], [5, 9, 2, 77, 31, 8, 100, 4, 61, 3] * 3]
GREEDY_STEPS = 20


def test_engine_greedy_matches_hf_generate(family_models: dict[str, tuple[torch.nn.Module, Path]]) -> None:
    """Greedy tokens of every family through the in-process Engine (two requests batched) equal
    transformers' generate."""
    from radixlm.runtime.engine import Engine

    params = {"temperature": 0, "max_new_tokens": GREEDY_STEPS, "ignore_eos": True}
    for kind, (hf, path) in family_models.items():
        engine = Engine(str(path), max_total_tokens=2048, dtype="float32")
        try:
            out = engine.generate(input_ids=GREEDY_PROMPTS, sampling_params=params)
        finally:
            engine.shutdown()
        assert [r["output_ids"] for r in out] == [hf_greedy(hf, p, GREEDY_STEPS) for p in GREEDY_PROMPTS], kind


def test_unknown_architecture_is_refused_by_name() -> None:
    raw = dict(FAMILY_CONFIGS["olmo2"], architectures=["FalconForCausalLM"], vocab_size=256)
    with pytest.raises(UnsupportedModelError) as err:
        ModelConfig.from_dict(raw)
    msg = str(err.value)
    assert "FalconForCausalLM" in msg
    supported = sorted(["LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                        "Gemma2ForCausalLM", "Gemma3ForCausalLM", "Phi3ForCausalLM", "Olmo2ForCausalLM",
                        "GraniteForCausalLM", "SmolLM3ForCausalLM", "Qwen3MoeForCausalLM", "MixtralForCausalLM",
                        "OlmoeForCausalLM"])
    assert f"supported: {supported}" in msg


def test_options_we_do_not_implement_are_refused(family_dirs: dict[str, tuple[torch.nn.Module, Path]]) -> None:
    gemma = dict(FAMILY_CONFIGS["gemma3"], vocab_size=256)
    with pytest.raises(UnsupportedModelError, match="use_bidirectional_attention"):
        ModelConfig.from_dict(dict(gemma, use_bidirectional_attention=True))
    with pytest.raises(UnsupportedModelError, match="activation 'relu'"):
        ModelConfig.from_dict(dict(gemma, hidden_activation="relu"))
    with pytest.raises(ValueError, match="q/k RMSNorm spans every head"):
        check_tp_size(ModelConfig.from_dir(family_dirs["olmo2"][1]), 2)
    cfg = ModelConfig.from_dir(family_dirs["gemma2"][1])
    with pytest.raises(ValueError, match="triton attention backend does not implement sliding-window attention"):
        ModelRunner(cfg, RunnerConfig(torch.float32, "triton", 256, 2, cfg.context_len),
                    load_file(family_dirs["gemma2"][1] / "model.safetensors"))


def test_moe_config_options() -> None:
    """The MoE families' attention options and expert shapes as their configs say; what we do not
    implement, or tensor parallelism cannot split, refused by name."""
    qwen = ModelConfig.from_dict(dict(FAMILY_CONFIGS["qwen3_moe"], vocab_size=256))
    mixtral = ModelConfig.from_dict(dict(FAMILY_CONFIGS["mixtral"], vocab_size=256))
    olmoe = ModelConfig.from_dict(dict(FAMILY_CONFIGS["olmoe"], vocab_size=256))
    assert (qwen.qk_norm, mixtral.qk_norm, olmoe.qk_norm) == ("head", "none", "projection")
    assert (qwen.sliding_window, mixtral.sliding_window, mixtral.context_len) == (None, 64, 64)
    assert qwen.moe is not None and [qwen.moe.is_sparse_layer(i) for i in range(2)] == [True, False]
    assert mixtral.moe is not None and mixtral.moe.names.up == "w3" and mixtral.moe.moe_intermediate_size == 32
    with pytest.raises(UnsupportedModelError, match="clip_qkv"):
        ModelConfig.from_dict(dict(FAMILY_CONFIGS["olmoe"], vocab_size=256, clip_qkv=8.0))
    with pytest.raises(UnsupportedModelError, match="experts with hidden_act 'gelu_pytorch_tanh'"):
        ModelConfig.from_dict(dict(FAMILY_CONFIGS["mixtral"], vocab_size=256, hidden_act="gelu_pytorch_tanh"))
    with pytest.raises(ValueError, match=r"experts' intermediate size \(33\)"):
        check_tp_size(ModelConfig.from_dict(dict(FAMILY_CONFIGS["qwen3_moe"], vocab_size=256,
                                                 moe_intermediate_size=33)), 2)
    with pytest.raises(ValueError, match="q/k RMSNorm spans every head"):
        check_tp_size(olmoe, 2)


def test_older_config_spellings() -> None:
    """Gemma 3's rope_theta / rope_local_base_freq / rope_scaling / sliding_window_pattern and
    Phi-3's `su` rope type, as configs on the hubs still write them."""
    gemma = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4, vocab_size=256,
                 architectures=["Gemma3ForCausalLM"], head_dim=16, rope_theta=1e6, rope_local_base_freq=1e4,
                 rope_scaling={"rope_type": "linear", "factor": 8.0}, sliding_window=512, sliding_window_pattern=3)
    cfg = ModelConfig.from_dict(gemma)
    assert [layer.sliding_window for layer in cfg.layers] == [512, 512, None, 512, 512, None]
    local, full = cfg.layers[0].rope, cfg.layers[2].rope
    assert local is not None and full is not None
    assert (local.theta, local.scaling_type, full.theta, full.scaling_type, full.factor) == (1e4, "default", 1e6,
                                                                                             "linear", 8.0)
    phi = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=256,
               architectures=["Phi3ForCausalLM"], max_position_embeddings=4096, original_max_position_embeddings=1024,
               rope_scaling={"type": "su", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8})
    rope = ModelConfig.from_dict(phi).rope
    assert rope.scaling_type == "longrope" and rope.original_max_position_embeddings == 1024
    assert rope.attention_factor == pytest.approx(math.sqrt(1 + math.log(4) / math.log(1024)))


@pytest.mark.parametrize("kind", ["gemma2", "granite", "phi3", "smollm3", "qwen3_moe"])
def test_tp2_logits_match_tp1(family_dirs: dict[str, tuple[torch.nn.Module, Path]], kind: str) -> None:
    """Tensor parallel over 2 ranks (rank 1 a real process) gives tp 1's logits: Gemma 2's norms on
    the sublayer outputs after the all-reduce, Phi-3's fused checkpoint tensors cut per part,
    Granite's multipliers, SmolLM3's MLP biases (down_proj's added once), Qwen3-MoE's experts
    split by width beside a dense layer."""
    _, path = family_dirs[kind]
    cfg = ModelConfig.from_dir(path)
    runner_cfg = RunnerConfig(torch.float32, "torch", 2000, 8, cfg.context_len)
    seqs = [list(range(3, 40)), [7, 8, 9, 10, 11, 12, 13, 14, 15, 16], [5, 9] * 12]

    def passes(runner: ModelRunner) -> list[torch.Tensor]:
        rows = [runner.req_to_token_pool.alloc() for _ in seqs]
        first, ends = [10, 4, 7], [len(s) - 1 for s in seqs]
        return [runner_extend(runner, rows, [0, 0, 0], [s[:n] for s, n in zip(seqs, first)]),
                runner_extend(runner, rows, first, [s[n:e] for s, n, e in zip(seqs, first, ends)]),
                runner_decode(runner, rows, seqs, ends)]

    threads = torch.get_num_threads()
    want = passes(ModelRunner.from_dir(path, runner_cfg))
    tp = ModelRunner.from_dir(path, runner_cfg, tp_size=2)
    try:
        got = passes(tp)
        assert tp.kv_pool.k_buffer[0].shape[1] == 1  # half the KV heads
        if cfg.moe is not None:  # half of each expert's width
            assert tp.model.layers[0].mlp.experts[0].down_proj.in_features == cfg.moe.moe_intermediate_size // 2
    finally:
        tp.close()
        torch.set_num_threads(threads)  # rank 0 took its share of the cores
    for name, g, w in zip(("prefill", "extend", "decode"), got, want):
        assert (g - w).abs().max().item() <= 1e-5, name


def test_every_family_through_the_scheduler_paths(family_models: dict[str, tuple[torch.nn.Module, Path]]) -> None:
    """Each family through the paths a server runs: a prompt prefilled in 16-token chunks beside a
    short one (continuous batching), then a follow-up that extends the first from the radix cache,
    greedy equal to transformers' generate; and a regex-constrained request in the same engine."""
    import re

    from radixlm.runtime.engine import Engine

    long_prompt, short_prompt = GREEDY_PROMPTS[1] + [11, 12, 14], GREEDY_PROMPTS[0]
    follow_up = long_prompt + [17, 19]
    params = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
    for kind, (hf, path) in family_models.items():
        # Phi-3's longrope takes a request's factors by its length so far (models/rotary.py): a first
        # chunk shorter than its original length (24) would cache short-factor keys that transformers'
        # whole-prompt forward gives long factors; its chunks start past that length
        chunk = 32 if kind == "phi3" else 16
        engine = Engine(str(path), max_total_tokens=2048, dtype="float32", chunked_prefill_size=chunk)
        try:
            first = engine.generate(input_ids=[long_prompt, short_prompt], sampling_params=params)
            second = engine.generate(input_ids=follow_up, sampling_params=params)
            constrained = engine.generate(input_ids=short_prompt, sampling_params={
                "temperature": 0, "max_new_tokens": 16, "regex": "(yes|no)[0-9]{2}"})
        finally:
            engine.shutdown()
        assert [r["output_ids"] for r in first] == [hf_greedy(hf, p, 8) for p in (long_prompt, short_prompt)], kind
        assert second["meta_info"]["cached_tokens"] >= len(long_prompt) - 1, kind  # the radix cache held it
        assert second["output_ids"] == hf_greedy(hf, follow_up, 8), kind
        assert re.fullmatch("(yes|no)[0-9]{2}", constrained["text"]), (kind, constrained["text"])
