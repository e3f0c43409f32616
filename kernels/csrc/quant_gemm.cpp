// GEMM over block-quantized weights (see quant_gemm.h): weight-only float32, or int8 x int8 with
// vpdpbusd.
#include "quant_gemm.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>
#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "simd_math.h"

namespace radixlm {
namespace {

// A pass computes kQRows rows x two groups (32 columns): 2 x rows accumulators and 2 x rows block
// sums (24 registers at 6 rows), so each weight vector loaded (and unpacked) serves 6 rows.
constexpr int kQRows = 6;
constexpr int64_t kQRowChunk = 96;  // rows of one work unit of a large product

constexpr int64_t value_bytes(QFormat f) { return f == QFormat::kQ8_0 ? 512 : 256; }
constexpr int64_t block_bytes(QFormat f) { return value_bytes(f) + (f == QFormat::kQ4_1 ? 64 : 32); }
template <QFormat F>
constexpr int kBlockLines = static_cast<int>((block_bytes(F) + 63) / 64);  // cache lines a block spans
constexpr int32_t offset_of(QFormat f) { return f == QFormat::kQ8_0 ? 128 : f == QFormat::kQ4_0 ? 8 : 0; }

std::atomic<int64_t> vnni_calls{0};

// x as a GEMM reads it: float32 rows, and for the int8 modes their int8 values with, per row and
// block, the scale dx, the sum of the int8 values sq and dx * sq.
struct Activations {
  const float* x = nullptr;
  const int8_t* xq = nullptr;
  const float* dx = nullptr;
  const int32_t* sq = nullptr;
  const float* cx = nullptr;
  int64_t K = 0, nb = 0;

  Activations from_row(int64_t r) const {
    Activations a = *this;
    a.x = x + r * K;
    if (xq) {
      a.xq = xq + r * K;
      a.dx = dx + r * nb;
      a.sq = sq + r * nb;
      a.cx = cx + r * nb;
    }
    return a;
  }
};

// Quad t of a block's 16 columns: byte 4c + j = the unsigned value of column c at k = 4t + j.
template <QFormat F>
inline __m512i quad(const uint8_t* blk, int t) {
  if constexpr (F == QFormat::kQ8_0) {
    return _mm512_loadu_si512(blk + t * 64);
  } else {
    const __m512i raw = _mm512_loadu_si512(blk + (t / 2) * 64), low = _mm512_set1_epi8(0x0F);
    return t % 2 == 0 ? _mm512_and_si512(raw, low) : _mm512_and_si512(_mm512_srli_epi16(raw, 4), low);
  }
}

inline __m512 half16(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }

template <int R>
inline void init_acc(__m512 (&acc)[R][2], const float* res, int64_t ld_res, const float* bias) {
  for (int r = 0; r < R; ++r) {
    for (int g = 0; g < 2; ++g) {
      __m512 a = res ? _mm512_loadu_ps(res + r * ld_res + 16 * g) : _mm512_setzero_ps();
      acc[r][g] = bias ? _mm512_add_ps(a, _mm512_loadu_ps(bias + 16 * g)) : a;
    }
  }
}

template <int R>
inline void store_acc(const __m512 (&acc)[R][2], float* out, int64_t ld_out) {
  for (int r = 0; r < R; ++r) {
    for (int g = 0; g < 2; ++g) _mm512_storeu_ps(out + r * ld_out + 16 * g, acc[r][g]);
  }
}

// R rows x groups g0, g1 with x quantized to int8: per block, int32 dot products (vpdpbusd: the
// weight's unsigned bytes times x's signed ones, 4 per lane), the offset taken off in int32, then
// acc += float(dot) * d * dx (+ m * dx * sq for Q4_1).
template <QFormat F, int R>
__attribute__((target("avx512vnni"))) void int8_pass(const Activations& a, const uint8_t* g0, const uint8_t* g1,
                                                     float* out, int64_t ld_out, const float* res, int64_t ld_res,
                                                     const float* bias) {
  constexpr int64_t BB = block_bytes(F), VB = value_bytes(F);
  __m512 acc[R][2];
  init_acc<R>(acc, res, ld_res, bias);
  for (int64_t b = 0; b < a.nb; ++b) {
    const uint8_t* blk[2] = {g0 + b * BB, g1 + b * BB};
    prefetch_ahead<kBlockLines<F>>(blk[0]);
    prefetch_ahead<kBlockLines<F>>(blk[1]);
    __m512i dot[R][2];
    for (int r = 0; r < R; ++r) dot[r][0] = dot[r][1] = _mm512_setzero_si512();
    for (int t = 0; t < 8; ++t) {
      const __m512i w0 = quad<F>(blk[0], t), w1 = quad<F>(blk[1], t);
      for (int r = 0; r < R; ++r) {
        int32_t four;
        std::memcpy(&four, a.xq + r * a.K + b * kQBlock + 4 * t, sizeof four);
        const __m512i xb = _mm512_set1_epi32(four);
        dot[r][0] = _mm512_dpbusd_epi32(dot[r][0], w0, xb);
        dot[r][1] = _mm512_dpbusd_epi32(dot[r][1], w1, xb);
      }
    }
    for (int g = 0; g < 2; ++g) {
      const __m512 d = half16(blk[g] + VB);
      const __m512 m = F == QFormat::kQ4_1 ? half16(blk[g] + VB + 32) : _mm512_setzero_ps();
      for (int r = 0; r < R; ++r) {
        const int64_t i = r * a.nb + b;
        __m512i dt = dot[r][g];
        if constexpr (F != QFormat::kQ4_1) dt = _mm512_sub_epi32(dt, _mm512_set1_epi32(offset_of(F) * a.sq[i]));
        acc[r][g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dt), _mm512_mul_ps(d, _mm512_set1_ps(a.dx[i])), acc[r][g]);
        if constexpr (F == QFormat::kQ4_1) acc[r][g] = _mm512_fmadd_ps(m, _mm512_set1_ps(a.cx[i]), acc[r][g]);
      }
    }
  }
  store_acc<R>(acc, out, ld_out);
}

// Column values of byte j of each lane of quad q as float32: the signed value (u - offset) for
// Q8_0 and Q4_0, u for Q4_1.
template <QFormat F>
inline __m512 widen(__m512i q, int j) {
  if constexpr (F == QFormat::kQ8_0) {
    // q holds u ^ 0x80 = the signed value's bytes: sign-extend byte j
    return _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(q, 24 - 8 * j), 24));
  } else {
    const __m512i u = _mm512_and_si512(_mm512_srli_epi32(q, 8 * j), _mm512_set1_epi32(0xFF));
    if constexpr (F == QFormat::kQ4_0) return _mm512_cvtepi32_ps(_mm512_sub_epi32(u, _mm512_set1_epi32(8)));
    return _mm512_cvtepi32_ps(u);
  }
}

