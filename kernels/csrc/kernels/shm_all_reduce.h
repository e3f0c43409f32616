// A float32 sum over the tensor-parallel ranks of one machine through shared memory, call for call
// the protocol of runtime/model/shm_all_reduce.py (the same file layout and flags, so the Python
// and C++ sides interleave): rank r's flag is the int32 at byte r*64, its data slots follow the
// flags, two halves by call parity; a call posts the rank's part, sets its flag to the call's
// number (the previous + 1, mod 2^31) and wakes waiters (futex), waits until every flag has moved
// off the previous number, and sums the parts in rank order (every rank: the same bits).
#pragma once

#include <torch/extension.h>

#include <cstdint>
#include <vector>

namespace radixlm {

class ShmAllReduce {
 public:
  // buffer: the uint8 tensor mapping the shared file (kept alive here); peers: process ids of
  // ranks to watch while waiting (a dead one raises instead of waiting forever).
  ShmAllReduce(torch::Tensor buffer, int64_t rank, int64_t size, int64_t max_bytes, std::vector<int64_t> peers);
  // data[0..n) summed over the ranks, in place.
  void all_reduce(float* data, int64_t n) const;
  int64_t max_floats() const { return max_bytes_ / 4; }
  int64_t rank() const { return rank_; }

 private:
  int32_t* flag(int64_t r) const { return reinterpret_cast<int32_t*>(base_ + r * kFlagBytes); }
  float* slot(int64_t half, int64_t r) const {
    return reinterpret_cast<float*>(base_ + size_ * kFlagBytes + (half * size_ + r) * max_bytes_);
  }
  void wait_for(int64_t r, int32_t prev) const;
  void check_peers() const;

  static constexpr int64_t kFlagBytes = 64;
  torch::Tensor buffer_;
  uint8_t* base_;
  int64_t rank_, size_, max_bytes_;
  std::vector<int64_t> peers_;
};

}  // namespace radixlm
