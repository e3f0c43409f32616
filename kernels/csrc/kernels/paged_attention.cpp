// paged_attention: causal attention of a batch's new tokens over their requests' whole context,
// reading K/V in place from the KV pool through req_to_token (no per-layer gather, no padding to
// a rectangle, no mask tensor). One kernel for decode, extend and mixed batches, written over the
// vector layer (simd/vec.h) for every ISA level.
//
// Layout. q [T, Hq, D] float32; k_buf / v_buf [slots, Hkv, D] float32 or bfloat16; req_to_token
// int32 [rows, context]; rows, seq_lens, extend_lens, extend_start int64 [B]. New token i of
// request b is q row extend_start[b] + i at position seq_lens[b] - extend_lens[b] + i, and attends
// positions [0, that position] of its request. Output [T, Hq, D] float32.
//
// Work unit: (request, block of up to kTokens new tokens): its query rows of each kv head share
// every key they read, and each key is read from the pool once for all kv heads. Keys stream in
// blocks of 16 (one vector of scores per query row): the block's K is widened to float32 and
// transposed to [D][16] once, scores are D FMAs per row, and a flash-style online softmax
// (running max and sum per row, float32) folds the block's V into the row's accumulator, so no
// score matrix is ever materialized.
//
// Over a bf16 pool, requests with 16+ new tokens go to the AMX or vector extend kernels
// (amx_attention.h) where the caller allows them; with the vector kernel, a batch sharing a long
// prefix (kCascadeMinShared) goes whole to the cascade kernel instead.
//
// Torch-free (paged_attention.h); the torch entry point is bindings/torch_attention.cpp.
#include "kernels/paged_attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/amx_attention.h"
#include "kernels/check.h"
#include "kernels/parallel.h"
#include "simd/math.h"

