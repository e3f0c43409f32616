// The kernels' one threading primitive: torch's at::parallel_for inside the extension (so the
// kernels share torch's thread pool and thread count), OpenMP in a build without torch (the
// C++ test drivers, e.g. the aarch64 build run under qemu: -DRADIXLM_NO_TORCH -fopenmp).
// parallel_for(begin, end, grain, f) calls f(first, last) on disjoint ranges covering
// [begin, end), each at least `grain` long but the last, one range per thread, as torch splits.
#pragma once

#include <cstdint>

#if defined(RADIXLM_NO_TORCH)
#include <omp.h>

#include <algorithm>
#else
#include <ATen/Parallel.h>
#endif

namespace radixlm {

#if defined(RADIXLM_NO_TORCH)
inline int num_threads() { return omp_get_max_threads(); }

template <typename F>
inline void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  if (begin >= end) return;
  const int64_t range = end - begin, g = std::max<int64_t>(grain, 1);
  const int64_t tasks = std::min<int64_t>(num_threads(), (range + g - 1) / g);
  if (tasks <= 1) {
    f(begin, end);
    return;
  }
  const int64_t chunk = (range + tasks - 1) / tasks;
#pragma omp parallel for num_threads(static_cast<int>(tasks)) schedule(static, 1)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t first = begin + t * chunk;
    if (first < end) f(first, std::min(end, first + chunk));
  }
}
#else
inline int num_threads() { return at::get_num_threads(); }

template <typename F>
inline void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  at::parallel_for(begin, end, grain, f);
}
#endif

}  // namespace radixlm
