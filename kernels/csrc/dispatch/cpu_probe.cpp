// The CPU probe: a small shared library built for the baseline ISA (no torch), loaded with
// ctypes before any kernel module, so that Python learns what the CPU runs without loading
// code built for a level it may lack (kernels/isa.py).
#include "dispatch/cpu_features.h"

extern "C" {
uint64_t radixlm_cpu_features() { return radixlm::detect_cpu_features(); }
int radixlm_num_cpu_features() { return radixlm::kNumCpuFeatures; }
const char* radixlm_cpu_feature_name(int i) {
  return i >= 0 && i < radixlm::kNumCpuFeatures ? radixlm::kCpuFeatureNames[i] : nullptr;
}
}
