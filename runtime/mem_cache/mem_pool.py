"""Memory pools: request rows -> token slots (ReqToTokenPool) and token slots -> K/V (KVPool).

Ownership: a token slot is, at any moment, exactly one of
  - free (in the KVPool free list),
  - held by the radix cache (a cached prefix), or
  - held by a running request (its not-yet-cached tokens).
Slot 0 is reserved as a padding slot: it is never handed out, so padded index tensors can point
at it harmlessly. `KVPool.max_total_num_tokens` (SGLang's name; the resolved `--max-total-tokens`)
counts the usable slots (1..max_total_num_tokens).
"""

from __future__ import annotations

import torch


class ReqToTokenPool:
    """Rows of token slot indices, one row per running request.

    `req_to_token[row, pos]` is the KV slot of position `pos` of the request holding `row`.
    """

    def __init__(self, max_reqs: int, max_context_len: int, device: str | torch.device = "cpu"):
        if max_reqs <= 0 or max_context_len <= 0:
            raise ValueError("ReqToTokenPool needs max_reqs > 0 and max_context_len > 0")
        self.max_reqs = max_reqs
        self.max_context_len = max_context_len
        self.req_to_token = torch.zeros((max_reqs, max_context_len), dtype=torch.int32, device=device)
        self._free_rows: list[int] = list(range(max_reqs - 1, -1, -1))
        # tensor parallel's rank 0 logs every write here, for the other ranks' copies of the table
        self.write_log: list[tuple[int, int, torch.Tensor]] | None = None

    @property
    def num_free(self) -> int:
        return len(self._free_rows)

    def alloc(self) -> int | None:
        """One free row, or None when all rows are taken."""
        return self._free_rows.pop() if self._free_rows else None

    def free(self, row: int) -> None:
        if not 0 <= row < self.max_reqs or row in self._free_rows:
            raise ValueError(f"ReqToTokenPool.free: row {row} is not allocated")
        self._free_rows.append(row)

    def write(self, row: int, start: int, slots: torch.Tensor) -> None:
        """Record `slots` as the KV slots of positions start .. start+len(slots)-1 of `row`."""
        self.req_to_token[row, start : start + slots.numel()] = slots.to(torch.int32)
        if self.write_log is not None:
            self.write_log.append((row, start, slots.to(torch.int32, copy=True)))


class KVPool:
    """Per-layer K and V buffers indexed by token slot, with a free-list allocator.

    Buffers: `k_buffer[layer]` is `[max_total_num_tokens + 1, num_kv_heads, head_dim]` (slot 0 is padding).
    Freed slots are handed out again before fresh ones are (a stack), which keeps recently
    touched memory warm.
    """

    def __init__(
        self,
        max_total_num_tokens: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: str | torch.device = "cpu",
    ):
        if max_total_num_tokens <= 0:
            raise ValueError(f"KVPool max_total_num_tokens must be positive, got {max_total_num_tokens}")
        self.max_total_num_tokens = max_total_num_tokens
        self.num_layers = num_layers
        self.dtype = dtype
        self.device = torch.device(device)
        shape = (max_total_num_tokens + 1, num_kv_heads, head_dim)
        self.k_buffer = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v_buffer = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self._free_slots = torch.arange(max_total_num_tokens, 0, -1, dtype=torch.int64)  # a stack: pop from the end
        self._num_free = max_total_num_tokens

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * torch.finfo(dtype).bits // 8

    @property
    def num_free(self) -> int:
        return self._num_free

    def alloc(self, num_tokens: int) -> torch.Tensor | None:
        """`num_tokens` free slots (int64, CPU), or None when not enough are free (nothing taken)."""
        if num_tokens < 0:
            raise ValueError(f"KVPool.alloc: negative count {num_tokens}")
        if num_tokens > self._num_free:
            return None
        start = self._num_free - num_tokens
        slots = self._free_slots[start : self._num_free].flip(0).clone()
        self._num_free = start
        return slots

    def free(self, slots: torch.Tensor) -> None:
        """Return slots to the free list. The caller guarantees it owned them."""
        n = slots.numel()
        if n == 0:
            return
        if self._num_free + n > self.max_total_num_tokens:
            raise RuntimeError("KVPool.free: more slots freed than were allocated")
        self._free_slots[self._num_free : self._num_free + n] = slots.flatten().flip(0).to(torch.int64)
        self._num_free += n

    def set_kv(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write K/V `[n, num_kv_heads, head_dim]` of n tokens into their slots of one layer."""
        self.k_buffer[layer].index_copy_(0, slots, k.to(self.dtype))
        self.v_buffer[layer].index_copy_(0, slots, v.to(self.dtype))
