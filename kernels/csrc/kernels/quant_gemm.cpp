// GEMM over block-quantized weights (see quant_gemm.h): weight-only float32 over the vector layer,
// or int8 x int8 through the int8 dot variants (simd/dot_int8.h).
// Torch-free (kernels/parallel.h): errors are std::runtime_error (Python sees RuntimeError).
#include "kernels/quant_gemm.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "dispatch/cpu_features.h"
#include "kernels/packed_gemm.h"
#include "kernels/parallel.h"
#include "simd/dot_int8.h"
#include "kernels/kquant_gemm.h"
#include "kernels/kquant_scales.h"
#include "kernels/quant_tiles.h"
#include "simd/math.h"

namespace radixlm {
namespace {

using namespace simd;
using namespace qtiles;
using dot8::WBits;

constexpr int64_t value_bytes(QFormat f) { return f == QFormat::kQ8_0 ? 512 : 256; }
constexpr int64_t block_bytes(QFormat f) { return value_bytes(f) + (f == QFormat::kQ4_1 ? 64 : 32); }
template <QFormat F>
constexpr int kBlockLines = static_cast<int>((block_bytes(F) + 63) / 64);  // cache lines a block spans
constexpr int32_t offset_of(QFormat f) { return f == QFormat::kQ8_0 ? 128 : f == QFormat::kQ4_0 ? 8 : 0; }
constexpr WBits bits_of(QFormat f) { return f == QFormat::kQ8_0 ? WBits::k8 : WBits::k4; }

std::atomic<int64_t> int8_calls{0};
std::atomic<int> forced_variant{-1};  // an index into Int8Variants, or -1: the fastest that runs

// The 64 bytes holding quad t of a block's values, and whether quad t is their high nibbles
// (Q4: quads 2i and 2i+1 share a vector, low and high nibble).
template <QFormat F>
inline const uint8_t* quad_bytes(const uint8_t* blk, int t) { return blk + (F == QFormat::kQ8_0 ? t : t / 2) * 64; }
template <QFormat F>
inline bool quad_high(int t) { return F != QFormat::kQ8_0 && t % 2 == 1; }

// Quad t of a block's 16 columns as 16 lanes: byte j of lane c = the stored value of column c
// at k = 4t + j (Q8_0: u ^ 0x80, the signed value's bits; Q4: u).
template <QFormat F>
inline Vi quad(const uint8_t* blk, int t) {
  const Vi raw = vload_i(quad_bytes<F>(blk, t));
  if constexpr (F == QFormat::kQ8_0) return vxor_i(raw, vset1_i(static_cast<int32_t>(0x80808080u)));
  const Vi low = vset1_i(0x0F0F0F0F);
  return quad_high<F>(t) ? vand_i(vshr_i<4>(raw), low) : vand_i(raw, low);
}

// The int32 dot products of x's block b (of each row) with a block of each group's 16 columns
// (32 k as eight quads, kQuads to a 64-byte value vector: 1 for bytes, 2 for nibbles, low then
// high): dot[r][g] lane c = sum over the block's k of u(c, k) * xq[r][k] (Dot's contract).
// Shared by every int8 pass (the 32-k formats' blocks, Q4_K's sub-blocks).
template <class Dot, int kQuads, int R, int G>
inline void block_dots(typename Dot::Acc (&dot)[R][G], const uint8_t* const (&blk)[G], const int8_t* const (&xq)[R],
                       int64_t b) {
  for (int r = 0; r < R; ++r) {
    for (int g = 0; g < G; ++g) dot[r][g] = Dot::zero();
  }
  for (int v = 0; v < 8 / kQuads; ++v) {
    for (int h = 0; h < kQuads; ++h) {
      const int t = v * kQuads + h;
      typename Dot::W w[G];
      for (int g = 0; g < G; ++g) w[g] = Dot::load(blk[g] + 64 * v, h == 1);
      for (int r = 0; r < R; ++r) {
        int32_t x4;
        std::memcpy(&x4, xq[r] + b * kQBlock + 4 * t, sizeof x4);
        for (int g = 0; g < G; ++g) dot[r][g] = Dot::dot(dot[r][g], w[g], x4);
      }
    }
  }
}

// R rows x G groups with x quantized to int8: per block, the int32 dot products of the dot
// variant D (the weights' u times x's int8, 4 per lane), the rest of the offset taken off in
// int32 (exact), then acc += float(dot) * d * dx (+ m * dx * sq for Q4_1). The sums are the same
// integers on every variant, so the output is too.
template <template <WBits> class D, QFormat F, int R, int G>
void int8_pass(const PassArgs& p) {
  using Dot = D<bits_of(F)>;
  constexpr int64_t BB = block_bytes(F), VB = value_bytes(F);
  constexpr int32_t kRest = offset_of(F) - Dot::kTaken;
  const Activations& a = p.a;
  const int8_t* xq[R];  // the rows (one base register each, k the index)
  for (int r = 0; r < R; ++r) xq[r] = a.xq + r * a.K;
  Vf acc[R][G];
  init_acc(acc, p);
  for (int64_t b = 0; b < a.nb; ++b) {
    const uint8_t* blk[G];
    for (int g = 0; g < G; ++g) {
      blk[g] = p.g[g] + b * BB;
      prefetch_ahead<kBlockLines<F>>(blk[g]);
    }
    typename Dot::Acc dot[R][G];
    block_dots<Dot, F == QFormat::kQ8_0 ? 1 : 2>(dot, blk, xq, b);
    for (int g = 0; g < G; ++g) {
      const Vf d = half16(blk[g] + VB);
      const Vf m = F == QFormat::kQ4_1 ? half16(blk[g] + VB + 32) : vzero();
      for (int r = 0; r < R; ++r) {
        const int64_t i = r * a.nb + b;
        Vi dt = Dot::sums(dot[r][g]);
        if constexpr (kRest != 0) dt = vsub_i(dt, vset1_i(kRest * a.sq[i]));
        acc[r][g] = vfmadd(vcvt_f(dt), vmul(d, vset1(a.dx[i])), acc[r][g]);
        if constexpr (F == QFormat::kQ4_1) acc[r][g] = vfmadd(m, vset1(a.cx[i]), acc[r][g]);
      }
    }
  }
  store_acc(acc, p);
}

// Q4_K with x quantized to int8 (its 32-k sub-blocks are x's int8 blocks): as int8_pass on Q4_1,
// each sub-block's step d * sc and shift -dmin * m (unpacked from its super-block's header,
// kquant_gemm.h) in place of a block's d and m.
template <template <WBits> class D, int R, int G>
void q4k_int8_pass(const PassArgs& p) {
  using Dot = D<WBits::k4>;
  constexpr int64_t kHeader = 256, kSubBytes = 256, kSuperBytes = kHeader + 8 * kSubBytes;
  const Activations& a = p.a;
  const int8_t* xq[R];
  for (int r = 0; r < R; ++r) xq[r] = a.xq + r * a.K;
  Vf acc[R][G];
  init_acc(acc, p);
  for (int64_t s = 0; s < a.nb / 8; ++s) {
    Vf step[G][8], shift[G][8];
    for (int g = 0; g < G; ++g) {
      kscales::q4k_steps_shifts(p.g[g] + s * kSuperBytes, step[g], shift[g], std::make_integer_sequence<int, 8>{});
    }
    for (int j = 0; j < 8; ++j) {
      const int64_t b = s * 8 + j;  // x's block
      const uint8_t* blk[G];
      for (int g = 0; g < G; ++g) {
        blk[g] = p.g[g] + s * kSuperBytes + kHeader + j * kSubBytes;
        prefetch_ahead<4>(blk[g]);
      }
      typename Dot::Acc dot[R][G];
      block_dots<Dot, 2>(dot, blk, xq, b);
      for (int g = 0; g < G; ++g) {
        for (int r = 0; r < R; ++r) {
          const int64_t i = r * a.nb + b;
          Vi dt = Dot::sums(dot[r][g]);
          if constexpr (Dot::kTaken != 0) dt = vadd_i(dt, vset1_i(Dot::kTaken * a.sq[i]));
          acc[r][g] = vfmadd(vcvt_f(dt), vmul(step[g][j], vset1(a.dx[i])), acc[r][g]);
          acc[r][g] = vfmadd(shift[g][j], vset1(a.cx[i]), acc[r][g]);
        }
      }
    }
  }
  store_acc(acc, p);
}

template <template <WBits> class D>
struct Q4KInt8Kernel {
  using Tile = Int8Tile;
  template <int R>
  static void pass(const PassArgs& p) { D<WBits::k4>::run([&] { q4k_int8_pass<D, R, Tile::kGroups>(p); }); }
};

// Q6_K with x quantized to int8: per 16-k scale span (half of x's block b), the exact sum of
// q * x (q = u - 32, the dot variants' k6) for each row and group, then acc += float(sum) *
// (step * dx), step = d * sc exact (an 11-bit d times an 8-bit sc), the spans in k's order.
template <class Dot, int T, int R, int G>
inline void q6k_quad_dots(typename Dot::Acc (&dot)[R][G], const uint8_t* const (&blk)[G],
                          const int8_t* const (&xq)[R], int64_t k0) {
  typename Dot::W w[G];
  for (int g = 0; g < G; ++g) w[g] = Dot::from_u6(kscales::q6k_quad<T>(blk[g]));
  for (int r = 0; r < R; ++r) {
    int32_t x4;
    std::memcpy(&x4, xq[r] + k0 + 4 * T, sizeof x4);
    for (int g = 0; g < G; ++g) dot[r][g] = Dot::dot(dot[r][g], w[g], x4);
  }
}

template <class Dot, int R, int G, int... T>
inline void q6k_span_dots(typename Dot::Acc (&dot)[R][G], const uint8_t* const (&blk)[G],
                          const int8_t* const (&xq)[R], int64_t k0, std::integer_sequence<int, T...>) {
  for (int r = 0; r < R; ++r) {
    for (int g = 0; g < G; ++g) dot[r][g] = Dot::zero();
  }
  (q6k_quad_dots<Dot, T>(dot, blk, xq, k0), ...);
}

template <int... S>
inline void q6k_steps(const uint8_t* super, Vf (&step)[16], std::integer_sequence<int, S...>) {
  ((step[S] = kscales::q6k_step<S>(super)), ...);
}

// Span H (quads 4H..4H+3) of sub-block j of the pass's groups (blk), onto acc.
template <class Dot, int H, int R, int G>
inline void q6k_span(Vf (&acc)[R][G], const uint8_t* const (&blk)[G], const Vf (&step)[G][16], const Activations& a,
                     const int8_t* const (&xq)[R], int64_t b, int j) {
  typename Dot::Acc dot[R][G];
  q6k_span_dots<Dot>(dot, blk, xq, b * kQBlock, std::integer_sequence<int, 4 * H, 4 * H + 1, 4 * H + 2, 4 * H + 3>{});
  for (int g = 0; g < G; ++g) {
    for (int r = 0; r < R; ++r) {
      acc[r][g] = vfmadd(vcvt_f(Dot::sums(dot[r][g])), vmul(step[g][2 * j + H], vset1(a.dx[r * a.nb + b])), acc[r][g]);
    }
  }
}

template <template <WBits> class D, int R, int G>
void q6k_int8_pass(const PassArgs& p) {
  using Dot = D<WBits::k6>;
  constexpr int64_t kHeader = 288, kSubBytes = 384, kSuperBytes = kHeader + 8 * kSubBytes;
  const Activations& a = p.a;
  const int8_t* xq[R];
  for (int r = 0; r < R; ++r) xq[r] = a.xq + r * a.K;
  Vf acc[R][G];
  init_acc(acc, p);
  for (int64_t s = 0; s < a.nb / 8; ++s) {
    Vf step[G][16];
    for (int g = 0; g < G; ++g) q6k_steps(p.g[g] + s * kSuperBytes, step[g], std::make_integer_sequence<int, 16>{});
    for (int j = 0; j < 8; ++j) {
      const int64_t b = s * 8 + j;  // x's block
      const uint8_t* blk[G];
      for (int g = 0; g < G; ++g) {
        blk[g] = p.g[g] + s * kSuperBytes + kHeader + j * kSubBytes;
        prefetch_ahead<6>(blk[g]);
      }
      q6k_span<Dot, 0>(acc, blk, step, a, xq, b, j);
      q6k_span<Dot, 1>(acc, blk, step, a, xq, b, j);
    }
  }
  store_acc(acc, p);
}

template <template <WBits> class D>
struct Q6KInt8Kernel {
  using Tile = Int8Tile;
  template <int R>
  static void pass(const PassArgs& p) { D<WBits::k6>::run([&] { q6k_int8_pass<D, R, Tile::kGroups>(p); }); }
};

// Column values of byte J of each lane of quad q as float32: the signed value (u - offset) for
// Q8_0 and Q4_0, u for Q4_1.
template <QFormat F, int J>
inline Vf widen(Vi q) {
  if constexpr (F == QFormat::kQ8_0) {
    // q holds u ^ 0x80 = the signed value's bytes: sign-extend byte J
    return vcvt_f(vsra_i<24>(vshl_i<24 - 8 * J>(q)));
  } else {
    const Vi u = vand_i(vshr_i<8 * J>(q), vset1_i(0xFF));
    if constexpr (F == QFormat::kQ4_0) return vcvt_f(vsub_i(u, vset1_i(8)));
    return vcvt_f(u);
  }
}

// Weight values to float32 as the file's dequantizer does: d * q (exact for Q8_0 and Q4_0), or
// d * u + m rounded once (Q4_1).
template <QFormat F>
inline Vf dequantize(Vf v, Vf d, Vf m) {
  if constexpr (F == QFormat::kQ4_1) return vfmadd(v, d, m);
  return vmul(v, d);
}

// k = k0 + J of the pass's G groups, their weights (quad values q) dequantized: acc += w * x.
template <QFormat F, int R, int G, int J>
inline void float_step(Vf (&acc)[R][G], const Vi (&q)[G], const Vf (&d)[G], const Vf (&m)[G],
                       const float* const (&x)[R], int64_t k0) {
  Vf w[G];
  for (int g = 0; g < G; ++g) w[g] = dequantize<F>(widen<F, J>(q[g]), d[g], m[g]);
  for (int r = 0; r < R; ++r) {
    const Vf xk = vset1(x[r][k0 + J]);
    for (int g = 0; g < G; ++g) acc[r][g] = vfmadd(w[g], xk, acc[r][g]);
  }
}

// R rows x G groups with float32 x: each weight dequantized in registers, times x: the products
// of a float32 model holding the dequantized weights, in another order of additions. A function
// of its own per tile: inlined into the driver, gcc compiles the one-row (decode) pass
// measurably slower.
template <QFormat F, int R, int G>
__attribute__((noinline)) void float_pass(const PassArgs& p) {
  constexpr int64_t BB = block_bytes(F), VB = value_bytes(F);
  const Activations& a = p.a;
  const float* x[R];  // the rows (one base register each, k the index)
  for (int r = 0; r < R; ++r) x[r] = a.x + r * a.K;
  Vf acc[R][G];
  init_acc(acc, p);
  for (int64_t b = 0; b < a.nb; ++b) {
    const uint8_t* blk[G];
    Vf d[G], m[G];
    for (int g = 0; g < G; ++g) {
      blk[g] = p.g[g] + b * BB;
      prefetch_ahead<kBlockLines<F>>(blk[g]);
    }
    for (int g = 0; g < G; ++g) {
      d[g] = half16(blk[g] + VB);
      m[g] = F == QFormat::kQ4_1 ? half16(blk[g] + VB + 32) : vzero();
    }
    for (int t = 0; t < 8; ++t) {
      Vi q[G];
      for (int g = 0; g < G; ++g) q[g] = quad<F>(blk[g], t);
      const int64_t k0 = b * kQBlock + 4 * t;
      float_step<F, R, G, 0>(acc, q, d, m, x, k0);
      float_step<F, R, G, 1>(acc, q, d, m, x, k0);
      float_step<F, R, G, 2>(acc, q, d, m, x, k0);
      float_step<F, R, G, 3>(acc, q, d, m, x, k0);
    }
  }
  store_acc(acc, p);
}

// The kernels a product runs: a row tile and the pass computing it.
template <QFormat F>
struct FloatKernel {
  using Tile = FloatTile;
  template <int R>
  static void pass(const PassArgs& p) { float_pass<F, R, Tile::kGroups>(p); }
};

template <template <WBits> class D, QFormat F, typename T = Int8Tile>
struct Int8Kernel {
  using Tile = T;
  template <int R>
  static void pass(const PassArgs& p) { D<bits_of(F)>::run([&] { int8_pass<D, F, R, Tile::kGroups>(p); }); }
};


// --- the int8 dot variants of this build (dot8::Int8Variants, fastest first) ---
template <template <WBits> class D>
struct VariantTag {
  template <WBits B>
  using Dot = D<B>;
};

template <template <WBits> class... D>
constexpr std::array<const char*, sizeof...(D)> variant_names(dot8::VariantList<D...>) {
  return {D<WBits::k8>::kName...};
}

template <template <WBits> class... D>
std::array<bool, sizeof...(D)> variants_running(dot8::VariantList<D...>) {
  return {D<WBits::k8>::runs()...};
}

// fn(VariantTag<D>) for the variant at `index` of the list.
template <typename Fn, template <WBits> class... D>
void with_variant(int index, dot8::VariantList<D...>, const Fn& fn) {
  int i = 0;
  ((i++ == index ? fn(VariantTag<D>{}) : void()), ...);
}

constexpr auto kVariantNames = variant_names(dot8::Int8Variants{});
constexpr int kNumVariants = static_cast<int>(kVariantNames.size());

// The variant the int8 modes run now: the forced one while it runs here (the features may be
// set anew, e.g. a module shared by two levels), else the first (fastest) that runs.
int active_variant() {
  const auto running = variants_running(dot8::Int8Variants{});
  const int forced = forced_variant.load();
  if (forced >= 0 && running[forced]) return forced;
  for (int i = 0; i < kNumVariants; ++i) {
    if (running[i]) return i;
  }
  return kNumVariants - 1;  // generic: always runs
}

inline float max_abs(const float* p, int64_t n) {
  Vf m = vzero();
  for (int64_t i = 0; i < n; i += 16) m = vmax(m, vabs(vload(p + i)));
  return vreduce_max(m);
}

// Row m of x to int8 (per 32-block scales, or one per row): round(x / d) to nearest even, clamped
// to [-127, 127] (dot_int8.h's range; max|x| / d rounds to 127 anyway), with each block's dx, sq
// and dx * sq.
void quantize_row(const float* src, int64_t K, bool per_row, int8_t* q, float* dx, int32_t* sq, float* cx) {
  float d = per_row ? max_abs(src, K) / 127.0f : 0.0f;
  const Vi lo = vset1_i(-127), hi = vset1_i(127);
  for (int64_t b = 0; b < K / kQBlock; ++b) {
    const float* s = src + b * kQBlock;
    if (!per_row) d = max_abs(s, kQBlock) / 127.0f;
    const Vf inv = vset1(d > 0.0f ? 1.0f / d : 0.0f);
    Vi sum = vzero_i();
    for (int h = 0; h < 2; ++h) {
      const Vi v = vmin_i(vmax_i(vcvt_i(vmul(vload(s + 16 * h), inv)), lo), hi);
      vstore_i8_sat(q + b * kQBlock + 16 * h, v);
      sum = vadd_i(sum, v);
    }
    sq[b] = vreduce_add_i(sum);
    dx[b] = d;
    cx[b] = d * static_cast<float>(sq[b]);
  }
}

template <QFormat F>
void run_format(const Activations& act, QMode mode, int variant, int64_t M, const uint8_t* w, int64_t groups,
                float* out, int64_t ld_out, const float* residual, int64_t ld_res, const float* bias) {
  if (mode == QMode::kFloat) {
    return run<FloatKernel<F>>(act, M, w, groups, act.nb * block_bytes(F), out, ld_out, residual, ld_res, bias);
  }
  with_variant(variant, dot8::Int8Variants{}, [&](auto tag) {
    using Tag = decltype(tag);
    const int64_t group_bytes = act.nb * block_bytes(F);
    if constexpr (!std::is_same_v<Int8NarrowTile, Int8Tile>) {
      if (M <= Int8NarrowTile::kRows) {
        return run<Int8Kernel<Tag::template Dot, F, Int8NarrowTile>>(act, M, w, groups, group_bytes, out, ld_out,
                                                                      residual, ld_res, bias);
      }
    }
    run<Int8Kernel<Tag::template Dot, F>>(act, M, w, groups, group_bytes, out, ld_out, residual, ld_res, bias);
  });
}

}  // namespace

int64_t q_block_bytes(QFormat format) { return is_kquant(format) ? kq_block_bytes(format) : block_bytes(format); }

int64_t q_block_k(QFormat format) { return is_kquant(format) ? kKSuper : kQBlock; }

QFormat q_format_of(int64_t bytes) {
  for (QFormat f : {QFormat::kQ8_0, QFormat::kQ4_0, QFormat::kQ4_1, QFormat::kQ4_K, QFormat::kQ5_K, QFormat::kQ6_K}) {
    if (q_block_bytes(f) == bytes) return f;
  }
  throw std::runtime_error("no quantized format has " + std::to_string(bytes) +
                           "-byte blocks (Q8_0 544, Q4_0 288, Q4_1 320, Q4_K 2304, Q5_K 2816, Q6_K 3360)");
}

bool cpu_has_vnni() { return cpu_has(kAvx512Vnni); }

int64_t num_vnni_calls() { return int8_calls.load(); }

std::vector<std::string> int8_variants() {
  const auto running = variants_running(dot8::Int8Variants{});
  std::vector<std::string> names;
  for (int i = 0; i < kNumVariants; ++i) {
    if (running[i]) names.emplace_back(kVariantNames[i]);
  }
  return names;
}

std::string int8_variant() { return kVariantNames[active_variant()]; }

void set_int8_variant(const std::string& name) {
  if (name.empty()) {
    forced_variant.store(-1);
    return;
  }
  const auto running = variants_running(dot8::Int8Variants{});
  for (int i = 0; i < kNumVariants; ++i) {
    if (name == kVariantNames[i]) {
      check(running[i], "the int8 dot variant " + name + " does not run on this CPU (at this ISA level)");
      forced_variant.store(i);
      return;
    }
  }
  std::string known;
  for (const char* n : kVariantNames) known += std::string(known.empty() ? "" : ", ") + n;
  throw std::runtime_error("unknown int8 dot variant " + name + " for the " RADIXLM_SIMD_NAME " build (it has: " +
                           known + ")");
}

// d * (u - offset) is exact in float32 (an 11-bit float16 significand times at most 8 bits), so
// Q4_1's + m rounds once whether or not the compiler fuses it: GGUF's value either way.
void q_columns(const uint8_t* w, int64_t groups, int64_t nb, QFormat format, const int64_t* cols, int64_t T,
               float* out) {
  for (int64_t t = 0; t < T; ++t) {
    check(cols[t] >= 0 && cols[t] < groups * kQGroup, "column " + std::to_string(cols[t]) + " is out of range [0, " +
                                                          std::to_string(groups * kQGroup) + ")");
  }
  if (is_kquant(format)) return kq_columns(w, groups, nb, format, cols, T, out);
  const int64_t BB = block_bytes(format), VB = value_bytes(format);
  const int32_t offset = offset_of(format);
  parallel_for(0, T, 64, [&](int64_t first, int64_t last) {
    for (int64_t t = first; t < last; ++t) {
      const int64_t g = cols[t] / kQGroup, c = cols[t] % kQGroup;
      float* row = out + t * nb * kQBlock;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = w + (g * nb + b) * BB;
        float d[16], m[16];
        vstore(d, half16(blk + VB));
        vstore(m, format == QFormat::kQ4_1 ? half16(blk + VB + 32) : vzero());
        for (int k = 0; k < kQBlock; ++k) {
          const int quad = k / 4, j = k % 4;
          int32_t u;
          if (format == QFormat::kQ8_0) {
            u = blk[quad * 64 + 4 * c + j];
          } else {
            const uint8_t byte = blk[(quad / 2) * 64 + 4 * c + j];
            u = quad % 2 == 0 ? byte & 0x0F : byte >> 4;
          }
          float v = d[c] * static_cast<float>(u - offset);
          if (format == QFormat::kQ4_1) v = v + m[c];
          row[b * kQBlock + k] = v;
        }
      }
    }
  });
}

