// The vector layer's backend for the level this file is compiled at (simd/vec.h picks it) checked
// against vec_generic.h, the definition: every op on random and special inputs (NaN, +-inf, +-0,
// subnormals, ties, int limits), bit for bit, but for
//   vreduce_add            summation order: within 1e-6 of the sum of |lanes|
//   vfmadd/vfnmadd/vfmsub  one rounding: against std::fma (at the generic level: the definition)
//   NaN results of arithmetic  any NaN (which NaN two NaN operands give differs between ISAs)
//   vcvt_i                 in-range inputs only (out of range is unspecified)
// The _n ops run for every n in 0..16 (and out-of-range n), with guard values around the buffer
// and with the buffer ending at a PROT_NONE page, so a read or write past n faults. exp16 (simd/
// math.h) is checked against std::exp. No torch: tests/kernels/test_vec_layer.py builds it per
// level and runs it, on x86 natively and for aarch64 under qemu:
//   g++ -std=c++17 -O2 -I kernels/csrc [-mavx2 -mfma -mf16c | -mavx512f -mavx512bw |
//       -DRADIXLM_ISA_GENERIC] tests/kernels/csrc/test_vec.cpp -o test_vec && ./test_vec
// Exit 0 with "vec <level>: N checks passed"; else the first mismatches and exit 1.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include "simd/math.h"  // includes simd/vec.h: the backend under test, radixlm::simd
#include "driver_util.h"

#if defined(RADIXLM_SIMD_GENERIC)
// vec.h has included vec_generic.h (its #pragma once would skip a second copy): the reference is
// the same code, and the run still catches crashes and the _n ops' memory accesses.
namespace ref::radixlm {
namespace simd = ::radixlm::simd;
}
#else
// The definition, as ref::radixlm::simd. Its own #includes are std headers already included
// above, so they add nothing inside the namespace; Mask comes from vec.h in the real layer.
namespace ref::radixlm::simd {
using Mask = uint16_t;
}
namespace ref {
#include "simd/vec_generic.h"
}
#endif

namespace T = radixlm::simd;
namespace R = ref::radixlm::simd;