namespace radixlm {
namespace {

using namespace simd;

std::atomic<int64_t> num_cascade_calls_{0};  // calls that took the cascade kernel (for tests)

constexpr int64_t kKeys = 16;    // keys per block: one vector of scores
constexpr int64_t kTokens = 32;  // new tokens per work unit

// The register tiles of each level, in vectors (a Vf is one of 32 zmm on AVX-512, two of 16 ymm
// on AVX2, four of 32 NEON q registers, four of 16 xmm in the generic build): the score pass keeps
// kRows score vectors, a key vector and a broadcast live; the value pass kValueVecs accumulators,
// a value vector and a broadcast. AVX-512's 8 rows would spill on AVX2 (16 + 3 ymm) and pad a
// decode's GQA group of 3 or 4 rows to 8; AVX2 and generic were timed with 2, 4, 6 and 8 rows
// (4 the best for decodes, within a few % of the best for extends), their value passes with 2 to
// 16 vectors (no difference beyond noise). NEON takes AVX2's (the same 8 Vf of registers; untimed).
#if defined(RADIXLM_SIMD_AVX512)
constexpr int kRows = 8, kValueVecs = 16;
#elif defined(RADIXLM_SIMD_AVX2) || defined(RADIXLM_SIMD_NEON)
constexpr int kRows = 4, kValueVecs = 6;
#else
constexpr int kRows = 4, kValueVecs = 2;
#endif

// The largest divisor of nv that is at most cap: a row's D / 16 accumulators in equal passes.
constexpr int value_pass(int nv, int cap) {
  for (int c = cap < nv ? cap : nv; c > 1; --c) {
    if (nv % c == 0) return c;
  }
  return 1;
}

struct Unit {
  int64_t b, first;  // request, first new token (of the request's) in this unit
  int64_t g0 = 0, g1 = 0;  // its kv heads [g0, g1) (run_units sets them)
};

// 16 floats of a pool row (float32, or bfloat16 widened exactly).
template <typename T>
inline Vf load_row16(const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    return vload(p);
  } else {
    return vload_bf16(p);
  }
}

// kt[d][j] = K[j][d] for the W = Hkv * D floats of the block's n keys (zero rows past n).
template <typename T>
void transpose_keys(const T* const* krow, int64_t n, int64_t W, float* kt) {
  for (int64_t c = 0; c < W; c += 16) {  // a 16 x 16 tile at a time
    Vf tile[kKeys];
    for (int64_t j = 0; j < kKeys; ++j) tile[j] = j < n ? load_row16(krow[j] + c) : vzero();
    transpose16(tile);
    for (int64_t i = 0; i < 16; ++i) vstore(kt + (c + i) * kKeys, tile[i]);
  }
}

// s[i] lane j = q row i . key j for kRows rows of qs (D apart) and the block's K^T [D][16].
template <int64_t D>
inline void block_scores(const float* kt, const float* q0, Vf* s) {
  for (int i = 0; i < kRows; ++i) s[i] = vzero();
  for (int64_t d = 0; d < D; ++d) {
    const Vf kv = vload(kt + d * kKeys);
    for (int i = 0; i < kRows; ++i) s[i] = vfmadd(vset1(q0[i * D + d]), kv, s[i]);
  }
}

// f(std::integral_constant<int, R>) for R = min(rows, N), rows >= 1.
template <int N, typename F>
inline void dispatch_fold(int rows, F&& f) {
  if constexpr (N > 1) {
    if (rows < N) return dispatch_fold<N - 1>(rows, f);
  }
  f(std::integral_constant<int, N>{});
}

// Rows whose value folds run side by side (fold_values): on AVX-512, 4 rows x 4 vectors of
// accumulators are 16 independent FMA chains (one row's 4 chains of `visible` dependent FMAs wait
// on the FMA latency); the narrower levels' registers hold one row's.
#if defined(RADIXLM_SIMD_AVX512)
constexpr int kFoldRows = 4;
#else
constexpr int kFoldRows = 1;
#endif

// For each of R rows i (acc rows D apart, pw rows kKeys apart): acc_i[0, 16 NV) = acc_i *
// alpha[i] + sum over j < visible of pw_i[j] * vb[j] (vb rows 16 NV apart), each row's FMAs in
// key order, as that row alone: its bits do not depend on R.
template <int NV, int R>
inline void fold_values(float* acc, const float* alpha, const float* pw, int64_t visible, const float* vb) {
  constexpr int64_t D = NV * 16;
  constexpr int C = value_pass(NV, kValueVecs / R > 0 ? kValueVecs / R : 1);
  for (int v0 = 0; v0 < NV; v0 += C) {
    Vf a[R][C];
    for (int i = 0; i < R; ++i) {
      const Vf va = vset1(alpha[i]);
      for (int v = 0; v < C; ++v) a[i][v] = vmul(vload(acc + i * D + (v0 + v) * 16), va);
    }
    // a loop of broadcasts from pw: unrolled (visible <= 16), gcc reads the weights back from the
    // register pw was stored from, a permute per key, and branches 16 ways
#pragma GCC unroll 1
    for (int64_t j = 0; j < visible; ++j) {
      Vf w[C];
      for (int v = 0; v < C; ++v) w[v] = vload(vb + j * D + (v0 + v) * 16);
      for (int i = 0; i < R; ++i) {
        const Vf pj = vset1(pw[i * kKeys + j]);
        for (int v = 0; v < C; ++v) a[i][v] = vfmadd(pj, w[v], a[i][v]);
      }
    }
    for (int i = 0; i < R; ++i) {
      for (int v = 0; v < C; ++v) vstore(acc + i * D + (v0 + v) * 16, a[i][v]);
    }
  }
}

// The online softmax of a group of kRows rows (r0.., those below M) over one key block of n keys
// from k0: each row's running max m and sum l move, and the block's values vb are folded into its
// accumulator acc [D]. Row r (position prefix_len + r / group) sees the keys up to its position.
// The rows' maxima are taken first and their rescale factors in one vector exp, so the rows'
// horizontal reductions overlap instead of chaining through a scalar exp each; then runs of up
// to kFoldRows consecutive rows seeing the same keys fold their values together.
template <int NV>
inline void fold_rows(const Vf* s, int64_t r0, int64_t M, int64_t group, int64_t prefix_len, int64_t k0, int64_t n,
                      float* m, float* l, float* acc, const float* vb) {
  constexpr int64_t D = NV * 16;
  const Vf neg_inf = vset1(-std::numeric_limits<float>::infinity());
  alignas(64) float m_old[16] = {}, m_new[16] = {}, alpha[16], pw[kRows * kKeys];
  int64_t visible[kRows];
  Vf sv[kRows];
  for (int i = 0; i < kRows; ++i) {
    const int64_t r = r0 + i, pos = prefix_len + r / group;
    visible[i] = r < M && k0 <= pos ? std::min(n, pos - k0 + 1) : 0;  // 0: past M, or the block is in its future
    if (visible[i] == 0) continue;
    sv[i] = vselect(vtail(visible[i]), s[i], neg_inf);
    m_old[i] = m[r];
    m_new[i] = std::max(m[r], vreduce_max(sv[i]));
  }
  // a row's first block: m = -inf, alpha e^-103 (exp16's floor), scaling an l and acc of 0
  vstore(alpha, exp16(vsub(vload(m_old), vload(m_new))));
  for (int i = 0; i < kRows; ++i) {
    if (visible[i] == 0) continue;
    const int64_t r = r0 + i;
    const Vf p = vmaskz(vtail(visible[i]), exp16(vsub(sv[i], vset1(m_new[i]))));
    l[r] = l[r] * alpha[i] + vreduce_add(p);
    m[r] = m_new[i];
    vstore(pw + i * kKeys, p);
  }
  for (int i = 0; i < kRows;) {
    if (visible[i] == 0) {
      ++i;
      continue;
    }
    int run = 1;
    while (run < kFoldRows && i + run < kRows && visible[i + run] == visible[i]) ++run;
    dispatch_fold<kFoldRows>(run, [&](auto rows_c) {
      fold_values<NV, decltype(rows_c)::value>(acc + (r0 + i) * D, alpha + i, pw + i * kKeys, visible[i], vb);
    });
    i += run;
  }
}

// Hints the K and V rows (W elements each) of the next block's `count` slots into L1: a
// request's slots are scattered over the pool, where the hardware prefetcher cannot follow them.
template <typename T>
inline void prefetch_rows(const T* k_buf, const T* v_buf, const int32_t* slots, int64_t count, int64_t stride,
                          int64_t W) {
  const int64_t bytes = W * static_cast<int64_t>(sizeof(T));
  for (int64_t j = 0; j < count; ++j) {
    const char* k = reinterpret_cast<const char*>(k_buf + slots[j] * stride);
    const char* v = reinterpret_cast<const char*>(v_buf + slots[j] * stride);
    for (int64_t b = 0; b < bytes; b += 64) {
      prefetch_l1(k + b);
      prefetch_l1(v + b);
    }
  }
}

// One work unit: the query heads of kv heads [g0, g1) (of Hkv) of up to kTokens new tokens of one
// request. Each key block is read from the pool once for those kv heads (a slot's K for all heads
// is one contiguous row, `stride` = Hkv * D long). A row's operations do not depend on which
// other heads or tokens share its unit.
template <int NV, typename T>
void attend_unit(const float* q, int64_t Hq, int64_t Hkv_all, int64_t g0, int64_t g1, const T* k_pool,
                 const T* v_pool, const int32_t* slots, int64_t prefix_len, int64_t num_tokens, int64_t q_row0,
                 float scale, float* out, std::vector<float>& scratch) {
  constexpr int64_t D = NV * 16;
  const int64_t group = Hq / Hkv_all, stride = Hkv_all * D, Hkv = g1 - g0;
  const T* k_buf = k_pool + g0 * D;  // slot s's heads [g0, g1): s * stride on
  const T* v_buf = v_pool + g0 * D;
  const int64_t M = num_tokens * group, Mp = (M + kRows - 1) / kRows * kRows, W = Hkv * D;
  // scratch (g: the unit's kv heads): kt [Hkv][D][16], vb [Hkv][16][D], row [W], qs [Hkv][Mp][D], acc [Hkv][M][D],
  // m, l [Hkv][M]
  scratch.resize(2 * W * kKeys + W + Hkv * (Mp * D + M * D + 2 * M) + 16);
  float* kt = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(scratch.data()) + 63) & ~uintptr_t{63});
  float* vb = kt + W * kKeys;
  float* row = vb + W * kKeys;
  float* qs = row + W;
  float* acc = qs + Hkv * Mp * D;
  float* m = acc + Hkv * M * D;
  float* l = m + Hkv * M;
  // rows of kv head g: r = t * group + h (token t, query head g * group + h), in position order
  for (int64_t g = 0; g < Hkv; ++g) {
    for (int64_t t = 0; t < num_tokens; ++t) {
      for (int64_t h = 0; h < group; ++h) {
        const float* src = q + ((q_row0 + t) * Hq + (g0 + g) * group + h) * D;
        float* dst = qs + (g * Mp + t * group + h) * D;
        for (int64_t d = 0; d < D; ++d) dst[d] = src[d] * scale;
      }
    }
    std::fill(qs + (g * Mp + M) * D, qs + (g + 1) * Mp * D, 0.0f);
  }
  std::fill(acc, acc + Hkv * M * D, 0.0f);
  std::fill(m, m + Hkv * M, -std::numeric_limits<float>::infinity());
  std::fill(l, l + Hkv * M, 0.0f);
  const int64_t last_pos = prefix_len + num_tokens - 1;  // the unit's last query position
  for (int64_t k0 = 0; k0 <= last_pos; k0 += kKeys) {
    const int64_t n = std::min(kKeys, last_pos + 1 - k0);
    prefetch_rows(k_buf, v_buf, slots + k0 + kKeys, std::min(kKeys, last_pos + 1 - k0 - kKeys), stride, W);
    const T* krow[kKeys];
    for (int64_t j = 0; j < n; ++j) {
      const int64_t slot = slots[k0 + j];
      krow[j] = k_buf + slot * stride;
      to_float(v_buf + slot * stride, W, row);
      for (int64_t g = 0; g < Hkv; ++g) std::memcpy(vb + (g * kKeys + j) * D, row + g * D, D * sizeof(float));
    }
    for (int64_t j = n; j < kKeys; ++j) {
      for (int64_t g = 0; g < Hkv; ++g) std::fill(vb + (g * kKeys + j) * D, vb + (g * kKeys + j + 1) * D, 0.0f);
    }
    transpose_keys(krow, n, W, kt);
    // rows whose position is before k0 see nothing of this block; rows are in position order
    const int64_t first_row = std::max<int64_t>(0, (k0 - prefix_len) * group);
    for (int64_t g = 0; g < Hkv; ++g) {
      for (int64_t r0 = first_row / kRows * kRows; r0 < M; r0 += kRows) {
        Vf s[kRows];
        block_scores<D>(kt + g * D * kKeys, qs + (g * Mp + r0) * D, s);
        fold_rows<NV>(s, r0, M, group, prefix_len, k0, n, m + g * M, l + g * M, acc + g * M * D, vb + g * kKeys * D);
      }
    }
  }
  for (int64_t g = 0; g < Hkv; ++g) {
    for (int64_t t = 0; t < num_tokens; ++t) {
      for (int64_t h = 0; h < group; ++h) {
        const int64_t r = t * group + h;
        const float inv = 1.0f / l[g * M + r];  // >= 1: the row's own position is always visible
        const float* src = acc + (g * M + r) * D;
        float* dst = out + ((q_row0 + t) * Hq + (g0 + g) * group + h) * D;
        for (int64_t d = 0; d < D; ++d) dst[d] = src[d] * inv;
      }
    }
  }
}

