"""The mixture-of-experts block (runtime/model/models/moe.py) against transformers' own sparse MoE
block of Qwen3-MoE, Mixtral and OLMoE: a tiny random-weight model per family, saved by
transformers, whose layers' blocks load into ours by their checkpoint names."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from radixlm.kernels import quant
from radixlm.runtime.model import kernel_policy
from radixlm.runtime.model.models.moe import (
    MIXTRAL_NAMES,
    QWEN_NAMES,
    Expert,
    SparseMoeBlock,
    group_by_expert,
    moe_options_from_hf,
)
from radixlm.runtime.model.models.weights import WeightLoadError

TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=128, max_position_embeddings=64)
FAMILIES = ("qwen3_moe", "mixtral", "olmoe")
TOKEN_COUNTS = (1, 7, 32)


def tiny_config(family: str) -> Any:
    """A tiny config of the family from transformers' class: 8 experts of width 64 (the fused
    kernel's float32 tile), top-2, hidden 64. Qwen3-MoE's second layer is dense (mlp_only_layers)
    and its weights renormalised; OLMoE's are not."""
    from transformers import MixtralConfig, OlmoeConfig, Qwen3MoeConfig

    if family == "qwen3_moe":
        return Qwen3MoeConfig(**TINY, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64,
                              norm_topk_prob=True, mlp_only_layers=[1])
    if family == "mixtral":
        return MixtralConfig(**TINY | {"intermediate_size": 64}, num_local_experts=8, num_experts_per_tok=2)
    return OlmoeConfig(**TINY | {"intermediate_size": 64}, num_experts=8, num_experts_per_tok=2)


def is_hf_sparse(mlp: torch.nn.Module) -> bool:
    return type(mlp).__name__.endswith("SparseMoeBlock")


@pytest.fixture(scope="module", params=FAMILIES)
def saved(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, dict]]:
    """(transformers model, its saved checkpoint's tensors) of one family, random weights (scaled up
    so the router's probabilities are far apart and each expert's output is not tiny)."""
    from transformers import AutoModelForCausalLM

    config = tiny_config(request.param)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".mlp." in name:
                param.copy_(torch.randn_like(param) * (0.5 if ".gate." in name else 0.2))
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    yield model, load_file(Path(path) / "model.safetensors")


def cpu_kernels() -> Any:
    ext = kernel_policy.load_cpu_kernels()
    if ext is None:
        pytest.skip("the C++ CPU kernels cannot run here")
    return ext


def our_block(model: Any, tensors: dict, layer: int, kernels: bool, **load: Any) -> SparseMoeBlock:
    options = moe_options_from_hf(model.config.to_dict())
    assert options is not None
    block = SparseMoeBlock(options, model.config.hidden_size)
    block.load_weights(tensors, f"model.layers.{layer}.", **load)
    if kernels:
        ext = cpu_kernels()
        chosen = kernel_policy.cpu_isa()
        assert chosen is not None
        block.use_cpu_kernels(ext, kernel_policy.bf16_path(ext), chosen)
    return block


def tokens(n: int, hidden: int = 64) -> torch.Tensor:
    return torch.randn(n, hidden, generator=torch.Generator().manual_seed(n))


@pytest.mark.parametrize("kernels", [False, True], ids=["torch", "cpu-kernels"])
def test_block_matches_transformers(saved: tuple[Any, dict], kernels: bool) -> None:
    """Every sparse layer of the saved model loads by its hub names, and its block equals
    transformers' within 1e-5 (float32) for 1, 7 and 32 tokens; the dense layers are those
    transformers builds dense. With the C++ kernels, every routed expert runs in the one fused
    call (moe_experts), never the per-expert layers (float experts past their kernel's rows
    excepted: those take torch's GEMM, one expert at a time)."""
    model, tensors = saved
    options = moe_options_from_hf(model.config.to_dict())
    assert options is not None
    sparse = [i for i, layer in enumerate(model.model.layers) if is_hf_sparse(layer.mlp)]
    assert sparse == [i for i in range(model.config.num_hidden_layers) if options.is_sparse_layer(i)]
    for i in sparse:
        block = our_block(model, tensors, i, kernels)
        assert (block.fused is not None) == kernels
        runs: list[int] = []
        for e, expert in enumerate(block.experts):
            expert.register_forward_pre_hook(lambda *_, e=e, runs=runs: runs.append(e))
        for n in TOKEN_COUNTS:
            x = tokens(n)
            runs.clear()
            with torch.no_grad():
                expected = model.model.layers[i].mlp(x[None])[0]
                got = block(x)
            assert (not runs) == (block.fused is not None and n <= block.fused.max_rows)
            assert got.dtype == torch.float32
            assert (got - expected).abs().max().item() <= 1e-5, (i, n)


def test_each_routed_expert_runs_once(saved: tuple[Any, dict]) -> None:
    """A step runs one product per routed expert, with all its rows, and none for the others."""
    model, tensors = saved
    block = our_block(model, tensors, 0, kernels=False)
    runs: list[tuple[int, int]] = []
    for e, expert in enumerate(block.experts):
        expert.register_forward_hook(lambda _m, args, _out, e=e: runs.append((e, args[0].shape[0])))
    top_k, num_experts = block.options.top_k, block.options.num_experts
    for n in TOKEN_COUNTS:
        runs.clear()
        x = tokens(n)
        ids, _ = block.route(x)
        with torch.no_grad():
            block(x)
        ran = [e for e, _ in runs]
        assert len(ran) == len(set(ran)) <= min(num_experts, n * top_k)
        assert sorted(ran) == sorted(set(ids.flatten().tolist()))  # exactly the routed experts
        assert dict(runs) == {e: int((ids == e).sum()) for e in ran}  # each with all its rows
        assert sum(rows for _, rows in runs) == n * top_k
    runs.clear()
    with torch.no_grad():
        assert block(torch.empty(0, 64)).shape == (0, 64) and not runs