namespace {

long g_checks = 0, g_failures = 0;
const char* volatile g_section = "start";  // named in the report if an op faults

void on_fault(int) {
  const char* parts[] = {"FAULT in ", g_section, " (an access past the n elements?)\n"};
  for (const char* t : parts) if (write(1, t, std::strlen(t)) < 0) break;
  _exit(3);
}

uint32_t bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
float from_bits(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// failures per op (names are string literals, so compared by address and then text)
struct OpFailures { const char* op; long n; } g_by_op[64];
int g_ops_failed = 0;

bool fail_header(const char* op) {
  ++g_failures;
  int k = 0;
  while (k < g_ops_failed && std::strcmp(g_by_op[k].op, op) != 0) ++k;
  if (k == g_ops_failed && k < 64) g_by_op[g_ops_failed++] = {op, 0};
  if (k < 64) ++g_by_op[k].n;
  if (g_failures > 12) return false;
  std::printf("MISMATCH %s:", op);
  return true;
}

using driver::Rng;

const uint32_t kSpecialFloats[] = {
    0x00000000, 0x80000000, 0x7F800000, 0xFF800000,              // +-0, +-inf
    0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFA00000, 0x7FC12345,  // quiet / signaling NaNs
    0x00000001, 0x007FFFFF, 0x80000001, 0x00800000, 0x80800000,  // subnormals, FLT_MIN
    0x7F7FFFFF, 0xFF7FFFFF, 0x3F800000, 0xBF800000,              // +-FLT_MAX, +-1
    0x3F000000, 0xBF000000, 0x3FC00000, 0x40200000, 0xC0200000,  // ties: +-0.5, 1.5, +-2.5
    0x40600000, 0x4AFFFFFF, 0x4B000000, 0x4B800000,              // 3.5, 8388607.5, 2^23, 2^24
    0x4EFFFFFF, 0xCF000000, 0x4F000000, 0xCF000001,              // near the int32 limits
    0x3F808000, 0x3F818000, 0x3F807FFF, 0x7F7F8000, 0x7F7FFFFF,  // bf16 ties, overflow to inf
};
const int32_t kSpecialInts[] = {0, 1, -1, 127, 128, -128, -129, 255, 256, 32767, 32768, -32768, -32769,
                                65535, 65536, INT32_MAX, INT32_MIN, INT32_MAX - 1, INT32_MIN + 1, 16777217};

float gen_float(Rng& g) {
  switch (g.below(8)) {
    case 0: case 1: return from_bits(kSpecialFloats[g.below(sizeof kSpecialFloats / 4)]);
    case 2: case 3: return from_bits(g.u32());                                  // any bits
    case 4: return static_cast<float>(std::round(g.uniform(-40, 40) * 2) / 2);  // many ties
    default: return static_cast<float>(g.uniform(-1000, 1000));
  }
}
int32_t gen_int(Rng& g) {
  switch (g.below(4)) {
    case 0: return kSpecialInts[g.below(sizeof kSpecialInts / 4)];
    case 1: return g.below(600) - 300;
    default: return static_cast<int32_t>(g.u32());
  }
}
void fill(Rng& g, float* a) { for (int i = 0; i < 16; ++i) a[i] = gen_float(g); }
void fill_i(Rng& g, int32_t* a) { for (int i = 0; i < 16; ++i) a[i] = gen_int(g); }
// b related to a in some lanes (equal, negated, +0 against -0), to reach ties and zero signs
void fill_pair(Rng& g, float* a, float* b) {
  for (int i = 0; i < 16; ++i) {
    const int k = g.below(8);
    if (k == 2) a[i] = g.below(2) ? 0.0f : -0.0f;
    b[i] = k == 0 ? a[i] : k == 1 || k == 2 ? -a[i] : gen_float(g);
  }
}

enum Cmp { kExact, kNanAny };  // kNanAny: equal bits, or NaN both

void cmp_f(const char* op, const float* got, const float* want, Cmp mode, const float* a = nullptr, const float* b = nullptr,
           const float* c = nullptr) {
  ++g_checks;
  for (int i = 0; i < 16; ++i) {
    if (bits(got[i]) == bits(want[i]) || (mode == kNanAny && std::isnan(got[i]) && std::isnan(want[i]))) continue;
    if (fail_header(op)) {
      std::printf(" lane %d got %08x (%g) want %08x (%g)", i, bits(got[i]), got[i], bits(want[i]), want[i]);
      for (const float* x : {a, b, c}) if (x) std::printf(" in %08x (%g)", bits(x[i]), x[i]);
      std::printf("\n");
    }
    return;
  }
}
void cmp_bytes(const char* op, const void* got, const void* want, size_t n, const char* what = "") {
  ++g_checks;
  const uint8_t *g = static_cast<const uint8_t*>(got), *w = static_cast<const uint8_t*>(want);
  for (size_t i = 0; i < n; ++i) {
    if (g[i] == w[i]) continue;
    if (fail_header(op)) std::printf(" %s byte %zu got %02x want %02x\n", what, i, g[i], w[i]);
    return;
  }
}
void cmp_scalar(const char* op, long got, long want, const char* what = "") {
  ++g_checks;
  if (got != want && fail_header(op)) std::printf(" %s got %lx want %lx\n", what, got, want);
}

// Runs op on the backend and on the definition with the same float inputs (a, b, c) and compares.
#define CHECK_F1(op, mode) { float g_[16], w_[16]; T::vstore(g_, T::op(T::vload(a))); R::vstore(w_, R::op(R::vload(a))); cmp_f(#op, g_, w_, mode, a); }
#define CHECK_F2(op, mode) { float g_[16], w_[16]; T::vstore(g_, T::op(T::vload(a), T::vload(b))); \
  R::vstore(w_, R::op(R::vload(a), R::vload(b))); cmp_f(#op, g_, w_, mode, a, b); }
#define CHECK_I1(op) { int32_t g_[16], w_[16]; T::vstore_i(g_, T::op(T::vload_i(x))); R::vstore_i(w_, R::op(R::vload_i(x))); cmp_bytes(#op, g_, w_, 64); }
#define CHECK_I2(op) { int32_t g_[16], w_[16]; T::vstore_i(g_, T::op(T::vload_i(x), T::vload_i(y))); \
  R::vstore_i(w_, R::op(R::vload_i(x), R::vload_i(y))); cmp_bytes(#op, g_, w_, 64); }

void check_float_ops(Rng& g) {
  g_section = "float ops";
  for (int round = 0; round < 10000; ++round) {
    float a[16], b[16], c[16];
    fill(g, a);
    fill_pair(g, a, b);
    fill(g, c);
    CHECK_F2(vadd, kNanAny) CHECK_F2(vsub, kNanAny) CHECK_F2(vmul, kNanAny) CHECK_F2(vdiv, kNanAny)
    CHECK_F2(vmax, kExact) CHECK_F2(vmin, kExact) CHECK_F1(vabs, kExact) CHECK_F1(vround, kNanAny)
    { float g_[16], w_[16]; T::vstore(g_, T::vload(a)); std::memcpy(w_, a, 64); cmp_f("vload/vstore", g_, w_, kExact, a); }
    { float g_[16], w_[16]; T::vstore(g_, T::vset1(a[0])); R::vstore(w_, R::vset1(a[0])); cmp_f("vset1", g_, w_, kExact, a); }
    { float g_[16], w_[16]; T::vstore(g_, T::vzero()); R::vstore(w_, R::vzero()); cmp_f("vzero", g_, w_, kExact); }
    // one rounding: std::fma (the definition rounds twice, so it is the reference only at its own level)
    float fg[3][16], fw[3][16];
    T::vstore(fg[0], T::vfmadd(T::vload(a), T::vload(b), T::vload(c)));
    T::vstore(fg[1], T::vfnmadd(T::vload(a), T::vload(b), T::vload(c)));
    T::vstore(fg[2], T::vfmsub(T::vload(a), T::vload(b), T::vload(c)));
#if defined(RADIXLM_SIMD_GENERIC)
    R::vstore(fw[0], R::vfmadd(R::vload(a), R::vload(b), R::vload(c)));
    R::vstore(fw[1], R::vfnmadd(R::vload(a), R::vload(b), R::vload(c)));
    R::vstore(fw[2], R::vfmsub(R::vload(a), R::vload(b), R::vload(c)));
#else
    for (int i = 0; i < 16; ++i) fw[0][i] = std::fma(a[i], b[i], c[i]), fw[1][i] = std::fma(-a[i], b[i], c[i]), fw[2][i] = std::fma(a[i], b[i], -c[i]);
#endif
    cmp_f("vfmadd", fg[0], fw[0], kNanAny, a, b, c);
    cmp_f("vfnmadd", fg[1], fw[1], kNanAny, a, b, c);
    cmp_f("vfmsub", fg[2], fw[2], kNanAny, a, b, c);
    // p * 2^n for integral n in [-150, 128]: every p, n at the ends of the range often
    float n[16];
    for (int i = 0; i < 16; ++i) n[i] = static_cast<float>(g.below(4) == 0 ? (g.below(2) ? -150 + g.below(30) : 100 + g.below(29)) : g.below(279) - 150);
    { float g_[16], w_[16]; T::vstore(g_, T::vscale2(T::vload(a), T::vload(n))); R::vstore(w_, R::vscale2(R::vload(a), R::vload(n))); cmp_f("vscale2", g_, w_, kNanAny, a, n); }
    // and p tiny or subnormal, n in [-30, 0]: results rounded in the subnormal range (once)
    float t[16];
    for (int i = 0; i < 16; ++i) t[i] = from_bits((g.u32() & 0x80FFFFFFu) % 0x0F000000u), n[i] = static_cast<float>(-g.below(31));
    { float g_[16], w_[16]; T::vstore(g_, T::vscale2(T::vload(t), T::vload(n))); R::vstore(w_, R::vscale2(R::vload(t), R::vload(n))); cmp_f("vscale2 (subnormal results)", g_, w_, kNanAny, t, n); }
    // masks
    const uint16_t m = static_cast<uint16_t>(g.u32());
    cmp_scalar("vcmp_gt", T::vcmp_gt(T::vload(a), T::vload(b)), R::vcmp_gt(R::vload(a), R::vload(b)));
    cmp_scalar("vcmp_nan", T::vcmp_nan(T::vload(a)), R::vcmp_nan(R::vload(a)));
    { float g_[16], w_[16]; T::vstore(g_, T::vselect(m, T::vload(a), T::vload(b))); R::vstore(w_, R::vselect(m, R::vload(a), R::vload(b))); cmp_f("vselect", g_, w_, kExact, a, b); }
    { float g_[16], w_[16]; T::vstore(g_, T::vmaskz(m, T::vload(a))); R::vstore(w_, R::vmaskz(m, R::vload(a))); cmp_f("vmaskz", g_, w_, kExact, a); }
    { float g_[16], w_[16]; T::vstore(g_, T::vmask_max(T::vload(c), m, T::vload(a), T::vload(b)));
      R::vstore(w_, R::vmask_max(R::vload(c), m, R::vload(a), R::vload(b))); cmp_f("vmask_max", g_, w_, kExact, a, b, c); }
    // vreduce_max: exactly; lanes often +-0, -1 or NaN so that ties, zero signs and NaN positions matter
    float z[16];
    for (int i = 0; i < 16; ++i) { const int k = g.below(6); z[i] = k == 0 ? 0.0f : k == 1 ? -0.0f : k == 2 ? -1.0f : k == 3 ? from_bits(0x7FC00000u + g.below(4)) : a[i]; }
    for (const float* v : {a, z}) {
      const float got = T::vreduce_max(T::vload(v)), want = R::vreduce_max(R::vload(v));
      cmp_scalar("vreduce_max", bits(got), bits(want));
    }
    // vreduce_add: finite lanes, any order of the sum: within 1e-6 of the sum of |lanes|
    float s[16];
    double abs_sum = 0;
    for (int i = 0; i < 16; ++i) s[i] = std::isfinite(a[i]) && std::fabs(a[i]) < 1e30f ? a[i] : c[i] * 1e-3f, abs_sum += std::fabs(double(s[i]));
    if (!std::isfinite(abs_sum)) continue;
    const float got = T::vreduce_add(T::vload(s)), want = R::vreduce_add(R::vload(s));
    ++g_checks;
    if (!(std::fabs(double(got) - double(want)) <= 1e-6 * abs_sum) && fail_header("vreduce_add")) std::printf(" got %g want %g\n", got, want);
  }
  // vreduce_add with inf / NaN lanes: the same NaN-ness and infinity
  for (int round = 0; round < 500; ++round) {
    float a[16];
    for (int i = 0; i < 16; ++i) { const int k = g.below(5); a[i] = k == 0 ? INFINITY : k == 1 ? -INFINITY : k == 2 ? NAN : 1.0f; }
    const float got = T::vreduce_add(T::vload(a)), want = R::vreduce_add(R::vload(a));
    cmp_scalar("vreduce_add special", std::isnan(got) ? 1 : bits(got), std::isnan(want) ? 1 : bits(want));
  }
}

void check_int_ops(Rng& g) {
  g_section = "int ops";
  for (int round = 0; round < 10000; ++round) {
    int32_t x[16], y[16];
    fill_i(g, x);
    fill_i(g, y);
    for (int i = 0; i < 16; ++i) if (g.below(6) == 0) y[i] = x[i];
    CHECK_I2(vadd_i) CHECK_I2(vsub_i) CHECK_I2(vand_i) CHECK_I2(vor_i) CHECK_I2(vxor_i) CHECK_I2(vmin_i) CHECK_I2(vmax_i)
    CHECK_I1(vshl_i<0>) CHECK_I1(vshl_i<1>) CHECK_I1(vshl_i<7>) CHECK_I1(vshl_i<16>) CHECK_I1(vshl_i<31>)
    CHECK_I1(vshr_i<0>) CHECK_I1(vshr_i<1>) CHECK_I1(vshr_i<8>) CHECK_I1(vshr_i<16>) CHECK_I1(vshr_i<31>)
    CHECK_I1(vsra_i<0>) CHECK_I1(vsra_i<1>) CHECK_I1(vsra_i<9>) CHECK_I1(vsra_i<16>) CHECK_I1(vsra_i<31>)
    { int32_t g_[16], w_[16]; T::vstore_i(g_, T::vset1_i(x[0])); R::vstore_i(w_, R::vset1_i(x[0])); cmp_bytes("vset1_i", g_, w_, 64); }
    { int32_t g_[16], w_[16]; T::vstore_i(g_, T::vzero_i()); R::vstore_i(w_, R::vzero_i()); cmp_bytes("vzero_i", g_, w_, 64); }
    cmp_scalar("vcmp_le_i", T::vcmp_le_i(T::vload_i(x), T::vload_i(y)), R::vcmp_le_i(R::vload_i(x), R::vload_i(y)));
    cmp_scalar("vreduce_add_i", T::vreduce_add_i(T::vload_i(x)), R::vreduce_add_i(R::vload_i(x)));
    { float g_[16]; T::vstore(g_, T::vcast_f(T::vload_i(x))); cmp_bytes("vcast_f", g_, x, 64); }
    { int32_t g_[16]; T::vstore_i(g_, T::vcast_i(T::vload(reinterpret_cast<const float*>(x)))); cmp_bytes("vcast_i", g_, x, 64); }
    { float g_[16], w_[16]; T::vstore(g_, T::vcvt_f(T::vload_i(x))); R::vstore(w_, R::vcvt_f(R::vload_i(x))); cmp_f("vcvt_f", g_, w_, kExact); }
    // vcvt_i: in range only (rounded into [-2^31, 2^31)); out-of-range lanes replaced
    float f[16];
    for (int i = 0; i < 16; ++i) {
      f[i] = gen_float(g);
      if (!(std::nearbyint(f[i]) >= -2147483648.0f && std::nearbyint(f[i]) < 2147483648.0f)) f[i] = static_cast<float>(x[i] / 2);  // |x / 2| <= 2^30
    }
    { int32_t g_[16], w_[16]; T::vstore_i(g_, T::vcvt_i(T::vload(f))); R::vstore_i(w_, R::vcvt_i(R::vload(f))); cmp_bytes("vcvt_i", g_, w_, 64); }
    // widening loads and the saturating narrow store
    uint8_t raw[32];
    for (int i = 0; i < 32; ++i) raw[i] = static_cast<uint8_t>(g.u32());
    { int32_t g_[16], w_[16]; T::vstore_i(g_, T::vload_i8(reinterpret_cast<int8_t*>(raw))); R::vstore_i(w_, R::vload_i8(reinterpret_cast<int8_t*>(raw))); cmp_bytes("vload_i8", g_, w_, 64); }
    { int32_t g_[16], w_[16]; T::vstore_i(g_, T::vload_u8(raw)); R::vstore_i(w_, R::vload_u8(raw)); cmp_bytes("vload_u8", g_, w_, 64); }
    { uint16_t h[16]; std::memcpy(h, raw, 32); int32_t g_[16], w_[16]; T::vstore_i(g_, T::vload_u16(h)); R::vstore_i(w_, R::vload_u16(h)); cmp_bytes("vload_u16", g_, w_, 64); }
    { int8_t g_[16], w_[16]; T::vstore_i8_sat(g_, T::vload_i(x)); R::vstore_i8_sat(w_, R::vload_i(x)); cmp_bytes("vstore_i8_sat", g_, w_, 16); }
    // bfloat16
    { float g_[16], w_[16]; T::vstore(g_, T::vbf16_low(T::vload_i(x))); R::vstore(w_, R::vbf16_low(R::vload_i(x))); cmp_f("vbf16_low", g_, w_, kExact); }
    { float g_[16], w_[16]; T::vstore(g_, T::vbf16_high(T::vload_i(x))); R::vstore(w_, R::vbf16_high(R::vload_i(x))); cmp_f("vbf16_high", g_, w_, kExact); }
    { int32_t g_[16], w_[16]; T::vstore_i(g_, T::vto_bf16_bits(T::vload(f))); R::vstore_i(w_, R::vto_bf16_bits(R::vload(f))); cmp_bytes("vto_bf16_bits", g_, w_, 64); }
    float a[16], b[16];
    fill(g, a);
    fill(g, b);
    { int32_t g_[16], w_[16]; T::vstore_i(g_, T::vto_bf16_bits(T::vload(a))); R::vstore_i(w_, R::vto_bf16_bits(R::vload(a))); cmp_bytes("vto_bf16_bits", g_, w_, 64); }
    { int32_t g_[16], w_[16]; T::vstore_i(g_, T::vpack_bf16_pairs(T::vload(a), T::vload(b))); R::vstore_i(w_, R::vpack_bf16_pairs(R::vload(a), R::vload(b))); cmp_bytes("vpack_bf16_pairs", g_, w_, 64); }
    { uint16_t g_[16], w_[16]; T::vstore_bf16(g_, T::vload(a)); R::vstore_bf16(w_, R::vload(a)); cmp_bytes("vstore_bf16", g_, w_, 32); }
    { uint16_t h[16]; std::memcpy(h, raw, 32); float g_[16], w_[16]; T::vstore(g_, T::vload_bf16(h)); R::vstore(w_, R::vload_bf16(h)); cmp_f("vload_bf16", g_, w_, kExact); }
  }
  // vload_f16: every half value
  for (uint32_t base = 0; base < 65536; base += 16) {
    uint16_t h[16];
    for (int i = 0; i < 16; ++i) h[i] = static_cast<uint16_t>(base + i);
    float g_[16], w_[16];
    T::vstore(g_, T::vload_f16(h));
    R::vstore(w_, R::vload_f16(h));
    cmp_f("vload_f16", g_, w_, kExact);
  }
}

// The page after g_page_end is PROT_NONE: a buffer ending there faults on any access past its end.
char* g_page_end = nullptr;

void check_tail_ops(Rng& g) {
  const int64_t ns[] = {-3, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 100};
  const uint32_t kGuard = 0x7F8ABCDEu;  // a signaling NaN pattern, in the guard words around a buffer
  for (const int64_t n : ns) {
    const int k = n < 0 ? 0 : n > 16 ? 16 : static_cast<int>(n);
    for (int rep = 0; rep < 40; ++rep) {
      float src[16], buf[32], want[16], got[16];
      fill(g, src);
      fill(g, buf);
      fill(g, buf + 16);
      std::memcpy(buf + 8, src, 64);
      // vload_n: lanes [0, n) from p, the others 0 (the buffer beyond n holds other values)
      R::vstore(want, R::vload_n(buf + 8, n));
      T::vstore(got, T::vload_n(buf + 8, n));
      cmp_f("vload_n", got, want, kExact, src);
      float* end = reinterpret_cast<float*>(g_page_end) - k;
      std::memcpy(end, src, sizeof(float) * k);
      g_section = "vload_n at a page end";
      T::vstore(got, T::vload_n(end, n));
      cmp_f("vload_n at a page end", got, want, kExact, src);
      // vstore_n: p[0, n) written, the guard words around them not
      uint32_t wbuf[32], gbuf[32];
      for (uint32_t& w : gbuf) w = kGuard;
      std::memcpy(wbuf, gbuf, sizeof gbuf);
      std::memcpy(wbuf + 8, src, sizeof(float) * k);
      T::vstore_n(reinterpret_cast<float*>(gbuf) + 8, T::vload(src), n);
      cmp_bytes("vstore_n", gbuf, wbuf, sizeof gbuf, "buffer");
      g_section = "vstore_n at a page end";
      T::vstore_n(end, T::vload(src), n);
      cmp_bytes("vstore_n at a page end", end, src, sizeof(float) * k);
      // the same for bfloat16
      uint16_t h[32], hwant[16];
      for (uint16_t& x : h) x = static_cast<uint16_t>(g.u32());
      R::vstore(want, R::vload_bf16_n(h + 8, n));
      T::vstore(got, T::vload_bf16_n(h + 8, n));
      cmp_f("vload_bf16_n", got, want, kExact);
      uint16_t* hend = reinterpret_cast<uint16_t*>(g_page_end) - k;
      std::memcpy(hend, h + 8, 2 * k);
      g_section = "vload_bf16_n at a page end";
      T::vstore(got, T::vload_bf16_n(hend, n));
      cmp_f("vload_bf16_n at a page end", got, want, kExact);
      R::vstore_bf16(hwant, R::vload(src));
      uint16_t hg[32], hw[32];
      for (int i = 0; i < 32; ++i) hg[i] = hw[i] = static_cast<uint16_t>(kGuard);
      std::memcpy(hw + 8, hwant, 2 * k);
      T::vstore_bf16_n(hg + 8, T::vload(src), n);
      cmp_bytes("vstore_bf16_n", hg, hw, sizeof hg, "buffer");
      g_section = "vstore_bf16_n at a page end";
      T::vstore_bf16_n(hend, T::vload(src), n);
      cmp_bytes("vstore_bf16_n at a page end", hend, hwant, 2 * k);
    }
  }
}

void check_transpose(Rng& g) {
  g_section = "transpose16";
  for (int round = 0; round < 200; ++round) {
    float m[16][16], got[16][16], want[16][16];
    for (auto& row : m) fill(g, row);
    T::Vf r[16];
    R::Vf q[16];
    for (int i = 0; i < 16; ++i) r[i] = T::vload(m[i]), q[i] = R::vload(m[i]);
    T::transpose16(r);
    R::transpose16(q);
    for (int i = 0; i < 16; ++i) T::vstore(got[i], r[i]), R::vstore(want[i], q[i]);
    for (int i = 0; i < 16; ++i) cmp_f("transpose16", got[i], want[i], kExact);
    for (int i = 0; i < 16; ++i) for (int j = 0; j < 16; ++j) want[i][j] = m[j][i];
    for (int i = 0; i < 16; ++i) cmp_f("transpose16 (direct)", got[i], want[i], kExact);
  }
}

// exp16 / exp16_coarse against std::exp over [-100, 88]: relative error under `rel`, plus half the
// smallest subnormal where the result is subnormal (its rounding there)
void check_exp(Rng& g) {
  g_section = "exp16";
  struct Case { const char* name; radixlm::Vf (*f)(radixlm::Vf); double rel; } cases[] = {
      {"exp16", radixlm::exp16, 1e-6}, {"exp16_coarse", radixlm::exp16_coarse, 1e-5}};
  for (const Case& cs : cases) {
    double worst = 0;
    for (int round = 0; round < 20000; ++round) {
      float x[16], y[16];
      for (int i = 0; i < 16; ++i)  // a grid over the range, then random points
        x[i] = static_cast<float>(round < 2000 ? -100.0 + 188.0 * (16 * round + i) / 32000.0 : g.uniform(-100, 88));
      T::vstore(y, cs.f(T::vload(x)));
      ++g_checks;
      for (int i = 0; i < 16; ++i) {
        const double e = std::exp(static_cast<double>(x[i])), err = std::fabs(y[i] - e);
        if (e >= 0x1p-126) worst = std::fmax(worst, err / e);
        if (err <= cs.rel * e + 0x1p-150) continue;
        if (fail_header(cs.name)) std::printf(" x %.9g got %.9g want %.9g (relative error %.3g)\n", x[i], y[i], e, err / e);
        break;
      }
    }
    std::printf("%s: worst relative error %.3g over [-100, 88] (normal results)\n", cs.name, worst);
  }
}

}  // namespace

int main() {
  const long page = sysconf(_SC_PAGESIZE);
  char* map = static_cast<char*>(mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (map == MAP_FAILED || mprotect(map + page, page, PROT_NONE) != 0) {
    std::printf("cannot map a guard page\n");
    return 2;
  }
  g_page_end = map + page;
  signal(SIGSEGV, on_fault);
  signal(SIGBUS, on_fault);
  Rng g{20240611};
  check_float_ops(g);
  check_int_ops(g);
  check_tail_ops(g);
  check_transpose(g);
  check_exp(g);
  if (g_failures) {
    for (int k = 0; k < g_ops_failed; ++k) std::printf("  %s: %ld failed\n", g_by_op[k].op, g_by_op[k].n);
    std::printf("vec %s: %ld of %ld checks FAILED\n", RADIXLM_SIMD_NAME, g_failures, g_checks);
    return 1;
  }
  std::printf("vec %s: %ld checks passed\n", RADIXLM_SIMD_NAME, g_checks);
  return 0;
}