template <int NV>
void run_units(const std::vector<Unit>& units, const float* q, float* out, int64_t Hq, const KvBuffers& kv,
               const AttentionBatch& batch, float scale) {
  const bool bf16 = kv.dtype == DType::kBFloat16;
  const int64_t Hkv = kv.num_kv_heads;
  // Fewer units than twice the threads (a decode or a verify step of one or two requests): each
  // unit becomes one per kv head, so the threads share its heads (alone, one thread took it all).
  const int threads = num_threads();
  const bool by_head = threads > 1 && Hkv > 1 && static_cast<int64_t>(units.size()) < 2 * threads;
  std::vector<Unit> work;
  for (const Unit& u : units) {
    for (int64_t g = 0; g < (by_head ? Hkv : 1); ++g) work.push_back(Unit{u.b, u.first, by_head ? g : 0, by_head ? g + 1 : Hkv});
  }
  const int64_t n = static_cast<int64_t>(work.size());
  // Units are interleaved from both ends (0, n-1, 1, n-2, ...) so that the contiguous ranges
  // parallel_for hands each thread mix cheap early tokens with expensive late ones (causal).
  parallel_for(0, n, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> scratch;
    for (int64_t i = lo; i < hi; ++i) {
      const Unit& u = work[i % 2 == 0 ? i / 2 : n - 1 - i / 2];
      const int64_t ext = batch.extend_lens[u.b];
      const int64_t prefix = batch.seq_lens[u.b] - ext + u.first;
      const int64_t count = std::min(kTokens, ext - u.first), q_row0 = batch.extend_start[u.b] + u.first;
      const int32_t* slots = batch.req_to_token + batch.rows[u.b] * batch.context;
      if (bf16) {
        attend_unit<NV>(q, Hq, Hkv, u.g0, u.g1, static_cast<const uint16_t*>(kv.k), static_cast<const uint16_t*>(kv.v),
                        slots, prefix, count, q_row0, scale, out, scratch);
      } else {
        attend_unit<NV>(q, Hq, Hkv, u.g0, u.g1, static_cast<const float*>(kv.k), static_cast<const float*>(kv.v), slots,
                        prefix, count, q_row0, scale, out, scratch);
      }
    }
  });
}

