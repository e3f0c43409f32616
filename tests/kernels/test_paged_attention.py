"""The C++ paged attention kernel (kernels/csrc/kernels/paged_attention.cpp) against the plain
torch reference (kernels/reference.py), at every ISA level this CPU runs (the `ext` fixture):
decode, extend and mixed batches over scattered pool slots, float32 and bfloat16 pools, every
supported head size, GQA; its long-extend kernels over a bfloat16 pool (the vector one in
float32 FMAs at every level, with vdpbf16ps where the level and CPU have AVX512-BF16:
csrc/kernels/flash_attention.cpp; AMX tiles where the CPU has them: csrc/kernels/amx_attention.cpp;
the paths a level cannot run are skipped, with the reason); and the attention backend's choice
of path (the kernel for batches; torch's SDPA for one long uncached prompt unless a long-extend
path runs). The paged kernel with its dispatch (tests/kernels/csrc/test_paged_attention.cpp) and the
long-extend vector kernels (tests/kernels/csrc/test_attention.cpp) also run without torch in C++
drivers, natively per x86 level and for aarch64 under qemu."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from levels import LEVELS, level_params, long_extend_path_runs
from test_vec_layer import (  # the C++ drivers' build and run
    ARM_LEVELS,
    NATIVE_BUILDS,
    REPO,
    _arm_case,
    _native_case,
)

from radixlm.kernels import cpu_linear
from radixlm.kernels.reference import extend_attention_ref
from radixlm.runtime.mem_cache.mem_pool import KVPool, ReqToTokenPool
from radixlm.runtime.model.attention.torch_backend import DENSE_PREFILL_MIN_LEN, TorchAttentionBackend
from radixlm.runtime.model.forward_batch import ForwardBatch


def scattered_batch(prefix_lens: list[int], extend_lens: list[int], heads: int, kv_heads: int, dim: int,
                    dtype: torch.dtype, seed: int = 0,
                    shared_len: int = 40) -> tuple[KVPool, ReqToTokenPool, ForwardBatch, torch.Tensor]:
    """A pool whose requests own shuffled slots (the first request's first `shared_len` shared by
    all requests with a prefix that long, as the radix cache shares them); returns the batch and q."""
    gen = torch.Generator().manual_seed(seed)
    total = sum(p + e for p, e in zip(prefix_lens, extend_lens))
    pool = KVPool(total + 16, 1, kv_heads, dim, dtype)
    pool.k_buffer[0].copy_(torch.randn(pool.k_buffer[0].shape, generator=gen).to(dtype))
    pool.v_buffer[0].copy_(torch.randn(pool.v_buffer[0].shape, generator=gen).to(dtype))
    reqs = ReqToTokenPool(len(prefix_lens) + 2, max(p + e for p, e in zip(prefix_lens, extend_lens)) + 1)
    slots = pool.alloc(total)
    slots = slots[torch.randperm(total, generator=gen)]
    shared = slots[:shared_len]
    rows, new_slots = [], []
    for prefix, new in zip(prefix_lens, extend_lens):
        row = reqs.alloc()
        own, slots = slots[: prefix + new], slots[prefix + new :]
        if prefix >= shared_len:
            own = torch.cat([shared, own[shared_len:]])
        reqs.write(row, 0, own)
        rows.append(row)
        new_slots.append(own[prefix:])
    out_loc = torch.cat(new_slots)
    if all(e == 1 for e in extend_lens):
        batch = ForwardBatch.decode(rows, [p + 1 for p in prefix_lens], [0] * len(rows), out_loc)
    else:
        batch = ForwardBatch.extend(rows, prefix_lens, [[0] * e for e in extend_lens], out_loc)
    q = torch.randn(batch.num_tokens, heads, dim, generator=gen).to(dtype)
    return pool, reqs, batch, q


CASES = {
    "decode 1": ([0], [1]),
    "decode 7": ([5, 17, 33, 100, 1, 0, 64], [1] * 7),
    "decode 17": ([3 * i + 1 for i in range(17)], [1] * 17),
    "decode 64 sharing a prefix": ([40 + i for i in range(64)], [1] * 64),
    "prefill": ([0], [300]),
    "extend over a prefix": ([0, 45, 200], [1, 20, 37]),
    "mixed lengths": ([3, 0, 40, 7, 90], [1, 2, 16, 33, 70]),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(9, 3, 64), (4, 4, 16), (8, 2, 80), (2, 1, 128)])
def test_paged_attention_matches_reference(ext: Any, case: str, dtype: torch.dtype, heads: int, kv_heads: int,
                                           dim: int) -> None:
    _check_paged_attention(ext, case, dtype, heads, kv_heads, dim)


@pytest.mark.parametrize("case", ["decode 7", "extend over a prefix", "mixed lengths"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(2, 2, 32), (6, 2, 96), (3, 1, 256)])
def test_paged_attention_of_the_other_head_sizes(ext: Any, case: str, dtype: torch.dtype, heads: int, kv_heads: int,
                                                 dim: int) -> None:
    """A row's D/16 accumulator vectors are folded in passes that fit the level's registers
    (one pass of 16 on AVX-512; on AVX2 96 in one pass of 6, 256 in four of 4)."""
    _check_paged_attention(ext, case, dtype, heads, kv_heads, dim)


def _check_paged_attention(ext: Any, case: str, dtype: torch.dtype, heads: int, kv_heads: int, dim: int) -> None:
    pool, reqs, batch, q = scattered_batch(*CASES[case], heads, kv_heads, dim, dtype)
    args = (pool.k_buffer[0], pool.v_buffer[0], reqs.req_to_token, batch.req_pool_indices, batch.seq_lens)
    got = cpu_linear.paged_attention(ext, q, *args, batch.extend_lens, batch.extend_start_loc, dim**-0.5)
    want = extend_attention_ref(q.float(), args[0].float(), args[1].float(), *args[2:], batch.extend_lens, dim**-0.5)
    assert got.dtype == dtype
    # float32: the reference's own rounding; bfloat16: the output's rounding (inputs are exact)
    tolerance = 1e-5 if dtype == torch.float32 else 1.6e-2
    assert (got.float() - want).abs().max().item() < tolerance


def test_bad_shapes_are_refused(ext: Any) -> None:
    pool, reqs, batch, q = scattered_batch([4], [1], 4, 2, 24, torch.float32)
    with pytest.raises(RuntimeError, match="head_dim 24 is not supported"):
        ext.paged_attention(q, pool.k_buffer[0], pool.v_buffer[0], reqs.req_to_token, batch.req_pool_indices,
                            batch.seq_lens, batch.extend_lens, batch.extend_start_loc, 1.0)
    pool, reqs, batch, q = scattered_batch([4], [1], 4, 2, 16, torch.float32)
    with pytest.raises(RuntimeError, match="out of range"):
        ext.paged_attention(q, pool.k_buffer[0], pool.v_buffer[0], reqs.req_to_token, batch.req_pool_indices,
                            batch.seq_lens + 1000, batch.extend_lens, batch.extend_start_loc, 1.0)


@pytest.mark.parametrize(("prefix_lens", "extend_lens", "paged"), [
    ([0], [DENSE_PREFILL_MIN_LEN], False),  # a long extend: torch's SDPA
    ([40], [DENSE_PREFILL_MIN_LEN], False),
    ([0, 7], [3, DENSE_PREFILL_MIN_LEN], False),
    ([0], [DENSE_PREFILL_MIN_LEN - 1], True),
    ([0, 0, 45], [30, 3, 90], True),  # a batch of short extends
    ([50, 60, 70], [1, 1, 1], True),  # decode
])
def test_backend_picks_its_path_and_both_agree(ext: Any, prefix_lens: list[int], extend_lens: list[int],
                                               paged: bool) -> None:
    pool, reqs, batch, q = scattered_batch(prefix_lens, extend_lens, 4, 2, 32, torch.float32)
    k = pool.k_buffer[0][batch.out_cache_loc].clone()
    v = pool.v_buffer[0][batch.out_cache_loc].clone()
    fast = TorchAttentionBackend(pool, reqs, 32**-0.5, ext)
    plain = TorchAttentionBackend(pool, reqs, 32**-0.5)
    outs = []
    for backend in (fast, plain):
        backend.init_forward_metadata(batch)
        outs.append(backend.forward(q, k, v, 0, batch))
    assert fast.num_paged_forwards == int(paged) and plain.num_paged_forwards == 0
    assert torch.allclose(outs[0], outs[1], atol=1e-5)


def amx_runs(ext: Any) -> bool:
    """AMX tiles at this level (the avx512 build on a CPU with AMX-BF16)."""
    return bool(ext.cpu_features()["amx_bf16"])


def dpbf16_runs(ext: Any) -> bool:
    """vdpbf16ps at this level (the avx512 build on a CPU with AVX512-BF16)."""
    return bool(ext.cpu_features()["avx512_bf16"])


def test_long_extend_dispatch_follows_the_cpu(ext: Any) -> None:
    for dim in (16, 32, 64, 80, 128, 256):
        assert cpu_linear.amx_attention_supported(ext, dim) == (amx_runs(ext) and dim in (64, 128, 256))
        assert cpu_linear.flash_attention_supported(ext, dim) == (dim in (64, 128))  # vdpbf16ps or FMAs


@pytest.fixture(autouse=True)
def _timed_long_extend_math(request: pytest.FixtureRequest) -> Any:
    """Each test of the module starts and ends with the vector kernel's math decided by timing
    (tests set it); the C++ drivers' tests, which take no `ext`, are not run once per level."""
    if "ext" not in request.fixturenames:
        yield
        return
    ext = request.getfixturevalue("ext")
    ext.set_long_extend_math(-1)
    yield
    ext.set_long_extend_math(-1)