bool q_reads_int8(QFormat format, QMode mode) {
  return mode != QMode::kFloat && format != QFormat::kQ5_K;
}

void QuantizedXBuffer::resize(int64_t M, int64_t K) {
  xq.resize(M * K);
  dx.resize(M * (K / kQBlock));
  cx.resize(M * (K / kQBlock));
  sq.resize(M * (K / kQBlock));
}

void q_quantize_x(const float* x, int64_t M, int64_t K, QMode mode, QuantizedXBuffer& out) {
  check(mode != QMode::kFloat, "q_quantize_x takes an int8 mode");
  check(K % kQBlock == 0, "a quantized product's K must be a multiple of 32, got " + std::to_string(K));
  const int64_t nb = K / kQBlock;
  out.resize(M, K);
  parallel_for(0, M, 64, [&](int64_t first, int64_t last) {
    for (int64_t m = first; m < last; ++m) {
      quantize_row(x + m * K, K, mode == QMode::kInt8Row, out.xq.data() + m * K, out.dx.data() + m * nb,
                   out.sq.data() + m * nb, out.cx.data() + m * nb);
    }
  });
}

void q_quantize_blocks(const float* src, int64_t n, int8_t* q, float* dx, int32_t* sq, float* cx) {
  check(n % kQBlock == 0, "q_quantize_blocks takes whole 32-blocks, got " + std::to_string(n) + " values");
  quantize_row(src, n, false, q, dx, sq, cx);
}

