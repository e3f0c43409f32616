// GEMM over K-quant weights (see kquant_gemm.h): weight-only float32 over the vector layer, tiled
// as the other quantized formats (quant_tiles.h).
#include "kernels/kquant_gemm.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

#include "kernels/kquant_scales.h"
#include "kernels/quant_tiles.h"
#include "simd/dot_int8.h"
#include "simd/math.h"

namespace radixlm {
namespace {

using namespace simd;
using namespace qtiles;
using namespace kscales;

constexpr int64_t kSub = 32;  // k of a sub-block
constexpr int64_t header_bytes(QFormat f) { return f == QFormat::kQ6_K ? 288 : 256; }
constexpr int64_t sub_bytes(QFormat f) { return f == QFormat::kQ4_K ? 256 : f == QFormat::kQ5_K ? 320 : 384; }
constexpr int64_t super_bytes(QFormat f) { return header_bytes(f) + 8 * sub_bytes(f); }
constexpr int scale_words(QFormat f) { return f == QFormat::kQ6_K ? 4 : 3; }

// Quad T of a sub-block's 16 columns: byte j of lane c = column c's u at k = 4T + j.
template <QFormat F, int T>
inline Vi kquad(const uint8_t* sub) {
  if constexpr (F == QFormat::kQ6_K) return q6k_quad<T>(sub);
  const Vi raw = vload_i(sub + (T / 2) * 64);
  Vi u = bits(T % 2 ? vshr_i<4>(raw) : raw, 0x0F0F0F0F);
  if constexpr (F == QFormat::kQ5_K) {  // bit T of each byte to bit 4
    u = vor_i(u, bits(shift_left<4 - T>(vload_i(sub + 256)), 0x10101010));
  }
  return u;
}

template <int J>
inline Vf byte_f(Vi q) { return vcvt_f(bits(vshr_i<8 * J>(q), 0xFF)); }

// acc += w * x over quads T... of a sub-block (k0 its first k): w = u * step + shift with the
// product exact, so rounded once: GGUF's (d * sc) * u - dmin * m (shift = -dmin * m), or for
// Q6_K (d * sc) * (u - 32) (shift = -32 * step; the result is exact, at most 24 bits: an 11-bit
// d times a 7-bit |sc| times a 5-bit |u - 32|, or powers of two).
template <QFormat F, int R, int G, int T>
inline void quad_steps(Vf (&acc)[R][G], const uint8_t* const (&sub)[G], const Vf (&step)[G], const Vf (&shift)[G],
                       const float* const (&x)[R], int64_t k0) {
  Vi q[G];
  for (int g = 0; g < G; ++g) q[g] = kquad<F, T>(sub[g]);
  const auto apply = [&](auto j_c) {
    constexpr int J = decltype(j_c)::value;
    Vf w[G];
    for (int g = 0; g < G; ++g) w[g] = vfmadd(byte_f<J>(q[g]), step[g], shift[g]);
    for (int r = 0; r < R; ++r) {
      const Vf xk = vset1(x[r][k0 + 4 * T + J]);
      for (int g = 0; g < G; ++g) acc[r][g] = vfmadd(w[g], xk, acc[r][g]);
    }
  };
  apply(std::integral_constant<int, 0>{});
  apply(std::integral_constant<int, 1>{});
  apply(std::integral_constant<int, 2>{});
  apply(std::integral_constant<int, 3>{});
}

template <QFormat F, int R, int G, int T0, int... T>
inline void sub_steps(Vf (&acc)[R][G], const uint8_t* const (&sub)[G], const Vf (&step)[G], const Vf (&shift)[G],
                      const float* const (&x)[R], int64_t k0, std::integer_sequence<int, T...>) {
  (quad_steps<F, R, G, T0 + T>(acc, sub, step, shift, x, k0), ...);
}

// The step and shift of scale span S (a sub-block; Q6_K: 16 k) of each group's super-block.
template <QFormat F, int G, int S>
inline void span_scales(const uint8_t* const (&super)[G], Vf (&step)[G], Vf (&shift)[G]) {
  constexpr int64_t D = 64 * scale_words(F);
  for (int g = 0; g < G; ++g) {
    if constexpr (F == QFormat::kQ6_K) {
      step[g] = q6k_step<S>(super[g]);
      shift[g] = vmul(step[g], vset1(-32.0f));
    } else {
      Vi sc, m;
      scale_min<S>(super[g], sc, m);
      step[g] = vmul(half16(super[g] + D), vcvt_f(sc));
      shift[g] = vsub(vzero(), vmul(half16(super[g] + D + 32), vcvt_f(m)));
    }
  }
}

template <QFormat F, int G, int... S>
inline void all_scales(const uint8_t* const (&super)[G], Vf (&step)[sizeof...(S)][G], Vf (&shift)[sizeof...(S)][G],
                       std::integer_sequence<int, S...>) {
  (span_scales<F, G, S>(super, step[S], shift[S]), ...);
}

// A super-block of each of the G groups: every span's scales first (unrolled: their shifts are
// constants), then the 8 sub-blocks in a loop, so the pass's code stays small (one sub-block's
// quads unrolled, as the 32-k formats' passes unroll one block).
template <QFormat F, int R, int G>
inline void super_block(Vf (&acc)[R][G], const uint8_t* const (&super)[G], const float* const (&x)[R], int64_t k0) {
  constexpr int kSpans = F == QFormat::kQ6_K ? 16 : 8;
  Vf step[kSpans][G], shift[kSpans][G];
  all_scales<F, G>(super, step, shift, std::make_integer_sequence<int, kSpans>{});
  for (int s = 0; s < 8; ++s) {
    const uint8_t* sub[G];
    for (int g = 0; g < G; ++g) {
      sub[g] = super[g] + header_bytes(F) + s * sub_bytes(F);
      prefetch_ahead<static_cast<int>(sub_bytes(F) / 64)>(sub[g]);
    }
    if constexpr (F == QFormat::kQ6_K) {
      sub_steps<F, R, G, 0>(acc, sub, step[2 * s], shift[2 * s], x, k0 + s * kSub, std::make_integer_sequence<int, 4>{});
      sub_steps<F, R, G, 4>(acc, sub, step[2 * s + 1], shift[2 * s + 1], x, k0 + s * kSub,
                            std::make_integer_sequence<int, 4>{});
    } else {
      sub_steps<F, R, G, 0>(acc, sub, step[s], shift[s], x, k0 + s * kSub, std::make_integer_sequence<int, 8>{});
    }
  }
}

// R rows x G groups: a.nb counts super-blocks here.
template <QFormat F, int R, int G>
__attribute__((noinline)) void kfloat_pass(const PassArgs& p) {
  const Activations& a = p.a;
  const float* x[R];
  for (int r = 0; r < R; ++r) x[r] = a.x + r * a.K;
  Vf acc[R][G];
  init_acc(acc, p);
  for (int64_t s = 0; s < a.nb; ++s) {
    const uint8_t* super[G];
    for (int g = 0; g < G; ++g) super[g] = p.g[g] + s * super_bytes(F);
    super_block<F, R, G>(acc, super, x, s * kKSuper);
  }
  store_acc(acc, p);
}

template <QFormat F>
struct KFloatKernel {
  using Tile = FloatTile;
  template <int R>
  static void pass(const PassArgs& p) { kfloat_pass<F, R, Tile::kGroups>(p); }
};

// The value of column c at k (0..255) of a group's super-block, as GGUF's dequantizer computes it.
float column_value(const uint8_t* super, QFormat f, int64_t c, int k) {
  const int s = k / kSub, t = (k % kSub) / 4, j = k % 4;
  const uint8_t* sub = super + header_bytes(f) + s * sub_bytes(f);
  int32_t u = sub[(t / 2) * 64 + 4 * c + j];
  u = t % 2 ? u >> 4 : u & 0x0F;
  const auto scale_byte = [&](int i) { return super[64 * (i / 4) + 4 * c + i % 4]; };
  float h[16];
  vstore(h, half16(super + 64 * scale_words(f)));
  const float d = h[c];
  if (f == QFormat::kQ6_K) {
    u |= ((sub[256 + (t / 4) * 64 + 4 * c + j] >> (2 * (t % 4))) & 3) << 4;
    const float step = d * static_cast<float>(static_cast<int8_t>(scale_byte(k / 16)));
    return step * static_cast<float>(u - 32);
  }
  if (f == QFormat::kQ5_K) u |= ((sub[256 + 4 * c + j] >> t) & 1) << 4;
  int32_t sc, m;
  if (s < 4) {
    sc = scale_byte(s) & 0x3F;
    m = scale_byte(s + 4) & 0x3F;
  } else {
    sc = (scale_byte(s + 4) & 0x0F) | ((scale_byte(s - 4) >> 6) << 4);
    m = (scale_byte(s + 4) >> 4) | ((scale_byte(s) >> 6) << 4);
  }
  vstore(h, half16(super + 64 * scale_words(f) + 32));
  const float step = d * static_cast<float>(sc), offset = h[c] * static_cast<float>(m);
  return step * static_cast<float>(u) - offset;  // step * u is exact: one rounding, fused or not
}

// --- Q4_K times one int8 row (kquant_gemm.h) ---

using dot8::WBits;

constexpr int64_t kRowHeader = 256, kRowSubBytes = 256, kRowSuperBytes = kRowHeader + 8 * kRowSubBytes;
// Groups of a pass: one. A thread's groups are then one sequential stream of memory (a group's
// super-blocks, then the next group's), which the prefetchers follow best: from memory ~1.2x the
// bytes a second of 2 or 4 groups read side by side (Zen 5, one thread), at the same speed in cache.
constexpr int kRowGroups = 1;

inline void row_check(bool ok, const std::string& message) {
  if (!ok) throw std::runtime_error("q4k_int8_row: " + message);
}

// Sub-block j (x's block b) of a super-block of each of the G groups (their steps and shifts):
// the 32-k dot product of the low and high nibble quads in one accumulator (8 dot() calls, the
// contract's most: one sub-block scale covers both), then the float steps of quant_gemm.cpp's
// q4k_int8_pass, in its order.
template <class Dot, int G>
inline void row_sub_block(Vf (&acc)[G], const uint8_t* const (&blk)[G], const Vf (&step)[G][8], const Vf (&shift)[G][8],
                          int j, const QuantizedX& x, int64_t b) {
  const int8_t* xb = x.xq + b * kQBlock;
  const auto x4 = [xb](int t) {  // read where it is used: the dot's broadcast takes it from memory
    int32_t v;
    std::memcpy(&v, xb + 4 * t, sizeof v);
    return v;
  };
  typename Dot::Acc dot[G];
  for (int g = 0; g < G; ++g) dot[g] = Dot::zero();
  for (int v = 0; v < 4; ++v) {
    for (int g = 0; g < G; ++g) {
      dot[g] = Dot::dot(dot[g], Dot::load(blk[g] + 64 * v, false), x4(2 * v));
      dot[g] = Dot::dot(dot[g], Dot::load(blk[g] + 64 * v, true), x4(2 * v + 1));
    }
  }
  const Vf dx = vset1(x.dx[b]), cx = vset1(x.cx[b]);
  for (int g = 0; g < G; ++g) {
    Vi dt = Dot::sums(dot[g]);
    if constexpr (Dot::kTaken != 0) dt = vadd_i(dt, vset1_i(Dot::kTaken * x.sq[b]));
    acc[g] = vfmadd(vcvt_f(dt), vmul(step[g][j], dx), acc[g]);
    acc[g] = vfmadd(shift[g][j], cx, acc[g]);
  }
}

// Super-block s of each of the G groups (sb[g]): the 8 sub-blocks' steps and shifts first, then
// the sub-blocks in a loop (one sub-block's code, so nothing spills).
template <class Dot, int G>
inline void row_super_block(Vf (&acc)[G], const uint8_t* const (&sb)[G], const QuantizedX& x, int64_t s) {
  Vf step[G][8], shift[G][8];
  for (int g = 0; g < G; ++g) q4k_steps_shifts(sb[g], step[g], shift[g], std::make_integer_sequence<int, 8>{});
  for (int j = 0; j < 8; ++j) {
    const uint8_t* blk[G];
    for (int g = 0; g < G; ++g) blk[g] = sb[g] + kRowHeader + j * kRowSubBytes;
    row_sub_block<Dot, G>(acc, blk, step, shift, j, x, s * 8 + j);
  }
}

// Columns of G groups from w0 (groups group_bytes apart): out, residual, bias at their first column.
template <class Dot, int G>
inline void row_pass(const QuantizedX& x, int64_t supers, const uint8_t* w0, int64_t group_bytes, float* out,
                     const float* residual, const float* bias) {
  Vf acc[G];
  for (int g = 0; g < G; ++g) {
    const Vf a = residual ? vload(residual + 16 * g) : vzero();
    acc[g] = bias ? vadd(a, vload(bias + 16 * g)) : a;
  }
  for (int64_t s = 0; s < supers; ++s) {
    const uint8_t* sb[G];
    for (int g = 0; g < G; ++g) sb[g] = w0 + g * group_bytes + s * kRowSuperBytes;
    row_super_block<Dot, G>(acc, sb, x, s);
  }
  for (int g = 0; g < G; ++g) vstore(out + 16 * g, acc[g]);
}

template <class Dot>
void row_groups(const QuantizedX& x, int64_t K, const uint8_t* w, int64_t groups, float* out, const float* residual,
                const float* bias) {
  const int64_t supers = K / kKSuper, group_bytes = supers * kRowSuperBytes;
  int64_t g = 0;
  const auto at = [&](const float* p) { return p ? p + 16 * g : nullptr; };
  for (; g < groups; g += kRowGroups) {
    row_pass<Dot, kRowGroups>(x, supers, w + g * group_bytes, group_bytes, out + 16 * g, at(residual), at(bias));
  }
}

// The variants of this build (dot8::Int8Variants) by index.
template <template <WBits> class... D>
int row_variant_index(dot8::VariantList<D...>, const std::string& name) {
  int i = 0, found = static_cast<int>(sizeof...(D)) - 1;  // generic, the last, if none matches
  ((name == D<WBits::k4>::kName ? (found = i, ++i) : ++i), ...);
  return found;
}

template <template <WBits> class... D>
void row_with_variant(int index, dot8::VariantList<D...>, const QuantizedX& x, int64_t K, const uint8_t* w,
                      int64_t groups, float* out, const float* residual, const float* bias) {
  int i = 0;
  ((i++ == index ? D<WBits::k4>::run([&] { row_groups<D<WBits::k4>>(x, K, w, groups, out, residual, bias); })
                 : void()),
   ...);
}

}  // namespace

bool is_kquant(QFormat f) { return f == QFormat::kQ4_K || f == QFormat::kQ5_K || f == QFormat::kQ6_K; }

int64_t kq_block_bytes(QFormat f) { return super_bytes(f); }

void kq_gemm(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t groups, QFormat format, float* out,
             int64_t ld_out, const float* residual, int64_t ld_res, const float* bias) {
  check(K % kKSuper == 0, "a K-quant product's K must be a multiple of 256, got " + std::to_string(K));
  check(groups % 2 == 0, "quant groups come in pairs (N padded to a multiple of 64)");
  if (M == 0 || groups == 0) return;
  Activations act;
  act.x = x;
  act.K = K;
  act.nb = K / kKSuper;
  const int64_t group_bytes = act.nb * super_bytes(format);
  switch (format) {
    case QFormat::kQ4_K: return run<KFloatKernel<QFormat::kQ4_K>>(act, M, w, groups, group_bytes, out, ld_out, residual, ld_res, bias);
    case QFormat::kQ5_K: return run<KFloatKernel<QFormat::kQ5_K>>(act, M, w, groups, group_bytes, out, ld_out, residual, ld_res, bias);
    case QFormat::kQ6_K: return run<KFloatKernel<QFormat::kQ6_K>>(act, M, w, groups, group_bytes, out, ld_out, residual, ld_res, bias);
    default: throw std::runtime_error("kq_gemm: not a K-quant format");
  }
}

void kq_columns(const uint8_t* w, int64_t groups, int64_t supers, QFormat format, const int64_t* cols, int64_t T,
                float* out) {
  const int64_t SB = super_bytes(format);
  parallel_for(0, T, 64, [&](int64_t first, int64_t last) {
    for (int64_t t = first; t < last; ++t) {
      const int64_t g = cols[t] / kQGroup, c = cols[t] % kQGroup;
      for (int64_t s = 0; s < supers; ++s) {
        const uint8_t* super = w + (g * supers + s) * SB;
        for (int k = 0; k < kKSuper; ++k) out[(t * supers + s) * kKSuper + k] = column_value(super, format, c, k);
      }
    }
  });
  (void)groups;  // cols are checked against it by q_columns
}

bool q4k_row_takes(QFormat format, QMode mode, int64_t M) {
  return M == 1 && format == QFormat::kQ4_K && mode != QMode::kFloat;
}

int q4k_row_variant() { return row_variant_index(dot8::Int8Variants{}, int8_variant()); }

void q4k_int8_row(const QuantizedX& x, int64_t K, const uint8_t* w, int64_t groups, float* out,
                  const float* residual, const float* bias, int variant) {
  row_with_variant(variant, dot8::Int8Variants{}, x, K, w, groups, out, residual, bias);
}

void q4k_int8_row_parallel(const float* x, int64_t K, const uint8_t* w, int64_t groups, QMode mode, float* out,
                           const float* residual, const float* bias, const QuantizedX* quantized) {
  row_check(K % kKSuper == 0, "K must be a multiple of 256, got " + std::to_string(K));
  row_check(groups % 2 == 0, "quant groups come in pairs (N padded to a multiple of 64)");
  if (groups == 0) return;
  QuantizedXBuffer xq;
  if (quantized == nullptr) q_quantize_x(x, 1, K, mode, xq);
  const QuantizedX view = quantized ? *quantized : xq.view();
  const int variant = q4k_row_variant();
  // Chunks of kRowChunk groups claimed off a shared counter: a thread that loses its core to
  // another process holds the product up by the chunk it runs, not by half the product (an even
  // split's). Each chunk is one sequential stream of ~150-300 KB (K 2048-4096).
  constexpr int64_t kRowChunk = 8;
  const int64_t chunks = (groups + kRowChunk - 1) / kRowChunk, group_bytes = K / kKSuper * kRowSuperBytes;
  std::atomic<int64_t> next{0};
  parallel_for(0, std::min<int64_t>(std::max(1, num_threads()), chunks), 1, [&](int64_t, int64_t) {
    for (int64_t c = next.fetch_add(1); c < chunks; c = next.fetch_add(1)) {
      const int64_t g0 = c * kRowChunk, n = std::min(kRowChunk, groups - g0);
      const auto at = [&](const float* p) { return p ? p + 16 * g0 : nullptr; };
      q4k_int8_row(view, K, w + g0 * group_bytes, n, out + 16 * g0, at(residual), at(bias), variant);
    }
  });
}

}  // namespace radixlm
