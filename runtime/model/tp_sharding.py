"""How a model splits over tensor-parallel ranks (runtime/model/tensor_parallel.py has the ranks):
attention by KV group, the MLP by column, lm_head by vocabulary row where the vocabulary divides;
`ShardedWeights` is the HF state dict one rank sees (a checkpoint's fused qkv_proj / gate_up_proj,
Phi-3's, cut per part). A head count tp does not divide is refused (`check_tp_size`), never
padded; so is a model whose math spans every head (OLMo 2's q/k norm over the whole projection).
Norms on sublayer outputs (Gemma, OLMo 2) apply after the all-reduce (models/decoder_layer.py).
A mixture of experts (models/moe.py) splits each expert like the dense MLP (gate/up by row, down
by column, of `moe_intermediate_size`); every rank holds every expert's part and the whole router,
so each routes every token alike and the block's output is one more partial sum."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Mapping

import torch

from radixlm.kernels.quant import FORMATS, QuantizedTensor
from radixlm.runtime.model.model_config import ModelConfig

logger = logging.getLogger(__name__)


def check_tp_size(cfg: ModelConfig, tp_size: int) -> None:
    """ValueError unless `tp_size` ranks can split this model by KV group and MLP column."""
    if tp_size < 1:
        raise ValueError(f"tp_size must be >= 1, got {tp_size}")
    if tp_size == 1:
        return
    if cfg.qk_norm == "projection":
        raise ValueError(f"--tp-size {tp_size}: {cfg.architecture}'s q/k RMSNorm spans every head of the projection, "
                         "so a rank holding some of the heads cannot compute it; this model runs with --tp-size 1")
    problems = [f"{what} ({n})" for what, n in _split_sizes(cfg) if n % tp_size]
    if problems:
        raise ValueError(f"--tp-size {tp_size} does not divide this model's {' and '.join(problems)}: tensor "
                         f"parallelism splits attention by KV group and the MLP by column; tp sizes that fit "
                         f"this model: {', '.join(str(n) for n in valid_tp_sizes(cfg))}")


def valid_tp_sizes(cfg: ModelConfig) -> list[int]:
    if cfg.qk_norm == "projection":
        return [1]
    return [tp for tp in range(1, cfg.num_kv_heads + 1) if all(n % tp == 0 for _, n in _split_sizes(cfg))]


def _split_sizes(cfg: ModelConfig) -> tuple[tuple[str, int], ...]:
    """What tensor parallelism divides among the ranks, by name."""
    sizes = (("KV heads", cfg.num_kv_heads), ("query heads", cfg.num_heads),
             ("MLP intermediate size", cfg.intermediate_size))
    if cfg.moe is not None:
        sizes += (("experts' intermediate size", cfg.moe.moe_intermediate_size),)
    return sizes


def vocab_part(cfg: ModelConfig, tp_size: int) -> int | None:
    """Rows of lm_head each rank holds when the vocabulary divides by tp (None: lm_head replicated)."""
    return cfg.vocab_size // tp_size if tp_size > 1 and cfg.vocab_size % tp_size == 0 else None


def shard_config(cfg: ModelConfig, tp_size: int) -> ModelConfig:
    """The shape one rank's layers have: 1/tp of the heads and of the MLP width."""
    check_tp_size(cfg, tp_size)
    moe = cfg.moe and dataclasses.replace(cfg.moe, moe_intermediate_size=cfg.moe.moe_intermediate_size // tp_size)
    return dataclasses.replace(cfg, num_heads=cfg.num_heads // tp_size, num_kv_heads=cfg.num_kv_heads // tp_size,
                               intermediate_size=cfg.intermediate_size // tp_size, moe=moe)


Weight = torch.Tensor | QuantizedTensor


def row_slice(w: Weight, start: int, stop: int) -> Weight:
    return w.rows(slice(start, stop)) if isinstance(w, QuantizedTensor) else w[start:stop]


def column_slice(w: Weight, start: int, stop: int) -> Weight:
    """Columns [start, stop) of a [out, in] weight; a block-quantized one keeps its blocks where the
    cut falls between them, else it is dequantized (logged)."""
    if not isinstance(w, QuantizedTensor):
        return w[:, start:stop]
    per_block, block_k = FORMATS[w.fmt]  # GGUF bytes of a block of block_k columns (256 for a K-quant)
    if start % block_k == 0 and stop % block_k == 0:
        return QuantizedTensor(w.fmt, w.raw[:, start // block_k * per_block: stop // block_k * per_block], stop - start)
    logger.info("tensor parallel: a cut at column %d is inside a %s block; that weight is dequantized", start, w.fmt)
    return w.dequantize()[:, start:stop]


def _cat(parts: list[Weight]) -> Weight:
    if all(isinstance(p, QuantizedTensor) for p in parts):
        return QuantizedTensor.cat(parts)  # type: ignore[arg-type]
    return torch.cat([p.dequantize() if isinstance(p, QuantizedTensor) else p for p in parts])


class ShardedWeights(Mapping[str, Weight]):
    """An HF-named state dict seen by one rank: each tensor sliced to that rank's part (see the
    module docstring), read from `full` on access."""

    def __init__(self, full: Mapping[str, Weight], cfg: ModelConfig, rank: int, size: int):
        self.full, self.cfg, self.rank, self.size = full, cfg, rank, size
        # lm_head split by vocabulary row (a tied one is the embedding's rows; the embedding itself
        # stays whole on every rank, as every rank looks tokens up)
        self.vocab_part = vocab_part(cfg, size)

    def __getitem__(self, name: str) -> Weight:
        if name == "lm_head.weight" and self.vocab_part is not None:
            head = self.full["model.embed_tokens.weight" if self.cfg.tie_word_embeddings else name]
            return row_slice(head, self.rank * self.vocab_part, (self.rank + 1) * self.vocab_part)
        w = self.full[name]
        cfg, r, n = self.cfg, self.rank, self.size
        q_part, kv_part = cfg.num_heads // n * cfg.head_dim, cfg.num_kv_heads // n * cfg.head_dim
        mlp_part = cfg.intermediate_size // n
        leaf = name.rsplit(".", 2)[-2:]  # e.g. ["q_proj", "weight"]
        if ".experts." in name and cfg.moe is not None:
            return self._expert_part(name, leaf, w)
        if leaf[0] in ("qkv_proj", "gate_up_proj"):  # fused in the checkpoint (Phi-3): each part's rows
            sizes = ([cfg.num_heads * cfg.head_dim] + [cfg.num_kv_heads * cfg.head_dim] * 2 if leaf[0] == "qkv_proj"
                     else [cfg.intermediate_size] * 2)
            return _cat([row_slice(w, start + r * size // n, start + (r + 1) * size // n)
                         for start, size in zip([sum(sizes[:i]) for i in range(len(sizes))], sizes)])
        if leaf[0] == "q_proj":
            return row_slice(w, r * q_part, (r + 1) * q_part)
        if leaf[0] in ("k_proj", "v_proj"):
            return row_slice(w, r * kv_part, (r + 1) * kv_part)
        if leaf[0] in ("gate_proj", "up_proj"):
            return row_slice(w, r * mlp_part, (r + 1) * mlp_part)
        if leaf == ["o_proj", "weight"]:
            return column_slice(w, r * q_part, (r + 1) * q_part)
        if leaf == ["down_proj", "weight"]:
            return column_slice(w, r * mlp_part, (r + 1) * mlp_part)
        if leaf in (["o_proj", "bias"], ["down_proj", "bias"]) and r != 0:
            assert isinstance(w, torch.Tensor)
            return torch.zeros_like(w)  # added once, by rank 0
        return w  # embedding, norms, lm_head: replicated

    def _expert_part(self, name: str, leaf: list[str], w: Weight) -> Weight:
        """One expert's tensor (checkpoint names, models/moe.py ExpertNames): gate and up by row,
        down by column, of the rank's part of the expert's width."""
        assert self.cfg.moe is not None
        names, r = self.cfg.moe.names, self.rank
        part = self.cfg.moe.moe_intermediate_size // self.size
        if leaf[0] in (names.gate, names.up) and leaf[1] == "weight":
            return row_slice(w, r * part, (r + 1) * part)
        if leaf == [names.down, "weight"]:
            return column_slice(w, r * part, (r + 1) * part)
        raise ValueError(f"tensor parallel: cannot split the expert tensor {name!r} (per-expert checkpoint "
                         "names only)")

    def __iter__(self) -> Iterator[str]:
        yield from self.full
        if self._adds_lm_head:
            yield "lm_head.weight"

    def __len__(self) -> int:
        return len(self.full) + self._adds_lm_head

    def __contains__(self, name: object) -> bool:
        return name in self.full or (name == "lm_head.weight" and self._adds_lm_head)

    @property
    def _adds_lm_head(self) -> bool:
        """A tied checkpoint has no lm_head of its own; split, each rank's is its embedding rows."""
        return self.vocab_part is not None and "lm_head.weight" not in self.full
