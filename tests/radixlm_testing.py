"""Test helpers: tiny random-weight HF models written to disk, and references computed with HF."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

TINY_COMMON: dict[str, Any] = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    initializer_range=0.1,
    tie_word_embeddings=False,
)

TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "llama": dict(TINY_COMMON, architectures=["LlamaForCausalLM"], model_type="llama", rope_theta=10000.0),
    "llama3-rope": dict(
        TINY_COMMON,
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        tie_word_embeddings=True,
        num_key_value_heads=1,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        rope_theta=500000.0,
    ),
    "qwen2": dict(TINY_COMMON, architectures=["Qwen2ForCausalLM"], model_type="qwen2", rope_theta=1000000.0),
    "qwen3": dict(
        TINY_COMMON,
        architectures=["Qwen3ForCausalLM"],
        model_type="qwen3",
        head_dim=32,
        num_key_value_heads=1,
        rope_theta=1000000.0,
    ),
    "mistral": dict(TINY_COMMON, architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=None),
}


# The families beside Llama/Qwen (issue 35), tiny, with every option they have set so that it
# counts: windows shorter than the test sequences (with full layers beside them), soft-caps the
# logits reach, scales and multipliers away from 1, partial rotary with longrope (an original
# length the sequences cross), a layer without RoPE.
_SHORT_LONG = dict(short_factor=[1.0, 1.1, 1.3, 1.6, 2.0, 2.5], long_factor=[1.0, 1.5, 2.5, 4.0, 6.0, 9.0])
FAMILY_CONFIGS: dict[str, dict[str, Any]] = {
    "gemma2": dict(TINY_COMMON, architectures=["Gemma2ForCausalLM"], model_type="gemma2", head_dim=16,
                   sliding_window=6, layer_types=["sliding_attention", "full_attention"], query_pre_attn_scalar=24,
                   attn_logit_softcapping=1.5, final_logit_softcapping=2.0),
    "gemma3": dict(TINY_COMMON, architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", head_dim=16,
                   sliding_window=6, layer_types=["sliding_attention", "full_attention"], query_pre_attn_scalar=24,
                   final_logit_softcapping=2.0,
                   rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                    "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}}),
    "phi3": dict(TINY_COMMON, architectures=["Phi3ForCausalLM"], model_type="phi3", sliding_window=20,
                 pad_token_id=0, bos_token_id=1, eos_token_id=2,
                 original_max_position_embeddings=24,
                 rope_parameters=dict(_SHORT_LONG, rope_type="longrope", rope_theta=10000.0,
                                      partial_rotary_factor=0.75)),
    "olmo2": dict(TINY_COMMON, architectures=["Olmo2ForCausalLM"], model_type="olmo2", eos_token_id=2),
    "granite": dict(TINY_COMMON, architectures=["GraniteForCausalLM"], model_type="granite", embedding_multiplier=3.0,
                    residual_multiplier=0.5, attention_multiplier=0.2, logits_scaling=4.0),
    "smollm3": dict(TINY_COMMON, architectures=["SmolLM3ForCausalLM"], model_type="smollm3", no_rope_layers=[1, 0],
                    pad_token_id=0, bos_token_id=1, eos_token_id=2,
                    mlp_bias=True, attention_bias=True),
    # mixtures of experts (4 experts, top 2): Qwen3-MoE with a dense second layer (mlp_only_layers)
    # and renormalised weights, Mixtral with a window capping the context, OLMoE not renormalised
    "qwen3_moe": dict(TINY_COMMON, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", head_dim=16,
                      num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
                      mlp_only_layers=[1]),
    "mixtral": dict(TINY_COMMON, architectures=["MixtralForCausalLM"], model_type="mixtral", intermediate_size=32,
                    num_local_experts=4, num_experts_per_tok=2, sliding_window=64),
    "olmoe": dict(TINY_COMMON, architectures=["OlmoeForCausalLM"], model_type="olmoe", intermediate_size=32, eos_token_id=2,
                  num_experts=4, num_experts_per_tok=2),
}
MOE_FAMILIES = ("mixtral", "olmoe", "qwen3_moe")


def build_hf_model(kind: str, vocab_size: int = 256, seed: int = 0, **overrides: Any) -> torch.nn.Module:
    """A random-weight HF model of the given kind (TINY_CONFIGS or FAMILY_CONFIGS), float32, eval mode."""
    import transformers

    raw = dict({**TINY_CONFIGS, **FAMILY_CONFIGS}[kind], vocab_size=vocab_size, **overrides)
    raw.pop("architectures")
    model_type = raw.pop("model_type")
    config = transformers.AutoConfig.for_model(model_type, **raw)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # biases and norm weights start as 0 / 1: randomise them so they count
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0.0, 0.1)
            elif "norm" in name:
                param.uniform_(0.5, 1.5)
    return model.eval()


def save_tiny_model(path: Path, kind: str, vocab_size: int = 256, seed: int = 0, tokenizer_dir: Path | None = None,
                    set_weights: Callable[[torch.nn.Module], None] | None = None, **overrides: Any) -> torch.nn.Module:
    """Write a tiny HF model directory (config.json + model.safetensors [+ tokenizer files]);
    `set_weights` may change the random weights first."""
    model = build_hf_model(kind, vocab_size=vocab_size, seed=seed, **overrides)
    if set_weights is not None:
        with torch.no_grad():
            set_weights(model)
    model.save_pretrained(path, safe_serialization=True)
    if tokenizer_dir is not None:
        for f in Path(tokenizer_dir).iterdir():
            if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges", "chat_template")):
                (path / f.name).write_bytes(f.read_bytes())
        cfg = json.loads((path / "config.json").read_text())
        src = json.loads((Path(tokenizer_dir) / "config.json").read_text())
        cfg["eos_token_id"], cfg["bos_token_id"] = src.get("eos_token_id"), src.get("bos_token_id")
        (path / "config.json").write_text(json.dumps(cfg, indent=2))
    return model


# The scripted tiny model of tests/conftest.py's `scripted_model_dir` (`script_weights`): after the
# chat template's last token (its newline) greedy decoding writes exactly this, then EOS; under a
# mask that refuses the scripted token, FALLBACK_DIGIT comes next, then EOS.
REASONING_SCRIPT = ("Adding two numbers", "</think>", "The answer is 4")
FALLBACK_DIGIT = "7"


def script_weights(chain: list[int], eos_id: int, fallback: dict[int, float]) -> Callable[[torch.nn.Module], None]:
    """Weights for `save_tiny_model` that make a tiny llama a scripted one: greedy decoding goes
    from each token of `chain` to the next one (from its last to `eos_id`), and from any other
    token to `eos_id`; where a mask (a grammar) refuses that token, `fallback`'s tokens come next
    by their scores (then everything else, tied at 0). A token may occur in `chain` more than once
    only with the same successor.

    How: every layer's output projections are zero, so the last hidden state is the normed
    embedding of the current token alone. Each chain token embeds as its own unit vector, every
    other token as one shared "other" vector, and every token also carries a constant unit; the
    lm_head maps a chain token's vector to its successor (score 10), the "other" vector to EOS, and
    the constant unit to the fallback scores."""
    successors: dict[int, int] = {}
    for token, nxt in zip(chain, [*chain[1:], eos_id]):
        assert successors.setdefault(token, nxt) == nxt, f"token {token} has two successors in the script"

    def set_weights(model: torch.nn.Module) -> None:
        embed, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
        hidden = embed.shape[1]
        other, constant = hidden - 1, hidden - 2
        assert len(successors) <= constant, "the script has more distinct tokens than the hidden size allows"
        embed.zero_()
        head.zero_()
        embed[:, other] = 1.0
        embed[:, constant] = 1.0
        head[eos_id, other] = 10.0
        for slot, (token, nxt) in enumerate(successors.items()):
            embed[token, other] = 0.0
            embed[token, slot] = 1.0
            head[nxt, slot] = 10.0
        for token, score in fallback.items():
            head[token, constant] = score
        for name, param in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                param.zero_()  # the layers add nothing to the residual stream
            elif "norm" in name:
                param.fill_(1.0)

    return set_weights


def assert_engine_clean(engine: Any) -> None:
    """Every KV slot owned once; after flushing the cache the pools are full again."""
    engine.scheduler.check_integrity()
    assert engine.flush_cache()
    pool = engine.scheduler.kv_pool
    assert pool.num_free == pool.max_total_num_tokens, f"{pool.max_total_num_tokens - pool.num_free} KV slots leaked"
    assert engine.runner.req_to_token_pool.num_free == engine.runner.req_to_token_pool.max_reqs


def runner_extend(runner: Any, rows: list[int], prefix_lens: list[int], chunks: list[list[int]],
                  all_logits: bool = True) -> torch.Tensor:
    """One extend batch on a ModelRunner: slots allocated for `chunks` and recorded after each
    prefix; logits of every new token (or of each request's last one)."""
    from radixlm.runtime.model.forward_batch import ForwardBatch

    slots = runner.kv_pool.alloc(sum(len(c) for c in chunks))
    assert slots is not None
    offset = 0
    for row, start, chunk in zip(rows, prefix_lens, chunks):
        runner.req_to_token_pool.write(row, start, slots[offset : offset + len(chunk)])
        offset += len(chunk)
    logits_indices = torch.arange(offset) if all_logits else None
    return runner.forward(ForwardBatch.extend(rows, prefix_lens, chunks, slots, logits_indices))


def runner_decode(runner: Any, rows: list[int], seqs: list[list[int]], positions: list[int]) -> torch.Tensor:
    """One decode step on a ModelRunner: token `seqs[i][positions[i]]` of each request (the ones
    before it already in the pool), its slot allocated and recorded; the logits."""
    from radixlm.runtime.model.forward_batch import ForwardBatch

    slots = runner.kv_pool.alloc(len(rows))
    assert slots is not None
    for row, pos, slot in zip(rows, positions, slots):
        runner.req_to_token_pool.write(row, pos, slot.view(1))
    return runner.forward(ForwardBatch.decode(rows, [p + 1 for p in positions], [s[p] for s, p in zip(seqs, positions)], slots))


def process_alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, exited but not yet reaped, counts as gone)."""
    try:
        os.kill(pid, 0)
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        return False


def _children_by_parent() -> dict[int, list[int]]:
    """Every process's children, by its pid (from /proc; a process exiting while read is left out)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().split(")")[-1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    return children