def test_long_extend_math_is_timed_once_and_can_be_set(ext: Any) -> None:
    """Without AVX512-BF16 the vector kernel always runs in FMAs (vdpbf16ps cannot be asked for);
    with it, the first use times both maths and keeps the faster one; a set math holds."""
    measured = ext.long_extend_uses_fma()
    if not dpbf16_runs(ext):
        assert measured
        with pytest.raises(RuntimeError, match="lacks AVX512-BF16"):
            ext.set_long_extend_math(0)
    else:
        assert ext.long_extend_uses_fma() == measured  # decided once
        ext.set_long_extend_math(0)
        assert not ext.long_extend_uses_fma()
    ext.set_long_extend_math(1)
    assert ext.long_extend_uses_fma()
    with pytest.raises(RuntimeError, match="unknown long-extend math"):
        ext.set_long_extend_math(2)


def _reference(q: torch.Tensor, batch: ForwardBatch, args: tuple, dim: int) -> torch.Tensor:
    return extend_attention_ref(q.float(), args[0].float(), args[1].float(), *args[2:], batch.extend_lens, dim**-0.5)


def _set_math(ext: Any, path: str) -> None:
    """For the vector kernel ("dpbf16": vdpbf16ps, "fma": float32 FMAs) its math; paged_attention
    then takes amx= / flash=."""
    if path in ("dpbf16", "fma"):
        ext.set_long_extend_math(int(path == "fma"))