// R rows x groups g0, g1 with float32 x: each weight dequantized in registers as the file's
// dequantizer does (d * q, exact for Q8_0 and Q4_0; d * u + m rounded once for Q4_1), then
// multiplied with x: the products of a float32 model holding the dequantized weights, in
// another order of additions.
template <QFormat F, int R>
void float_pass(const Activations& a, const uint8_t* g0, const uint8_t* g1, float* out, int64_t ld_out,
                const float* res, int64_t ld_res, const float* bias) {
  constexpr int64_t BB = block_bytes(F), VB = value_bytes(F);
  __m512 acc[R][2];
  init_acc<R>(acc, res, ld_res, bias);
  for (int64_t b = 0; b < a.nb; ++b) {
    const uint8_t* blk[2] = {g0 + b * BB, g1 + b * BB};
    prefetch_ahead<kBlockLines<F>>(blk[0]);
    prefetch_ahead<kBlockLines<F>>(blk[1]);
    const __m512 d0 = half16(blk[0] + VB), d1 = half16(blk[1] + VB);
    __m512 m0 = _mm512_setzero_ps(), m1 = _mm512_setzero_ps();
    if constexpr (F == QFormat::kQ4_1) {
      m0 = half16(blk[0] + VB + 32);
      m1 = half16(blk[1] + VB + 32);
    }
    for (int t = 0; t < 8; ++t) {
      __m512i q0 = quad<F>(blk[0], t), q1 = quad<F>(blk[1], t);
      if constexpr (F == QFormat::kQ8_0) {
        q0 = _mm512_xor_si512(q0, _mm512_set1_epi8(static_cast<char>(0x80)));
        q1 = _mm512_xor_si512(q1, _mm512_set1_epi8(static_cast<char>(0x80)));
      }
      for (int j = 0; j < 4; ++j) {
        __m512 w0, w1;
        if constexpr (F == QFormat::kQ4_1) {
          w0 = _mm512_fmadd_ps(widen<F>(q0, j), d0, m0);
          w1 = _mm512_fmadd_ps(widen<F>(q1, j), d1, m1);
        } else {
          w0 = _mm512_mul_ps(widen<F>(q0, j), d0);
          w1 = _mm512_mul_ps(widen<F>(q1, j), d1);
        }
        const int64_t k = b * kQBlock + 4 * t + j;
        for (int r = 0; r < R; ++r) {
          const __m512 xk = _mm512_set1_ps(a.x[r * a.K + k]);
          acc[r][0] = _mm512_fmadd_ps(w0, xk, acc[r][0]);
          acc[r][1] = _mm512_fmadd_ps(w1, xk, acc[r][1]);
        }
      }
    }
  }
  store_acc<R>(acc, out, ld_out);
}