def process_children(pid: int) -> list[int]:
    """The processes whose parent is `pid`."""
    return sorted(_children_by_parent().get(pid, []))


def process_tree(pid: int) -> list[int]:
    """`pid` and every process descended from it, parents first."""
    children = _children_by_parent()
    tree, i = [pid], 0
    while i < len(tree):
        tree += sorted(children.get(tree[i], []))
        i += 1
    return tree


def wait_until(condition: Callable[[], bool], what: str, limit_s: float = 120.0) -> None:
    """Poll until `condition()` holds: the test waits for the event itself; `limit_s` only turns a
    hang into a failure naming `what`, it bounds no speed."""
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.01)


def accepts_text(compiled: Any, tokenizer: Any, text: str) -> bool:
    """Whether a fresh state of a compiled grammar takes `text` (as the tokenizer encodes it), then EOS."""
    state = compiled.new_state()
    try:
        for token_id in tokenizer.encode(text):
            state.accept_token(token_id)
        state.accept_token(tokenizer.eos_token_id)
    except ValueError:
        return False
    return True


def first_regex_match(text: str, pattern: str) -> tuple[int, int] | None:
    """Where a regex stop (`stop_regex`) fires, by its definition: the first end of a match as the
    text grows character by character, then that match's earliest start; None if never."""
    for end in range(1, len(text) + 1):
        for start in range(end):
            if re.fullmatch(pattern, text[start:end]):
                return start, end
    return None


def stop_across_tokens(tokenizer: Any, ids: list[int], text: str) -> tuple[str, int]:
    """A 4-character stop string of `text` (the decoding of `ids`) that spans a token boundary (two
    characters before it, two after) and first occurs there, and where it starts."""
    from radixlm.runtime.detokenizer.detokenizer import REPLACEMENT_CHAR

    for k in range(len(ids) // 3, len(ids)):
        head = tokenizer.decode(ids[:k])
        start = len(head) - 2
        stop = text[start : start + 4]
        if (start >= 0 and text.startswith(head) and not head.endswith(REPLACEMENT_CHAR) and len(stop) == 4
                and stop.strip() and text.find(stop) == start):
            return stop, start
    raise AssertionError(f"no stop string spans a token boundary of {text!r}")