void run_units(const std::vector<Unit>& units, const float* q, float* out, int64_t Hq, const KvBuffers& kv,
               const AttentionBatch& batch, float scale) {
  switch (kv.head_dim / 16) {
    case 1: return run_units<1>(units, q, out, Hq, kv, batch, scale);
    case 2: return run_units<2>(units, q, out, Hq, kv, batch, scale);
    case 4: return run_units<4>(units, q, out, Hq, kv, batch, scale);
    case 5: return run_units<5>(units, q, out, Hq, kv, batch, scale);
    case 6: return run_units<6>(units, q, out, Hq, kv, batch, scale);
    case 8: return run_units<8>(units, q, out, Hq, kv, batch, scale);
    case 16: return run_units<16>(units, q, out, Hq, kv, batch, scale);
    default: fail("head_dim ", kv.head_dim, " is not supported (16, 32, 64, 80, 96, 128 or 256)");
  }
}

void check_batch(int64_t num_tokens, int64_t Hq, const KvBuffers& kv, const AttentionBatch& batch) {
  RADIXLM_CHECK(kv.num_kv_heads > 0 && Hq % kv.num_kv_heads == 0, "head shapes of q and the pool disagree");
  RADIXLM_CHECK(is_supported_head_dim(kv.head_dim), "head_dim ", kv.head_dim,
                " is not supported (16, 32, 64, 80, 96, 128 or 256)");
  const int64_t *row = batch.rows, *seq = batch.seq_lens, *ext = batch.extend_lens, *start = batch.extend_start;
  for (int64_t b = 0; b < batch.size; ++b) {
    RADIXLM_CHECK(row[b] >= 0 && row[b] < batch.num_rows && seq[b] >= 1 && seq[b] <= batch.context && ext[b] >= 1 &&
                      ext[b] <= seq[b] && start[b] >= 0 && start[b] + ext[b] <= num_tokens,
                  "request ", b, ": row, lengths or start out of range");
    const int32_t* slots = batch.req_to_token + row[b] * batch.context;
    for (int64_t p = 0; p < seq[b]; ++p) {
      RADIXLM_CHECK(slots[p] >= 0 && slots[p] < kv.num_slots, "request ", b, ": a KV slot is out of range");
    }
  }
}

