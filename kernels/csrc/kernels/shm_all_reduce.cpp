// ShmAllReduce (see shm_all_reduce.h).
#include "kernels/shm_all_reduce.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <Python.h>

#include <climits>
#include <cstring>
#include <fstream>
#include <string>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace radixlm {

namespace {

constexpr int kSpins = 4000;  // ~10 us of pause (x86) before sleeping in the kernel
constexpr long kWaitNs = 2'000'000;  // a futex sleep re-checks after 2 ms

// A spin-wait hint: lets the core's other hardware thread (and the memory system) go first.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

bool process_gone(int64_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return true;
  std::string all((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t close = all.rfind(')');
  return close == std::string::npos || close + 2 >= all.size() || all[close + 2] == 'Z';
}

}  // namespace

ShmAllReduce::ShmAllReduce(torch::Tensor buffer, int64_t rank, int64_t size, int64_t max_bytes,
                           std::vector<int64_t> peers)
    : buffer_(std::move(buffer)), rank_(rank), size_(size), max_bytes_(max_bytes), peers_(std::move(peers)) {
  TORCH_CHECK(buffer_.scalar_type() == at::kByte && buffer_.is_contiguous(), "buffer must be contiguous uint8");
  TORCH_CHECK(size_ >= 1 && rank_ >= 0 && rank_ < size_ && max_bytes_ % 64 == 0, "bad rank, size or slot size");
  TORCH_CHECK(buffer_.numel() >= size_ * kFlagBytes + 2 * size_ * max_bytes_, "buffer smaller than the layout");
  base_ = buffer_.data_ptr<uint8_t>();
}

void ShmAllReduce::check_peers() const {
  for (int64_t pid : peers_) {
    TORCH_CHECK(!process_gone(pid), "tensor-parallel peer process ", pid, " exited");
  }
  // a signal (the server's SIGTERM) must not wait behind a rank that never comes
  if (PyGILState_Check() && PyErr_CheckSignals() != 0) throw pybind11::error_already_set();
}

void ShmAllReduce::wait_for(int64_t r, int32_t prev) const {
  int32_t* f = flag(r);
  for (int64_t spins = 0; __atomic_load_n(f, __ATOMIC_ACQUIRE) == prev; ++spins) {
    if (spins < kSpins) {
      cpu_relax();
      continue;
    }
    if (spins % 50 == 0) check_peers();  // every ~100 ms of sleeping
    struct timespec limit = {0, kWaitNs};
    syscall(SYS_futex, f, FUTEX_WAIT, prev, &limit, nullptr, 0);
  }
}

void ShmAllReduce::all_reduce(float* data, int64_t n) const {
  TORCH_CHECK(n * 4 <= max_bytes_, "all_reduce of ", n, " floats exceeds the shared slots");
  const int32_t prev = __atomic_load_n(flag(rank_), __ATOMIC_RELAXED);
  const int32_t seq = (prev + 1) & 0x7FFFFFFF;
  const int64_t half = seq % 2;
  std::memcpy(slot(half, rank_), data, n * sizeof(float));
  __atomic_store_n(flag(rank_), seq, __ATOMIC_RELEASE);
  syscall(SYS_futex, flag(rank_), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
  for (int64_t r = 0; r < size_; ++r) wait_for(r, prev);
  const float* p0 = slot(half, 0);
  const float* p1 = size_ > 1 ? slot(half, 1) : nullptr;
  for (int64_t i = 0; i < n; ++i) {  // rank order, as torch.add(p0, p1) then += p2 ... on the Python side
    float acc = p1 ? p0[i] + p1[i] : p0[i];
    for (int64_t r = 2; r < size_; ++r) acc += slot(half, r)[i];
    data[i] = acc;
  }
}

}  // namespace radixlm
