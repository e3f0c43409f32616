"""Weights in 2 MB pages. A decode step streams every weight once; with 4 KB pages each product
crosses a page (and a TLB miss) every 4 KB, and the hardware prefetchers stop at each boundary.
Transparent huge pages are opt-in on most Linux systems (`/sys/kernel/mm/transparent_hugepage/
enabled` = `madvise`), so a weight asks for them: it lives in its own private anonymous mapping,
advised `MADV_HUGEPAGE` before its first touch. Where the OS cannot (not Linux, THP off) the
tensor is an ordinary one; the layout and the values are the same either way.
"""

from __future__ import annotations

import mmap

import torch

HUGE_PAGE = 2 << 20


def _advisable() -> bool:
    return hasattr(mmap, "MADV_HUGEPAGE") and hasattr(mmap, "MAP_PRIVATE") and hasattr(mmap, "MAP_ANONYMOUS")


def empty(shape: tuple[int, ...] | torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialized contiguous CPU tensor, in huge pages when it spans at least one and the OS
    lets us ask."""
    numel = 1
    for d in shape:
        numel *= d
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    if nbytes < HUGE_PAGE or not _advisable():
        return torch.empty(tuple(shape), dtype=dtype)
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        buf.madvise(mmap.MADV_HUGEPAGE)
    except OSError:  # THP compiled out: 4 KB pages, same tensor
        pass
    return torch.frombuffer(buf, dtype=dtype, count=numel).view(tuple(shape))


def copy(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of CPU tensor `t` in huge pages (`empty`)."""
    out = empty(t.shape, t.dtype)
    out.copy_(t)
    return out