// The slots every request of the batch shares at the start of its context (cached positions
// only), where the cascade pays for them; else 0. Decided over the batch's requests, a run of
// consecutive entries on one req_to_token row counting as one request at its first entry's
// length: a speculative verify step sends one request as such a run (its decode row, then its
// drafts, one position apart), and must take the kernel, and so the rounding, that the same
// requests take without drafts. So one request's rows never cascade: each is then computed as
// its one-row decode would be, to the bit.
int64_t cascade_shared_len(const AttentionBatch& batch) {
  const int64_t B = batch.size, *seq = batch.seq_lens, *ext = batch.extend_lens;
  if (B < 2) return 0;
  int64_t shared = std::numeric_limits<int64_t>::max(), num_requests = 0, own_lens = 0;
  const int32_t* first = batch.req_to_token + batch.rows[0] * batch.context;
  for (int64_t b = 0; b < B; ++b) {
    shared = std::min(shared, seq[b] - ext[b]);
    if (b > 0 && batch.rows[b] == batch.rows[b - 1]) continue;  // the run's first entry is the shortest
    ++num_requests;
    own_lens += seq[b];
    const int32_t* slots = batch.req_to_token + batch.rows[b] * batch.context;
    int64_t p = 0;
    while (p < shared && slots[p] == first[p]) ++p;
    shared = p;
  }
  if (num_requests < 2) return 0;
  const int64_t own_keys = own_lens - num_requests * shared;  // keys past the shared ones, over all requests
  // the second pass costs more per key than the vector kernel (3 of 16 lanes for a decode), so
  // the cascade pays where the shared keys dominate (figures: docs/cpu-support.md, "Thresholds
  // and the measurements behind them")
  return shared >= kCascadeMinShared && shared * num_requests >= 4 * own_keys ? shared : 0;
}