template <QFormat F, int R>
void pass(bool int8, const Activations& a, const uint8_t* g0, const uint8_t* g1, float* out, int64_t ld_out,
          const float* res, int64_t ld_res, const float* bias) {
  if (int8) {
    int8_pass<F, R>(a, g0, g1, out, ld_out, res, ld_res, bias);
  } else {
    float_pass<F, R>(a, g0, g1, out, ld_out, res, ld_res, bias);
  }
}

// Rows [m0, m1) x the 32 columns of groups g0, g1, in passes of at most kQRows rows, as even as
// they can be.
template <QFormat F>
void unit(bool int8, const Activations& act, int64_t m0, int64_t m1, const uint8_t* g0, const uint8_t* g1, float* out,
          int64_t ld_out, const float* res, int64_t ld_res, const float* bias) {
  int64_t passes = (m1 - m0 + kQRows - 1) / kQRows;
  for (int64_t r0 = m0; r0 < m1; --passes) {
    const int64_t rows = (m1 - r0 + passes - 1) / passes;
    const Activations a = act.from_row(r0);
    float* o = out + r0 * ld_out;
    const float* rs = res ? res + r0 * ld_res : nullptr;
    switch (rows) {
      case 1: pass<F, 1>(int8, a, g0, g1, o, ld_out, rs, ld_res, bias); break;
      case 2: pass<F, 2>(int8, a, g0, g1, o, ld_out, rs, ld_res, bias); break;
      case 3: pass<F, 3>(int8, a, g0, g1, o, ld_out, rs, ld_res, bias); break;
      case 4: pass<F, 4>(int8, a, g0, g1, o, ld_out, rs, ld_res, bias); break;
      case 5: pass<F, 5>(int8, a, g0, g1, o, ld_out, rs, ld_res, bias); break;
      default: pass<F, 6>(int8, a, g0, g1, o, ld_out, rs, ld_res, bias); break;
    }
    r0 += rows;
  }
}

inline float max_abs(const float* p, int64_t n) {
  __m512 m = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(p + i)));
  return _mm512_reduce_max_ps(m);
}

// Row m of x to int8 (per 32-block scales, or one per row), with each block's dx, sq and dx * sq.
void quantize_row(const float* src, int64_t K, bool per_row, int8_t* q, float* dx, int32_t* sq, float* cx) {
  float d = per_row ? max_abs(src, K) / 127.0f : 0.0f;
  for (int64_t b = 0; b < K / kQBlock; ++b) {
    const float* s = src + b * kQBlock;
    if (!per_row) d = max_abs(s, kQBlock) / 127.0f;
    const __m512 inv = _mm512_set1_ps(d > 0.0f ? 1.0f / d : 0.0f);
    const __m512i v0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(s), inv));
    const __m512i v1 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(s + 16), inv));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * kQBlock), _mm512_cvtsepi32_epi8(v0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * kQBlock + 16), _mm512_cvtsepi32_epi8(v1));
    // the stored (saturated) values' sum
    const __m512i w0 = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + b * kQBlock)));
    const __m512i w1 = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + b * kQBlock + 16)));
    sq[b] = _mm512_reduce_add_epi32(_mm512_add_epi32(w0, w1));
    dx[b] = d;
    cx[b] = d * static_cast<float>(sq[b]);
  }
}

template <QFormat F>
void run(bool int8, const Activations& act, int64_t M, const uint8_t* w, int64_t groups, float* out, int64_t ld_out,
         const float* residual, int64_t ld_res, const float* bias) {
  // Units of 32 columns x a chunk of rows; a product with few column blocks is also split by
  // rows, so both threads get equal work.
  const int64_t tiles = groups / 2, group_bytes = act.nb * block_bytes(F);
  int64_t chunk = kQRowChunk;
  if (M <= kQRowChunk && tiles < 8 * at::get_num_threads() && M >= 2 * kQRows) chunk = (M + 1) / 2;
  const int64_t chunks = (M + chunk - 1) / chunk;
  at::parallel_for(0, tiles * chunks, 1, [&](int64_t first, int64_t last) {
    for (int64_t u = first; u < last; ++u) {
      const int64_t tile = u / chunks, m0 = (u % chunks) * chunk, m1 = std::min(M, m0 + chunk);
      const uint8_t* g0 = w + 2 * tile * group_bytes;
      const int64_t col = tile * 2 * kQGroup;
      unit<F>(int8, act, m0, m1, g0, g0 + group_bytes, out + col, ld_out, residual ? residual + col : nullptr, ld_res,
              bias ? bias + col : nullptr);
    }
  });
}

}  // namespace

