"""A sum over the tensor-parallel ranks of one machine through shared memory (runtime/model/
tensor_parallel.py uses it on CPU for sums that fit its slots; gloo carries the rest)."""

from __future__ import annotations

import ctypes
import os
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from radixlm.kernels import cpu_linear

_SYS_FUTEX = {"x86_64": 202, "aarch64": 98}.get(platform.machine())
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
_libc = ctypes.CDLL(None, use_errno=True)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_WAIT_LIMIT = _Timespec(0, 2_000_000)  # a futex wait re-checks after 2 ms (a lost wake cannot hang a rank)


class ShmAllReduce:
    """A sum over the ranks of one machine through shared memory: each rank copies its tensor into
    its slot of a /dev/shm file, sets its flag to the call's sequence number and wakes the others
    (futex), waits until every rank's flag has moved past the previous call's, and sums the slots
    in rank order (so every rank gets bit-identical results).

    Slots alternate between two halves by sequence parity: a rank may write call s+1's data while
    another still reads call s's, and it reaches call s+2 only after all have finished s (they set
    flag s+1 after reading s). So while a rank waits for call s, another's flag is s-1 (not there
    yet), s or s+1: "arrived" is "not s-1", which holds across the int32 flag's wrap-around.
    The wait spins briefly (the ranks of a forward arrive close together), then sleeps in the
    kernel (futex) until woken, as the ranks may share cores with the server's other processes;
    without futex (another OS) it yields instead. x86's store order makes the data visible before
    the flag stored after it."""

    FLAG_BYTES = 64  # a cache line per rank's flag, so ranks never write the same line
    SPINS = 200

    def __init__(self, path: Path, rank: int, size: int, max_bytes: int, create: bool):
        self.rank, self.size, self.max_bytes = rank, size, max_bytes
        self.path = path
        total = self.FLAG_BYTES * size + 2 * size * max_bytes
        if create:
            with open(path, "wb") as f:
                f.truncate(total)
        self.buf = torch.from_file(str(path), shared=True, size=total, dtype=torch.uint8)
        self.flags = self.buf[: self.FLAG_BYTES * size].view(torch.int32).view(size, self.FLAG_BYTES // 4)[:, 0]
        self.flag_addr = [self.flags[r].data_ptr() for r in range(size)]
        self.data = self.buf[self.FLAG_BYTES * size:]
        self.waits = 0  # futex sleeps
        # rank 0 checks its workers are alive while it waits (a dead rank never sets its flag)
        self.check_peers: Callable[[], None] | None = None

    @property
    def seq(self) -> int:
        """This rank's last call's number: its calls on both sides (Python and C++), mod 2^31."""
        return int(self.flags[self.rank])

    def native(self, ext: cpu_linear.Extension, peers: list[int]) -> Any:
        """The C++ side of this all-reduce (kernels/csrc/shm_all_reduce.h: the same calls, ~10x
        less overhead), watching `peers`' processes while it waits."""
        return ext.ShmAllReduce(self.buf, self.rank, self.size, self.max_bytes, peers)

    def slot(self, half: int, rank: int, nbytes: int) -> torch.Tensor:
        start = (half * self.size + rank) * self.max_bytes
        return self.data[start: start + nbytes]

    def fits(self, t: torch.Tensor) -> bool:
        return t.numel() * t.element_size() <= self.max_bytes and t.is_contiguous() and t.device.type == "cpu"

    def all_reduce(self, t: torch.Tensor) -> None:
        parts = self._exchange(t)
        if t.dtype == torch.float32:
            torch.add(parts[0], parts[1], out=t)
            for p in parts[2:]:
                t.add_(p)
        else:  # sum in float32, round once
            acc = parts[0].float()
            for p in parts[1:]:
                acc.add_(p.float())
            t.copy_(acc)

    def gather(self, t: torch.Tensor) -> list[torch.Tensor] | None:
        """Every rank's `t`, in rank order, on rank 0 (copies); None on the others."""
        parts = self._exchange(t)
        return [p.clone() for p in parts] if self.rank == 0 else None

    def _exchange(self, t: torch.Tensor) -> list[torch.Tensor]:
        """Post `t`, wait for every rank's, and view them all (valid until the call after next)."""
        prev = self.seq
        seq = (prev + 1) & 0x7FFFFFFF
        half, nbytes = seq % 2, t.numel() * t.element_size()
        self.slot(half, self.rank, nbytes).view(t.dtype).view(t.shape).copy_(t)
        self.flags[self.rank] = seq
        if _SYS_FUTEX is not None:
            _libc.syscall(_SYS_FUTEX, ctypes.c_void_p(self.flag_addr[self.rank]), _FUTEX_WAKE, 0x7FFFFFFF, None, None, 0)
        self._wait_for_all(prev)
        return [self.slot(half, r, nbytes).view(t.dtype).view(t.shape) for r in range(self.size)]

    def _wait_for_all(self, prev: int) -> None:
        for rank in range(self.size):
            spins = 0
            while int(self.flags[rank]) == prev:
                spins += 1
                if spins < self.SPINS:
                    continue
                if _SYS_FUTEX is None:
                    os.sched_yield()
                    continue
                self.waits += 1  # sleeps while the flag still reads `prev`
                if self.check_peers is not None and spins % 64 == 0:
                    self.check_peers()
                _libc.syscall(_SYS_FUTEX, ctypes.c_void_p(self.flag_addr[rank]), _FUTEX_WAIT, prev,
                              ctypes.byref(_WAIT_LIMIT), None, 0)
