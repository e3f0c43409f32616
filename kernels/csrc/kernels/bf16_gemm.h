// bf16 GEMM over weights packed for the CPU's bf16 dot-product instructions:
// out[M, N] = bf16(x)[M, K] @ W (+ bias) (+ residual), accumulation in float32.
//
// Weight layout ("pair panels"): W is padded to Kp = ceil(K/32)*32 rows and N to a multiple of 64
// columns, then stored as [Np/32][Kp/2][32][2]: a panel of 32 columns; within it, row p holds
// W[2p][c], W[2p+1][c] side by side for each column c. One 32-bit lane is then the (even, odd)
// k-pair of one column, which is what vdpbf16ps multiplies against a broadcast (x[2p], x[2p+1])
// pair and what an AMX B tile holds (16 pair-rows x 16 columns, rows 128 bytes apart). Each panel
// is one contiguous stream, read once per step for all rows.
//
// Three paths, picked at run time (bf16_path()):
//  - kAmx: AMX tiles (tdpbf16ps), 32 x 32 blocks of the output per inner loop. Needs AMX-BF16 and
//    the kernel's permission to use tile data (both in cpu_has(kAmxBf16): dispatch/cpu_features.h).
//  - kAvx512Bf16: vdpbf16ps (AVX512-BF16), up to 6 rows x 64 columns per pass.
//  - kEmulated: the same blocking with vdpbf16ps emulated over the vector layer (each pair's odd
//    product added first, then the even one; bf16 products are exact in float32, so each step
//    rounds once), so every CPU runs it, bit-identical to the instruction on normal numbers.
// kAmx and kAvx512Bf16 exist only in the avx512 build of the kernels (RADIXLM_SIMD_AVX512); every
// build has kEmulated.
// x is rounded to bfloat16 (nearest even) first, as torch's bf16 linear layers see it.
#pragma once

#include <cstdint>

#include "simd/vec.h"

namespace radixlm {

enum class Bf16Path : int { kEmulated = 0, kAvx512Bf16 = 1, kAmx = 2 };

// Whether this build runs `path` on this CPU (kEmulated: always).
bool bf16_path_runs(Bf16Path path);

// The fastest path this build runs on this CPU; `requested` >= 0 asks for a path (an error, a
// std::runtime_error naming AMX or AVX512-BF16, where it does not run here).
Bf16Path bf16_path(int requested = -1);

// x [M, K] float32 (rows K apart); w pair panels for (K, N = panels*32); out / residual rows
// ld_out / ld_res apart (out may alias residual); bias [panels*32] or null.
void bf16_gemm(const float* x, int64_t M, int64_t K, const uint16_t* w, int64_t panels, float* out, int64_t ld_out,
               const float* residual, int64_t ld_res, const float* bias, Bf16Path path);

#if defined(RADIXLM_SIMD_AVX512)
// This thread's tiles: all 8 configured as 16 rows x 64 bytes (a bf16 tile 16 x 32, a float32
// accumulator 16 x 16), and given back. Only where bf16_path_runs(Bf16Path::kAmx).
void amx_configure();
void amx_release();
#endif

constexpr int64_t kPairPanel = 32;
constexpr int64_t kPairK = 32;  // K is padded to a multiple of this (one AMX tile's depth)
inline int64_t pair_k(int64_t k) { return (k + kPairK - 1) / kPairK * kPairK; }

}  // namespace radixlm