int64_t q_block_bytes(QFormat format) { return block_bytes(format); }

QFormat q_format_of(int64_t bytes) {
  for (QFormat f : {QFormat::kQ8_0, QFormat::kQ4_0, QFormat::kQ4_1}) {
    if (block_bytes(f) == bytes) return f;
  }
  TORCH_CHECK(false, "no quantized format has ", bytes, "-byte blocks (Q8_0 544, Q4_0 288, Q4_1 320)");
}

bool cpu_has_vnni() {
  static const bool vnni = [] {
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (c & (1u << 11));
  }();
  return vnni;
}

int64_t num_vnni_calls() { return vnni_calls.load(); }

// d * (u - offset) is exact in float32 (an 11-bit float16 significand times at most 8 bits), so
// Q4_1's + m rounds once whether or not the compiler fuses it: GGUF's value either way.
void q_columns(const uint8_t* w, int64_t groups, int64_t nb, QFormat format, const int64_t* cols, int64_t T,
               float* out) {
  for (int64_t t = 0; t < T; ++t) {
    TORCH_CHECK(cols[t] >= 0 && cols[t] < groups * kQGroup, "column ", cols[t], " is out of range [0, ",
                groups * kQGroup, ")");
  }
  const int64_t BB = block_bytes(format), VB = value_bytes(format);
  const int32_t offset = offset_of(format);
  auto half = [](const uint8_t* p) {
    uint16_t bits;
    std::memcpy(&bits, p, sizeof bits);
    return c10::detail::fp16_ieee_to_fp32_value(bits);
  };
  at::parallel_for(0, T, 64, [&](int64_t first, int64_t last) {
    for (int64_t t = first; t < last; ++t) {
      const int64_t g = cols[t] / kQGroup, c = cols[t] % kQGroup;
      float* row = out + t * nb * kQBlock;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = w + (g * nb + b) * BB;
        const float d = half(blk + VB + 2 * c);
        const float m = format == QFormat::kQ4_1 ? half(blk + VB + 32 + 2 * c) : 0.0f;
        for (int k = 0; k < kQBlock; ++k) {
          const int quad = k / 4, j = k % 4;
          int32_t u;
          if (format == QFormat::kQ8_0) {
            u = blk[quad * 64 + 4 * c + j];
          } else {
            const uint8_t byte = blk[(quad / 2) * 64 + 4 * c + j];
            u = quad % 2 == 0 ? byte & 0x0F : byte >> 4;
          }
          float v = d * static_cast<float>(u - offset);
          if (format == QFormat::kQ4_1) v = v + m;
          row[b * kQBlock + k] = v;
        }
      }
    }
  });
}

void q_gemm(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t groups, QFormat format, QMode mode,
            float* out, int64_t ld_out, const float* residual, int64_t ld_res, const float* bias) {
  TORCH_CHECK(K % kQBlock == 0, "a quantized product's K must be a multiple of 32, got ", K);
  TORCH_CHECK(groups % 2 == 0, "quant groups come in pairs (N padded to a multiple of 64)");
  if (M == 0 || groups == 0) return;
  const int64_t nb = K / kQBlock;
  const bool int8 = mode != QMode::kFloat;
  Activations act;
  act.x = x;
  act.K = K;
  act.nb = nb;
  std::vector<int8_t> xq;
  std::vector<float> dx, cx;
  std::vector<int32_t> sq;
  if (int8) {
    TORCH_CHECK(cpu_has_vnni(), "the int8 quantized products need AVX512-VNNI, which this CPU lacks");
    xq.resize(M * K);
    dx.resize(M * nb);
    cx.resize(M * nb);
    sq.resize(M * nb);
    at::parallel_for(0, M, 64, [&](int64_t first, int64_t last) {
      for (int64_t m = first; m < last; ++m) {
        quantize_row(x + m * K, K, mode == QMode::kInt8Row, xq.data() + m * K, dx.data() + m * nb, sq.data() + m * nb,
                     cx.data() + m * nb);
      }
    });
    act.xq = xq.data();
    act.dx = dx.data();
    act.sq = sq.data();
    act.cx = cx.data();
    vnni_calls.fetch_add(1);
  }
  switch (format) {
    case QFormat::kQ8_0: run<QFormat::kQ8_0>(int8, act, M, w, groups, out, ld_out, residual, ld_res, bias); break;
    case QFormat::kQ4_0: run<QFormat::kQ4_0>(int8, act, M, w, groups, out, ld_out, residual, ld_res, bias); break;
    case QFormat::kQ4_1: run<QFormat::kQ4_1>(int8, act, M, w, groups, out, ld_out, residual, ld_res, bias); break;
  }
}

}  // namespace radixlm