std::vector<ExtendRequest> extend_requests(const AttentionBatch& batch, bool long_only) {
  std::vector<ExtendRequest> all;
  for (int64_t b = 0; b < batch.size; ++b) {
    if (long_only && batch.extend_lens[b] < kAmxMinTokens) continue;
    all.push_back(ExtendRequest{batch.req_to_token + batch.rows[b] * batch.context, batch.seq_lens[b],
                                batch.extend_lens[b], batch.extend_start[b]});
  }
  return all;
}

// The whole batch through the cascade kernel over its `shared` first slots (T: q's element, P:
// the pool's).
template <typename T, typename P>
void cascade(const std::vector<ExtendRequest>& all, int64_t shared, const void* q, void* out, int64_t Hq,
             const KvBuffers& kv, float scale) {
  flash_cascade_attention<T, P>(all, shared, static_cast<const T*>(q), static_cast<T*>(out), Hq, kv.num_kv_heads,
                               kv.head_dim, static_cast<const P*>(kv.k), static_cast<const P*>(kv.v), scale);
}

// Requests with kAmxMinTokens+ new tokens on AMX tiles (use_amx) or the long-extend vector kernel.
void long_extends(const std::vector<ExtendRequest>& requests, bool use_amx, const void* q, void* out, DType q_dtype,
                  int64_t Hq, const KvBuffers& kv, float scale) {
  const int64_t Hkv = kv.num_kv_heads, D = kv.head_dim;
  if (kv.dtype == DType::kFloat32) {
    flash_extend_attention<float, float>(requests, static_cast<const float*>(q), static_cast<float*>(out), Hq, Hkv, D,
                                        static_cast<const float*>(kv.k), static_cast<const float*>(kv.v), scale);
    return;
  }
  const auto* kp = static_cast<const uint16_t*>(kv.k);
  const auto* vp = static_cast<const uint16_t*>(kv.v);
  if (q_dtype == DType::kFloat32) {
    (use_amx ? amx_extend_attention<float> : flash_extend_attention<float, uint16_t>)(
        requests, static_cast<const float*>(q), static_cast<float*>(out), Hq, Hkv, D, kp, vp, scale);
  } else {
    (use_amx ? amx_extend_attention<uint16_t> : flash_extend_attention<uint16_t, uint16_t>)(
        requests, static_cast<const uint16_t*>(q), static_cast<uint16_t*>(out), Hq, Hkv, D, kp, vp, scale);
  }
}

