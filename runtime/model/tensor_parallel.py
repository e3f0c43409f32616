"""Tensor parallelism (`--tp-size N`) over torch.distributed: gloo on CPU, NCCL on CUDA.

Layout (Megatron's, as SGLang and vLLM shard a Llama):
- Attention is split by KV group: rank r holds KV heads [r*kv/N, (r+1)*kv/N) and the query heads
  that read them, i.e. its rows of q/k/v_proj (and their biases), its columns of o_proj, and 1/N of
  every layer's KV pool (the pool's slots are the same on every rank; each holds its heads).
- The MLP is split by intermediate column: rows of gate/up_proj, columns of down_proj.
- o_proj and down_proj give partial sums: one all-reduce after each (rank 0 adds the residual and
  o_proj's bias, so the sum counts them once). The residual stream is then the same on every rank.
- The embedding and the norms are replicated. lm_head is split by vocabulary row where the
  vocabulary divides by N (a tied one: the embedding's rows), and rank 0 gathers the logits; else
  it is replicated and rank 0 alone projects. Rank 0 alone samples.
- The scheduler runs on rank 0. Each forward, rank 0 broadcasts the ForwardBatch and the
  request->token rows written since the last one (`ReqToTokenPool.write_log`); ranks 1..N-1
  (worker processes, `python -m radixlm.runtime.model.tensor_parallel`) apply them and run the
  same forward.
- The all-reduce is the process group's (gloo / NCCL), or on CPU, where every rank is a process of
  this machine, a shared-memory one (shm_all_reduce.py) for sums that fit its slots (measured
  ~10x faster than gloo here; docs/scaling-out.md).

How the weights split is tp_sharding.py's; this module has the ranks: the group, rank 0's handle
on the other ranks (`TPWorkers`), and their loop (`run_worker`).
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist

from radixlm.runtime.model.kernel_policy import load_cpu_kernels
from radixlm.runtime.model.model_config import ModelConfig
from radixlm.runtime.model.shm_all_reduce import ShmAllReduce

if TYPE_CHECKING:
    from radixlm.runtime.model.forward_batch import ForwardBatch
    from radixlm.runtime.model.model_runner import RunnerConfig

logger = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 600.0  # a worker that has not loaded its shard by then is reported as failed
# Ranks wait for rank 0's next step for as long as the server is idle: no op timeout to speak of.
OP_TIMEOUT = datetime.timedelta(days=365)
# How long rank 0 waits for every rank to take a step it sends. gloo sends only once the receiver
# has posted its receive, which a live rank does right after the previous step (ms, seconds under
# load); past this the rank is stopped or gone, and the server fails its requests instead of
# hanging should gloo miss the closed socket of a dead rank.
STEP_SEND_TIMEOUT = datetime.timedelta(seconds=60)


class TPGroup:
    """One rank's view of the tensor-parallel group: a gloo (CPU) or NCCL (CUDA) process group
    built directly on a TCPStore (no global torch.distributed state, so an Engine and a test can
    each have their own), plus the shared-memory all-reduce on CPU."""

    def __init__(self, rank: int, size: int, store: dist.TCPStore, device: str, shm: ShmAllReduce | None,
                 peers: list[int]):
        """`peers`: processes whose death ends a wait for their sums (rank 0: the workers; a worker:
        rank 0)."""
        self.rank, self.size, self.store, self.device = rank, size, store, device
        opts = dist.ProcessGroupGloo._Options()
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
        opts._timeout = OP_TIMEOUT
        # gloo carries the steps' pickled batches (host memory) on every device, and the sums on CPU
        self.cpu_pg: Any = dist.ProcessGroupGloo(dist.PrefixStore("gloo", store), rank, size, opts)
        self.pg: Any = self.cpu_pg
        if device != "cpu":  # reasoned about only: no GPU here (see docs/architecture.md)
            self.pg = dist.ProcessGroupNCCL(dist.PrefixStore("nccl", store), rank, size)
        self.shm = shm
        # the C++ side of the shared-memory sum (float32; DecodeStack calls it between layers)
        ext = load_cpu_kernels() if shm is not None else None
        self.native_shm = shm.native(ext, peers) if shm is not None and ext is not None else None
        self.num_all_reduces = 0  # through this object (DecodeStack's own are counted by shm.seq)

    def all_reduce(self, t: torch.Tensor) -> None:
        """Sum `t` over the ranks, in place."""
        self.num_all_reduces += 1
        if self.shm is not None and self.shm.fits(t):
            self._shm_all_reduce(t)
            return
        self.pg.allreduce([t]).wait()

    def _shm_all_reduce(self, t: torch.Tensor) -> None:
        assert self.shm is not None
        if self.native_shm is not None and t.dtype == torch.float32:
            self.native_shm.all_reduce(t)
        else:
            self.shm.all_reduce(t)

    def gather_columns(self, t: torch.Tensor) -> torch.Tensor:
        """Rank 0: every rank's `t` `[rows, cols]` side by side, `[rows, size * cols]`; the others:
        an empty tensor."""
        if self.shm is not None and self.shm.fits(t):
            parts = self.shm.gather(t)
        else:
            parts = [torch.empty_like(t) for _ in range(self.size)] if self.rank == 0 else []
            opts = dist.GatherOptions()
            opts.rootRank = 0
            self.pg.gather([parts] if self.rank == 0 else [], [t.contiguous()], opts).wait()
        return torch.cat(parts, dim=1) if self.rank == 0 else t.new_empty(0)  # type: ignore[arg-type]

    def time_all_reduce(self, t: torch.Tensor, shm: bool, times: int) -> float:
        """Microseconds per all-reduce of `t` through shared memory or the process group (median of
        `times`; every rank must call it alike: bench/tensor_parallel.py)."""
        samples = []
        for _ in range(times):
            start = time.perf_counter()
            if shm:
                self._shm_all_reduce(t)
            else:
                self.pg.allreduce([t]).wait()
            samples.append(time.perf_counter() - start)
        return sorted(samples)[len(samples) // 2] * 1e6

    def _broadcast(self, t: torch.Tensor) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        if self.rank == 0:
            opts.timeout = STEP_SEND_TIMEOUT
        self.cpu_pg.broadcast([t], opts).wait()

    def broadcast_object(self, obj: object = None) -> Any:
        """Rank 0's `obj` (pickled) on every rank."""
        if self.rank == 0:
            payload = torch.frombuffer(bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)), dtype=torch.uint8)
            size = torch.tensor([payload.numel()], dtype=torch.int64)
        else:
            size = torch.zeros(1, dtype=torch.int64)
        self._broadcast(size)
        if self.rank != 0:
            payload = torch.empty(int(size.item()), dtype=torch.uint8)
        self._broadcast(payload)
        return obj if self.rank == 0 else pickle.loads(payload.numpy().tobytes())

    def close(self) -> None:
        for pg in {id(self.pg): self.pg, id(self.cpu_pg): self.cpu_pg}.values():
            try:
                pg.shutdown()
            except Exception:  # the other side may be gone already
                pass