# the (path, heads, kv_heads, head_dim) the long-extend kernels serve: AMX 64, 128 and 256, the
# vector kernel 64 and 128 (cpu_linear.amx_attention_supported / flash_attention_supported)
LONG_SHAPES = [(9, 3, 64), (2, 1, 128), (2, 2, 256), (4, 4, 64)]
LONG_PATH_SHAPES = [(path, *shape) for path in ("amx", "dpbf16", "fma") for shape in LONG_SHAPES
                    if path == "amx" or shape[2] in (64, 128)]


LONG_CASES = {name: CASES[name] for name in ("prefill", "extend over a prefix", "mixed lengths")}
LONG_CASES["long prompts beside decodes"] = ([0, 7, 0, 33], [700, 1, 129, 16])
LONG_CASES["short extends over a long prefix"] = ([976, 976, 980], [20, 17, 21])


@pytest.mark.parametrize(("ext", "path", "heads", "kv_heads", "dim"),
                         level_params(LONG_PATH_SHAPES, long_extend_path_runs), indirect=["ext"])
@pytest.mark.parametrize("case", sorted(LONG_CASES))
@pytest.mark.parametrize("q_dtype", [torch.float32, torch.bfloat16])
def test_long_extend_paths_match_reference(ext: Any, path: str, case: str, q_dtype: torch.dtype, heads: int,
                                           kv_heads: int, dim: int) -> None:
    """The AMX kernel and the vector one, with vdpbf16ps or FMAs (rows = (token, query head of the
    group): 20 tokens x 3 heads fill 4 units, the last one partly) against the float32 reference."""
    _set_math(ext, path)
    pool, reqs, batch, q = scattered_batch(*LONG_CASES[case], heads, kv_heads, dim, torch.bfloat16)
    q = q.to(q_dtype)
    args = (pool.k_buffer[0], pool.v_buffer[0], reqs.req_to_token, batch.req_pool_indices, batch.seq_lens)
    got = cpu_linear.paged_attention(ext, q, *args, batch.extend_lens, batch.extend_start_loc, dim**-0.5,
                                     amx=path == "amx", flash=path != "amx")
    assert got.dtype == q_dtype
    # q, K, V and the softmax weights enter the products as bfloat16
    assert (got.float() - _reference(q, batch, args, dim)).abs().max().item() < 1.6e-2


