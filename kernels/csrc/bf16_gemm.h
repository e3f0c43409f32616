// bf16 GEMM over weights packed for the CPU's bf16 dot-product instructions:
// out[M, N] = bf16(x)[M, K] @ W (+ bias) (+ residual), accumulation in float32.
//
// Weight layout ("VNNI panels"): W is padded to Kp = ceil(K/32)*32 rows and N to a multiple of 64
// columns, then stored as [Np/32][Kp/2][32][2]: a panel of 32 columns; within it, row p holds
// W[2p][c], W[2p+1][c] side by side for each column c. One 32-bit lane is then the (even, odd)
// k-pair of one column, which is what vdpbf16ps multiplies against a broadcast (x[2p], x[2p+1])
// pair and what an AMX B tile holds (16 pair-rows x 16 columns, rows 128 bytes apart). Each panel
// is one contiguous stream, read once per step for all rows.
//
// Three paths, picked at run time (bf16_path()):
//  - kAmx: AMX tiles (tdpbf16ps), 32 x 32 blocks of the output per inner loop. Needs AMX-BF16 in
//    cpuid and the kernel's permission to use tile data (arch_prctl ARCH_REQ_XCOMP_PERM).
//  - kAvx512Bf16: vdpbf16ps (AVX512-BF16), up to 8 rows x 32 columns per pass.
//  - kEmulated: the same loop as kAvx512Bf16 with vdpbf16ps emulated in AVX-512F (the pair's odd
//    product added first, then the even one; bf16 products are exact in float32), so every
//    AVX-512 machine runs it, and bit-identical to the instruction on normal numbers.
// x is rounded to bfloat16 (nearest even) first, as torch's bf16 linear layers see it.
#pragma once

#include <cstdint>

namespace radixlm {

enum class Bf16Path : int { kEmulated = 0, kAvx512Bf16 = 1, kAmx = 2 };

struct CpuFeatures {
  bool avx512bf16 = false;  // cpuid: AVX512_BF16
  bool amx_bf16 = false;    // cpuid: AMX-TILE and AMX-BF16, and the OS enables tile state in XCR0
  bool amx_permitted = false;  // the kernel granted this process tile data (Linux arch_prctl)
};

// Read once (the AMX permission request happens on the first call).
const CpuFeatures& cpu_features();

// The fastest path this CPU runs; `requested` >= 0 asks for a path (lower is always possible).
Bf16Path bf16_path(int requested = -1);

// x [M, K] float32 (rows K apart); w VNNI panels for (K, N = panels*32); out / residual rows
// ld_out / ld_res apart (out may alias residual); bias [panels*32] or null.
void bf16_gemm(const float* x, int64_t M, int64_t K, const uint16_t* w, int64_t panels, float* out, int64_t ld_out,
               const float* residual, int64_t ld_res, const float* bias, Bf16Path path);

// This thread's tiles: all 8 configured as 16 rows x 64 bytes (a bf16 tile 16 x 32, a float32
// accumulator 16 x 16), and given back. Needs Bf16Path::kAmx.
void amx_configure();
void amx_release();

constexpr int64_t kVnniPanel = 32;
constexpr int64_t kVnniK = 32;  // K is padded to a multiple of this (one AMX tile's depth)
inline int64_t vnni_k(int64_t k) { return (k + kVnniK - 1) / kVnniK * kVnniK; }

}  // namespace radixlm
