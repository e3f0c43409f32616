// Row-wise ops of a prefill or extend step, fused and vectorized: RMSNorm and SiLU(gate) * up over
// [T, width] float32 or bfloat16 tensors (bf16 read and written, arithmetic in float32, one
// rounding at the end). torch's bf16 versions take several passes with a float32 copy in between
// (rms_norm: upcast, pow, mean, rsqrt, mul, downcast; silu then mul: two roundings); at prefill
// sizes (2,000 x 576) they were ~25% and ~13% of a bf16 prefill.
//
// Torch-free (rows.h); the torch entry points are bindings/torch_rows.cpp.
#include "kernels/rows.h"

#include <cmath>
#include <cstdint>

#include "kernels/parallel.h"
#include "simd/math.h"

namespace radixlm {
namespace {

using namespace simd;

// 16 values (load / store), or the first n < 16 of them (load_n / store_n: nothing past them is
// read or written; the other lanes load as 0), as float32; bf16 is stored rounded to nearest
// even, NaN kept.
inline Vf load(const float* p) { return vload(p); }
inline Vf load(const uint16_t* p) { return vload_bf16(p); }
inline Vf load_n(const float* p, int64_t n) { return vload_n(p, n); }
inline Vf load_n(const uint16_t* p, int64_t n) { return vload_bf16_n(p, n); }
inline void store(float* p, Vf v) { vstore(p, v); }
inline void store(uint16_t* p, Vf v) { vstore_bf16(p, v); }
inline void store_n(float* p, Vf v, int64_t n) { vstore_n(p, v, n); }
inline void store_n(uint16_t* p, Vf v, int64_t n) { vstore_bf16_n(p, v, n); }
// the first min(n, 16): a whole vector where n is 16 or more
template <typename T>
inline Vf load_upto(const T* p, int64_t n) { return n >= kLanes ? load(p) : load_n(p, n); }

// y[i, i+16) = f(i, x[i, i+16), lanes) over the row's whole vectors (lanes = 16), then its tail
// (lanes = n - i < 16; x's lanes past it read as 0, y's are not written). Inlined, f's
// load_upto(p, lanes) is a plain load in the whole vectors' loop.
template <typename T, typename F>
inline void map_row(const T* x, int64_t n, T* y, const F& f) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) store(y + i, f(i, load(x + i), int64_t{kLanes}));
  if (i < n) store_n(y + i, f(i, load_n(x + i, n - i), n - i), n - i);
}

template <typename T>
inline float sum_of_squares(const T* x, int64_t n) {
  Vf acc = vzero();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const Vf v = load(x + i);
    acc = vfmadd(v, v, acc);
  }
  if (i < n) {
    const Vf v = load_n(x + i, n - i);
    acc = vfmadd(v, v, acc);
  }
  return vreduce_add(acc);
}

}  // namespace

template <typename T>
void rms_norm_rows(const T* x, int64_t rows, int64_t n, int64_t ld_x, const float* weight, float eps, T* y) {
  parallel_for(0, rows, 16, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      const T* xr = x + r * ld_x;
      const Vf inv = vset1(1.0f / std::sqrt(sum_of_squares(xr, n) / static_cast<float>(n) + eps));
      map_row(xr, n, y + r * n, [&](int64_t i, Vf v, int64_t lanes) {
        v = vmul(v, inv);
        return weight ? vmul(v, load_upto(weight + i, lanes)) : v;
      });
    }
  });
}

template <typename T>
void silu_mul_rows(const T* gu, int64_t rows, int64_t n, int64_t ld_gu, T* y) {
  parallel_for(0, rows, 4, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      const T* g = gu + r * ld_gu;
      const T* u = g + n;
      map_row(g, n, y + r * n, [&](int64_t i, Vf gv, int64_t lanes) {
        const Vf e = exp16(vsub(vzero(), gv));
        return vmul(vdiv(gv, vadd(vset1(1.0f), e)), load_upto(u + i, lanes));
      });
    }
  });
}

template void rms_norm_rows<float>(const float*, int64_t, int64_t, int64_t, const float*, float, float*);
template void rms_norm_rows<uint16_t>(const uint16_t*, int64_t, int64_t, int64_t, const float*, float, uint16_t*);
template void silu_mul_rows<float>(const float*, int64_t, int64_t, int64_t, float*);
template void silu_mul_rows<uint16_t>(const uint16_t*, int64_t, int64_t, int64_t, uint16_t*);

}  // namespace radixlm