class TPWorkers:
    """Rank 0's handle on ranks 1..N-1: starts them, sends each step, stops them."""

    def __init__(self, model_dir: Path, runner_cfg: RunnerConfig, size: int, shm_bytes: int):
        self.size = size
        self.store = dist.TCPStore("127.0.0.1", 0, size, True, timeout=datetime.timedelta(seconds=STARTUP_TIMEOUT_S),
                                   wait_for_workers=False)
        port = self.store.port
        # named by the store's port: unique on this machine while the group lives
        self.shm_path = Path(f"/dev/shm/radixlm-tp-{port}") if runner_cfg.device == "cpu" and shm_bytes else None
        shm = None
        if self.shm_path is not None:
            try:
                shm = ShmAllReduce(self.shm_path, 0, size, shm_bytes, create=True)
            except (OSError, RuntimeError) as e:  # e.g. a small /dev/shm: gloo does it all
                logger.warning("tensor parallel: no shared-memory all-reduce (%s); gloo carries every sum", e)
                self.shm_path.unlink(missing_ok=True)
                self.shm_path = None
        spec = pickle.dumps({"model_dir": str(model_dir), "runner_cfg": runner_cfg, "size": size, "port": port,
                             "shm_path": None if self.shm_path is None else str(self.shm_path),
                             "shm_bytes": shm_bytes, "threads": torch.get_num_threads()})
        self.procs: list[subprocess.Popen[bytes]] = []
        for rank in range(1, size):
            proc = subprocess.Popen([sys.executable, "-m", "radixlm.runtime.model.tensor_parallel", str(rank)],
                                    stdin=subprocess.PIPE)
            assert proc.stdin is not None
            proc.stdin.write(spec)
            proc.stdin.close()
            self.procs.append(proc)
        self._wait_for("joined")
        self.group = TPGroup(0, size, self.store, runner_cfg.device, shm, [p.pid for p in self.procs])
        if shm is not None:
            shm.check_peers = self.check_alive
        self.closed = False

    def failure(self, error: Exception) -> RuntimeError:
        """What to raise when a collective failed on rank 0: the rank that died, if one did (given
        a moment to be reaped: its sockets close as it exits), else the error."""
        for proc in self.procs:
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
        try:
            self.check_alive()
        except RuntimeError as dead:
            return dead
        return RuntimeError(f"tensor-parallel collective failed: {error}")

    def check_alive(self) -> None:
        """RuntimeError if a worker has exited (its sums would never come)."""
        for rank, proc in enumerate(self.procs, start=1):
            if proc.poll() is not None:
                raise RuntimeError(f"tensor-parallel rank {rank} exited with code {proc.returncode}")

    def _wait_for(self, what: str) -> None:
        """Until every worker has set its `what` key; a worker's error key or exit raises."""
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        for rank, proc in enumerate(self.procs, start=1):
            while not self.store.check([f"{what}/{rank}"]):
                if self.store.check([f"error/{rank}"]):
                    raise RuntimeError(f"tensor-parallel rank {rank} failed: {self.store.get(f'error/{rank}').decode()}")
                if proc.poll() is not None:
                    raise RuntimeError(f"tensor-parallel rank {rank} exited with code {proc.returncode} before it "
                                       f"was {what}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"tensor-parallel rank {rank} not {what} after {STARTUP_TIMEOUT_S:.0f} s")
                time.sleep(0.05)  # polling a child's start-up, not ordering events between tests

    def wait_ready(self) -> None:
        self._wait_for("ready")

    def send_step(self, batch: ForwardBatch, writes: list[tuple[int, int, torch.Tensor]]) -> None:
        self.group.broadcast_object(("step", *encode_step(batch, writes)))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if all(p.poll() is None for p in self.procs):
            try:
                self.group.broadcast_object(("stop",))
            except Exception:
                pass
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.group.close()
        if self.shm_path is not None:
            self.shm_path.unlink(missing_ok=True)


def encode_step(batch: ForwardBatch, writes: list[tuple[int, int, torch.Tensor]]) -> tuple[dict[str, Any], list[Any]]:
    """A step as plain data whose tensors are numpy arrays: pickled 13x faster than torch tensors
    (45 against 580 us for a 32-request decode batch, both ways)."""
    fields = {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)}
    return ({k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in fields.items()},
            [(row, start, slots.numpy()) for row, start, slots in writes])