void q_gemm(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t groups, QFormat format, QMode mode,
            float* out, int64_t ld_out, const float* residual, int64_t ld_res, const float* bias,
            const QuantizedX* quantized) {
  if (is_kquant(format) && !q_reads_int8(format, mode)) {
    return kq_gemm(x, M, K, w, groups, format, out, ld_out, residual, ld_res, bias);
  }
  check(!is_kquant(format) || K % kKSuper == 0, "a K-quant product's K must be a multiple of 256, got " + std::to_string(K));
  check(K % kQBlock == 0, "a quantized product's K must be a multiple of 32, got " + std::to_string(K));
  check(groups % 2 == 0, "quant groups come in pairs (N padded to a multiple of 64)");
  if (M == 0 || groups == 0) return;
  if (q4k_row_takes(format, mode, M)) {  // one row of Q4_K: the same bits, one stream a thread
    int8_calls.fetch_add(1);
    return q4k_int8_row_parallel(x, K, w, groups, mode, out, residual, bias, quantized);
  }
  Activations act;
  act.x = x;
  act.K = K;
  act.nb = K / kQBlock;
  QuantizedXBuffer own;
  const int variant = active_variant();
  if (mode != QMode::kFloat) {
    QuantizedX q;
    if (quantized) {
      q = *quantized;
    } else {
      q_quantize_x(x, M, K, mode, own);
      q = own.view();
    }
    act.xq = q.xq;
    act.dx = q.dx;
    act.sq = q.sq;
    act.cx = q.cx;
    int8_calls.fetch_add(1);
  }
  switch (format) {
    case QFormat::kQ8_0: run_format<QFormat::kQ8_0>(act, mode, variant, M, w, groups, out, ld_out, residual, ld_res, bias); break;
    case QFormat::kQ4_0: run_format<QFormat::kQ4_0>(act, mode, variant, M, w, groups, out, ld_out, residual, ld_res, bias); break;
    case QFormat::kQ4_1: run_format<QFormat::kQ4_1>(act, mode, variant, M, w, groups, out, ld_out, residual, ld_res, bias); break;
    case QFormat::kQ4_K:
      with_variant(variant, dot8::Int8Variants{}, [&](auto tag) {
        using Tag = decltype(tag);
        run<Q4KInt8Kernel<Tag::template Dot>>(act, M, w, groups, (K / kKSuper) * kq_block_bytes(format), out, ld_out,
                                               residual, ld_res, bias);
      });
      break;
    case QFormat::kQ6_K:
      with_variant(variant, dot8::Int8Variants{}, [&](auto tag) {
        using Tag = decltype(tag);
        run<Q6KInt8Kernel<Tag::template Dot>>(act, M, w, groups, (K / kKSuper) * kq_block_bytes(format), out, ld_out,
                                               residual, ld_res, bias);
      });
      break;
    default: break;  // Q5_K: kq_gemm above
  }
}

}  // namespace radixlm