@pytest.mark.parametrize("case", sorted(LONG_CASES))
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(9, 3, 64), (2, 1, 128), (4, 4, 64)])
def test_long_extends_over_a_float32_pool_run_in_fmas_within_float32_rounding(ext: Any, case: str, heads: int,
                                                                             kv_heads: int, dim: int) -> None:
    """Over a float32 pool the vector kernel always runs in FMAs (whatever the math set for bf16
    pools): nothing is rounded to bf16, so it matches the float32 reference as closely as the
    per-row kernel does."""
    ext.set_long_extend_math(0 if dpbf16_runs(ext) else 1)  # a bf16 pool's math must not matter here
    pool, reqs, batch, q = scattered_batch(*LONG_CASES[case], heads, kv_heads, dim, torch.float32)
    args = (pool.k_buffer[0], pool.v_buffer[0], reqs.req_to_token, batch.req_pool_indices, batch.seq_lens)
    got = cpu_linear.paged_attention(ext, q, *args, batch.extend_lens, batch.extend_start_loc, dim**-0.5, flash=True)
    assert got.dtype == torch.float32
    assert (got - _reference(q, batch, args, dim)).abs().max().item() < 1e-5


CASCADE_CASES = {  # (prefix lengths, extend lengths, shared slots, whether the cascade runs)
    "decodes sharing 976 tokens": ([976 + 3 * i for i in range(32)], [1] * 32, 976, True),
    "extends and decodes sharing 500": ([500, 507, 520, 600], [20, 1, 33, 17], 500, True),
    "shared at the cascade's minimum": ([64, 64, 70], [1, 5, 1], 64, True),
    "shared but too short a part": ([80, 200, 210], [1, 1, 1], 80, False),
    "one token short of it": ([63, 70, 80], [1, 1, 2], 63, False),
    "one request": ([300], [1], 300, False),
}


# (the vector kernel's math, q's dtype): over a float32 pool the math is FMAs and q float32
CASCADE_MATHS = [("dpbf16", torch.float32), ("dpbf16", torch.bfloat16), ("fma", torch.float32), ("fma", torch.bfloat16),
                 ("fma-float32-pool", torch.float32)]


@pytest.mark.parametrize(("ext", "math", "q_dtype"), level_params(
    CASCADE_MATHS, lambda module, math: long_extend_path_runs(module, math.partition("-")[0])), indirect=["ext"])
@pytest.mark.parametrize("case", sorted(CASCADE_CASES))
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(9, 3, 64), (2, 1, 128)])
def test_flash_cascade_over_a_shared_prefix_matches_reference(ext: Any, math: str, case: str, q_dtype: torch.dtype,
                                                            heads: int, kv_heads: int, dim: int) -> None:
    """With flash, a batch whose requests share 64+ leading slots, 4x their other keys, attends in
    two passes (every row over the shared keys, packed once; each request over its own keys)
    whose softmaxes are merged; otherwise (fewer shared slots, a shorter share, one request) the
    per-request paths run. Each equals the float32 reference within bf16 rounding."""
    f32_pool = math == "fma-float32-pool"
    _set_math(ext, "fma" if f32_pool else math)
    prefix_lens, extend_lens, shared, cascade = CASCADE_CASES[case]
    pool, reqs, batch, q = scattered_batch(prefix_lens, extend_lens, heads, kv_heads, dim,
                                           torch.float32 if f32_pool else torch.bfloat16, shared_len=shared)
    q = q.to(q_dtype)
    args = (pool.k_buffer[0], pool.v_buffer[0], reqs.req_to_token, batch.req_pool_indices, batch.seq_lens)
    before = ext.num_cascade_calls()
    got = cpu_linear.paged_attention(ext, q, *args, batch.extend_lens, batch.extend_start_loc, dim**-0.5, flash=True)
    assert ext.num_cascade_calls() - before == int(cascade)
    assert got.dtype == q_dtype
    assert (got.float() - _reference(q, batch, args, dim)).abs().max().item() < (1e-5 if f32_pool else 1.6e-2)