def decode_step(fields: dict[str, Any], writes: list[Any]) -> tuple[ForwardBatch, list[tuple[int, int, torch.Tensor]]]:
    from radixlm.runtime.model.forward_batch import ForwardBatch

    batch = ForwardBatch(**{k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in fields.items()})
    return batch, [(row, start, torch.from_numpy(slots)) for row, start, slots in writes]


def run_worker(rank: int, spec: dict[str, Any]) -> None:
    """Rank `rank` (1..N-1): join the group, load this rank's shard, then run every forward rank 0
    broadcasts until it says stop (or the group breaks: rank 0 is gone)."""
    from radixlm.runtime.model.model_runner import ModelRunner, weights_of

    size, port = spec["size"], spec["port"]
    store = dist.TCPStore("127.0.0.1", port, size, False, timeout=datetime.timedelta(seconds=STARTUP_TIMEOUT_S))
    try:
        torch.set_num_threads(spec["threads"])
        runner_cfg: RunnerConfig = spec["runner_cfg"]
        if runner_cfg.device.startswith("cuda"):  # one GPU per rank (not run here: no GPU)
            runner_cfg = dataclasses.replace(runner_cfg, device=f"cuda:{rank}")
        shm = None if spec["shm_path"] is None else \
            ShmAllReduce(Path(spec["shm_path"]), rank, size, spec["shm_bytes"], create=False)
        store.set(f"joined/{rank}", "1")
        group = TPGroup(rank, size, store, runner_cfg.device, shm, [os.getppid()])
        model_dir = Path(spec["model_dir"])
        runner = ModelRunner(ModelConfig.from_dir(model_dir), runner_cfg, weights_of(model_dir, runner_cfg.quantization),
                             tp=group)
    except Exception as e:
        store.set(f"error/{rank}", f"{type(e).__name__}: {e}")
        raise
    store.set(f"ready/{rank}", "1")
    while True:
        msg = group.broadcast_object()
        if msg[0] == "stop":
            break
        if msg[0] == "time_all_reduce":  # bench/tensor_parallel.py
            _, rows, hidden, dtype, shm, times = msg
            group.time_all_reduce(torch.ones(rows, hidden, dtype=dtype), shm, times)
            continue
        batch, writes = decode_step(*msg[1:])
        for row, start, slots in writes:
            runner.req_to_token_pool.write(row, start, slots)
        runner.forward(batch)
    group.close()


def main() -> None:
    from radixlm.runtime.ipc.sockets import exit_with_parent

    exit_with_parent()  # rank 0's process gone: so is this one
    rank = int(sys.argv[1])
    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s tp-rank-{rank} %(levelname)s %(message)s")
    spec = pickle.loads(sys.stdin.buffer.read())
    try:
        run_worker(rank, spec)
    except Exception:
        logger.exception("tensor-parallel rank %d stopped", rank)
        sys.exit(1)


if __name__ == "__main__":
    main()