// The vector kernel over `units` in float32: a bf16 q is widened, and its requests' rows narrowed
// back after (those of requests another kernel took are left as it wrote them).
void vector_units(const std::vector<Unit>& units, const void* q, void* out, DType q_dtype, int64_t num_tokens,
                  int64_t Hq, const KvBuffers& kv, const AttentionBatch& batch, float scale, bool long_kernel) {
  if (q_dtype == DType::kFloat32) {
    run_units(units, static_cast<const float*>(q), static_cast<float*>(out), Hq, kv, batch, scale);
    return;
  }
  const int64_t width = Hq * kv.head_dim;
  std::vector<float> qf(num_tokens * width), outf(num_tokens * width);
  parallel_for(0, num_tokens, 64, [&](int64_t first, int64_t last) {
    to_float(static_cast<const uint16_t*>(q) + first * width, (last - first) * width, qf.data() + first * width);
  });
  run_units(units, qf.data(), outf.data(), Hq, kv, batch, scale);
  for (int64_t b = 0; b < batch.size; ++b) {
    const int64_t ext = batch.extend_lens[b], start = batch.extend_start[b];
    if (long_kernel && ext >= kAmxMinTokens) continue;
    from_float(outf.data() + start * width, ext * width, static_cast<uint16_t*>(out) + start * width);
  }
}

}  // namespace

bool is_supported_head_dim(int64_t d) { return d == 16 || d == 32 || d == 64 || d == 80 || d == 96 || d == 128 || d == 256; }

int64_t num_cascade_calls() { return num_cascade_calls_.load(std::memory_order_relaxed); }

void paged_attention(const void* q, void* out, DType q_dtype, int64_t num_tokens, int64_t num_heads,
                     const KvBuffers& kv, const AttentionBatch& batch, float scale, bool amx, bool flash) {
  check_batch(num_tokens, num_heads, kv, batch);
  const int64_t D = kv.head_dim;
  // long extends: over a bf16 pool AMX tiles if the caller asks and the CPU runs them, else the
  // vector kernel if the caller asks (vdpbf16ps or float32 FMAs, long_extend_uses_fma); over a
  // float32 pool (and float32 q) the vector kernel in FMAs if the caller asks
  const bool bf16_pool = kv.dtype == DType::kBFloat16, float_q = q_dtype == DType::kFloat32;
  const bool use_amx = amx && bf16_pool && amx_attention_supported(D);
  const bool use_flash = flash && !use_amx && flash_attention_supported(D) && (bf16_pool || float_q);
  const bool long_kernel = use_amx || use_flash;
  if (use_flash) {
    if (const int64_t shared = cascade_shared_len(batch); shared > 0) {
      num_cascade_calls_.fetch_add(1, std::memory_order_relaxed);
      const std::vector<ExtendRequest> all = extend_requests(batch, false);
      if (!bf16_pool) return cascade<float, float>(all, shared, q, out, num_heads, kv, scale);
      if (float_q) return cascade<float, uint16_t>(all, shared, q, out, num_heads, kv, scale);
      return cascade<uint16_t, uint16_t>(all, shared, q, out, num_heads, kv, scale);
    }
  }
  std::vector<Unit> units;
  for (int64_t b = 0; b < batch.size; ++b) {
    const int64_t ext = batch.extend_lens[b];
    if (long_kernel && ext >= kAmxMinTokens) continue;
    for (int64_t first = 0; first < ext; first += kTokens) units.push_back(Unit{b, first});
  }
  if (long_kernel) {
    const std::vector<ExtendRequest> requests = extend_requests(batch, true);
    if (!requests.empty()) long_extends(requests, use_amx, q, out, q_dtype, num_heads, kv, scale);
  }
  if (!units.empty()) vector_units(units, q, out, q_dtype, num_tokens, num_heads, kv, batch, scale, long_kernel);
}

}  // namespace radixlm