def test_group_by_expert() -> None:
    ids = torch.tensor([[3, 0], [0, 5], [5, 3], [1, 0]])
    weights = torch.arange(8, dtype=torch.float32).reshape(4, 2)
    groups = group_by_expert(ids, weights)
    assert groups.expert_ids == [0, 1, 3, 5]
    assert groups.offsets == [0, 3, 4, 6, 8]
    assert groups.token_ids.tolist() == [0, 1, 3, 3, 0, 2, 1, 2]
    assert groups.weights.tolist() == [1.0, 2.0, 7.0, 6.0, 0.0, 5.0, 3.0, 4.0]
    assert groups.inverse.tolist() == [4, 0, 1, 6, 7, 5, 3, 2]
    assert torch.equal(groups.weights[groups.inverse], weights.flatten())


def test_quantized_experts_stay_quantized(saved: tuple[Any, dict]) -> None:
    """Experts given as GGUF blocks (q4_0, q8_0) load as blocks only, and the block equals
    transformers' with the blocks' dequantized values; `quantize_to` does the same from floats."""
    model, tensors = saved
    cpu_kernels()
    names = moe_options_from_hf(model.config.to_dict()).names  # type: ignore[union-attr]
    blocks = {name: quant.quantize(w, "q4_0" if f".{names.down}." in name else "q8_0")
              for name, w in tensors.items() if ".experts." in name and name.startswith("model.layers.0.")}
    from_file = our_block(model, tensors | blocks, 0, kernels=True)
    from_floats = our_block(model, tensors, 0, kernels=True, quantize_to="q8_0")
    for block in (from_file, from_floats):
        assert block.fused is not None  # q8_0 gate_up and q4_0 down (from_file) in one call
        for expert in block.experts:
            assert isinstance(expert, Expert)
            for linear in (expert.gate_up_proj, expert.down_proj):
                assert linear.weight_t is None and linear.qweight is not None
    hf = model.model.layers[0].mlp
    original = {k: v.clone() for k, v in hf.experts.state_dict().items()}
    with torch.no_grad():
        for e in range(model.config.num_experts):
            p = f"model.layers.0.{names.block}.experts.{e}."
            gate_up = torch.cat([blocks[f"{p}{names.gate}.weight"].dequantize(), blocks[f"{p}{names.up}.weight"].dequantize()])
            hf.experts.gate_up_proj[e].copy_(gate_up)
            hf.experts.down_proj[e].copy_(blocks[f"{p}{names.down}.weight"].dequantize())
        try:
            for n in TOKEN_COUNTS:
                x = tokens(n)
                assert (from_file(x) - hf(x[None])[0]).abs().max().item() <= 1e-5
        finally:
            hf.experts.load_state_dict(original)


def test_loads_transformers_in_memory_form(saved: tuple[Any, dict]) -> None:
    """A model's state_dict (fused 3-D experts under `mlp.`) loads too, to the same block."""
    model, tensors = saved
    from_state = our_block(model, dict(model.state_dict()), 0, kernels=False)
    from_file = our_block(model, tensors, 0, kernels=False)
    x = tokens(7)
    with torch.no_grad():
        assert torch.equal(from_state(x), from_file(x))


def test_missing_or_misshapen_expert_is_refused(saved: tuple[Any, dict]) -> None:
    model, tensors = saved
    names = moe_options_from_hf(model.config.to_dict()).names  # type: ignore[union-attr]
    missing = f"model.layers.0.{names.block}.experts.5.{names.down}.weight"
    with pytest.raises(WeightLoadError, match=missing.replace(".", r"\.")):
        our_block(model, {k: v for k, v in tensors.items() if k != missing}, 0, kernels=False)
    with pytest.raises(WeightLoadError, match="expected shape"):
        our_block(model, tensors | {missing: tensors[missing][:, :16]}, 0, kernels=False)


@pytest.mark.parametrize("family", FAMILIES)
def test_options_follow_transformers_config(family: str) -> None:
    """The options read from a config.json equal what transformers' config class says, for a
    full dict and for one that names only the architecture (the class's defaults)."""
    from transformers import AutoConfig

    config = tiny_config(family)
    default = AutoConfig.for_model(config.model_type)
    named = {"architectures": [type(config).__name__.replace("Config", "ForCausalLM")]}
    for hf, source in ((config.to_dict() | named, config), (named, default)):
        options = moe_options_from_hf(hf)
        assert options is not None
        assert options.num_experts == source.num_experts  # an alias of num_local_experts in each class
        assert options.top_k == source.num_experts_per_tok
        expected_width = source.moe_intermediate_size if family == "qwen3_moe" else source.intermediate_size
        assert options.moe_intermediate_size == expected_width
        assert options.norm_topk_prob == (True if family == "mixtral" else source.norm_topk_prob)
        assert options.router_weights_in_float32 == (family == "mixtral")
        assert options.names == (MIXTRAL_NAMES if family == "mixtral" else QWEN_NAMES)
        if family == "qwen3_moe":
            assert options.decoder_sparse_step == source.decoder_sparse_step
            assert list(options.mlp_only_layers) == source.mlp_only_layers


def test_options_refuse_bad_configs() -> None:
    assert moe_options_from_hf({"architectures": ["LlamaForCausalLM"]}) is None
    with pytest.raises(ValueError, match="top_k"):
        moe_options_from_hf({"architectures": ["MixtralForCausalLM"], "num_local_experts": 4, "num_experts_per_tok": 5})
    with pytest.raises(ValueError, match="gelu"):
        moe_options_from_hf({"architectures": ["OlmoeForCausalLM"], "hidden_act": "gelu"})