@pytest.mark.parametrize("ext", LEVELS, indirect=True)
@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.bfloat16])
def test_one_requests_verify_rows_never_cascade_and_equal_its_decodes(ext: Any, pool_dtype: torch.dtype) -> None:
    """A speculative verify step: one request as five decode entries, one position apart (its
    decode row and four drafts), all on the same req_to_token row: 300+ shared slots, but one
    request, so no cascade, and each entry's output equals, to the bit, that entry run as a batch
    of its own (the one-row decode it stands for); the same when the five are one entry of five
    new tokens, as DecodeStack sends them (one work unit: rows folded side by side). A second
    request sharing the prefix makes the same entries cascade: the rule counts distinct requests."""
    pool, reqs, batch, _ = scattered_batch([300, 310], [1, 1], 9, 3, 64, pool_dtype, shared_len=300)
    row0, row1 = (int(r) for r in batch.req_pool_indices)
    reqs.req_to_token[row0, 301:305] = reqs.req_to_token[row1, 300:304]  # four more slots of the first request
    k, v = pool.k_buffer[0], pool.v_buffer[0]
    q5 = torch.randn(5, 9, 64, generator=torch.Generator().manual_seed(3))

    def attend(rows: list[int], lens: list[int], q_rows: torch.Tensor) -> torch.Tensor:
        n = len(rows)
        return cpu_linear.paged_attention(ext, q_rows, k, v, reqs.req_to_token, torch.tensor(rows), torch.tensor(lens),
                                          torch.ones(n, dtype=torch.int64), torch.arange(n), 0.125, flash=True)

    lens = [301 + j for j in range(5)]
    before = ext.num_cascade_calls()
    verify = attend([row0] * 5, lens, q5)
    assert ext.num_cascade_calls() == before
    one_entry = cpu_linear.paged_attention(ext, q5, k, v, reqs.req_to_token, torch.tensor([row0]), torch.tensor([305]),
                                           torch.tensor([5]), torch.tensor([0]), 0.125, flash=True)
    for j in range(5):
        alone = attend([row0], [lens[j]], q5[j: j + 1])[0]
        assert torch.equal(verify[j], alone)
        assert torch.equal(one_entry[j], alone)
    attend([row0] * 5 + [row1], [*lens, 311], torch.cat([q5, q5[:1]]))
    assert ext.num_cascade_calls() == before + 1


@pytest.mark.parametrize(("ext", "path"), level_params([("amx",), ("dpbf16",), ("fma",)], long_extend_path_runs),
                         indirect=["ext"])
def test_long_extend_paths_are_as_close_as_torch_bf16_sdpa(ext: Any, path: str) -> None:
    """W5's shape (one 2,000-token prompt, the default model's heads): each long-extend path's
    largest error against float32 is no larger than torch's own bfloat16 SDPA's on the same inputs."""
    _set_math(ext, path)
    pool, reqs, batch, q = scattered_batch([0], [2000], 9, 3, 64, torch.bfloat16)
    args = (pool.k_buffer[0], pool.v_buffer[0], reqs.req_to_token, batch.req_pool_indices, batch.seq_lens)
    want = _reference(q, batch, args, 64)
    got = cpu_linear.paged_attention(ext, q, *args, batch.extend_lens, batch.extend_start_loc, 64**-0.5,
                                     amx=path == "amx", flash=path != "amx")
    k_ctx, v_ctx = (buf[reqs.req_to_token[batch.req_pool_indices[0], :2000].long()].transpose(0, 1)[None]
                    for buf in args[:2])
    torch_bf16 = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k_ctx, v_ctx, is_causal=True,
                                                scale=64**-0.5, enable_gqa=True)[0].transpose(0, 1)
    ours, theirs = ((x.float() - want).abs().max().item() for x in (got, torch_bf16))
    assert ours <= theirs, (ours, theirs)


def test_backend_sends_long_prompts_to_a_long_extend_path(ext: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Over a bf16 pool with AMX or AVX512-BF16 every batch runs the paged kernel (long extends on
    tiles or vdpbf16ps); RADIXLM_BF16_PATH=emulated, or a CPU with neither, keeps torch's SDPA
    for them."""
    pool, reqs, batch, q = scattered_batch([0], [DENSE_PREFILL_MIN_LEN], 9, 3, 64, torch.bfloat16)
    k = pool.k_buffer[0][batch.out_cache_loc].clone()
    v = pool.v_buffer[0][batch.out_cache_loc].clone()
    plain = TorchAttentionBackend(pool, reqs, 64**-0.5)
    plain.init_forward_metadata(batch)
    want = plain.forward(q, k, v, 0, batch).float()
    monkeypatch.setenv("RADIXLM_BF16_PATH", "emulated")
    vector = TorchAttentionBackend(pool, reqs, 64**-0.5, ext)
    monkeypatch.delenv("RADIXLM_BF16_PATH")
    fast = TorchAttentionBackend(pool, reqs, 64**-0.5, ext)
    assert not vector.amx and not vector.flash
    assert fast.amx == amx_runs(ext) and fast.flash == (dpbf16_runs(ext) and not amx_runs(ext))
    for backend in (vector, fast):
        backend.init_forward_metadata(batch)
        got = backend.forward(q, k, v, 0, batch).float()
        assert backend.num_paged_forwards == int(backend.amx or backend.flash)
        assert (got - want).abs().max().item() < 1.6e-2


def test_backend_sends_long_prompts_over_a_float32_pool_to_the_fma_kernel(ext: Any) -> None:
    """A float32 pool (head_dim 64): every batch runs the paged kernel, a long prompt in the vector
    kernel's FMAs, within float32 rounding of torch's SDPA on the gathered context."""
    pool, reqs, batch, q = scattered_batch([0], [DENSE_PREFILL_MIN_LEN], 9, 3, 64, torch.float32)
    k = pool.k_buffer[0][batch.out_cache_loc].clone()
    v = pool.v_buffer[0][batch.out_cache_loc].clone()
    plain = TorchAttentionBackend(pool, reqs, 64**-0.5)
    fast = TorchAttentionBackend(pool, reqs, 64**-0.5, ext)
    assert fast.flash and not fast.amx
    outs = []
    for backend in (plain, fast):
        backend.init_forward_metadata(batch)
        outs.append(backend.forward(q, k, v, 0, batch))
    assert fast.num_paged_forwards == 1 and plain.num_paged_forwards == 0
    assert (outs[0] - outs[1]).abs().max().item() < 1e-5


# the driver links the long-extend kernels alone: kernels/parallel.h on OpenMP
DRIVER = ["-DRADIXLM_NO_TORCH", "-fopenmp", str(REPO / "kernels" / "csrc" / "kernels" / "flash_attention.cpp")]


@pytest.mark.parametrize("level", NATIVE_BUILDS)
def test_long_extend_driver_native(level: str, tmp_path: Path) -> None:
    """Every math of the level (FMAs; vdpbf16ps in the avx512 build where the CPU has AVX512-BF16),
    extends and cascades, against float64, and the same bits on 1-3 threads."""
    _native_case(level, "test_attention.cpp", rf"attention {level}: \d+ checks passed", tmp_path, DRIVER)


@pytest.mark.parametrize("test_id", ["generic", "neon"])
def test_long_extend_driver_aarch64(test_id: str, tmp_path: Path) -> None:
    _arm_case(test_id, "test_attention.cpp", rf"attention {ARM_LEVELS[test_id][0]}: \d+ checks passed", tmp_path, DRIVER)


# the paged kernel's driver links it with the long-extend kernels it hands requests to
PAGED_DRIVER = ["-DRADIXLM_NO_TORCH", "-fopenmp",
                *(str(REPO / "kernels" / "csrc" / "kernels" / name)
                  for name in ("paged_attention.cpp", "flash_attention.cpp", "amx_attention.cpp"))]


@pytest.mark.parametrize("level", NATIVE_BUILDS)
def test_paged_driver_native(level: str, tmp_path: Path) -> None:
    """Decodes, extends and mixed batches, shared prefixes with and without the cascade, GQA 1/3/4,
    head dims 64/128/80/256, float32 and bf16 q and pools, against float64; 1-3 threads the same bits."""
    _native_case(level, "test_paged_attention.cpp", rf"paged_attention {level}: \d+ checks passed", tmp_path,
                 PAGED_DRIVER)


@pytest.mark.parametrize("test_id", ["generic", "neon"])
def test_paged_driver_aarch64(test_id: str, tmp_path: Path) -> None:
    closing = rf"paged_attention {ARM_LEVELS[test_id][0]}: \d+ checks passed"
    _arm_case(test_id, "test_paged_attention.cpp", closing, tmp_path, PAGED_DRIVER)
