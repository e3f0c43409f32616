// GEMM over GGUF's K-quant weights (Q4_K, Q5_K, Q6_K), read as they are stored: out[M, N] =
// x[M, K] @ W (+ bias) (+ residual), float32 out; q_gemm / q_columns (quant_gemm.h) call these for
// the K-quant formats.
//
// Formats (GGUF's; per column, super-blocks of 256 k; u the stored unsigned value):
//  - kQ4_K: W = (d * sc[s]) * u - dmin * m[s], s = k / 32 in the super-block, u in [0, 15],
//    sc and m 6-bit, packed into 12 bytes as GGUF packs them; d, dmin float16.
//  - kQ5_K: the same with u in [0, 31] (a fifth bit per value).
//  - kQ6_K: W = (d * sc[k / 16]) * (u - 32), u in [0, 63], sc int8, d float16.
//
// Layout (kernels/kquants.py packs it): N padded to a multiple of 64 columns (zero bytes), K a
// multiple of 256; uint8 [N/16][K/256][super-block bytes], group g holding columns 16g..16g+15.
// A super-block of a group is
//  - a header: the columns' scale bytes as 64-byte "words", byte 4c + i of word w = column c's
//    scale byte 4w + i (3 words of GGUF's 12 bytes; Q6_K 4 words of its 16 int8 scales), d[16]
//    float16, and for Q4_K / Q5_K dmin[16] float16 (256 bytes; Q6_K 288);
//  - then 8 sub-blocks of 32 k: the low nibbles of u as Q4_0's block (quant_gemm.h: 4 vectors of
//    64 bytes, quads 2i and 2i+1 in the low and high nibbles of vector i), then for Q5_K a vector
//    whose byte 4c + j has bit 4 of u at k = 4t + j in its bit t, for Q6_K two vectors whose byte
//    4c + j of vector h has bits 4-5 of u at k = 4(4h + i) + j in its bits 2i, 2i + 1.
// So a super-block is 2304 (Q4_K), 2816 (Q5_K) or 3360 (Q6_K) bytes: 16 x the file's 144, 176 and
// 210, the file's 4.5, 5.5 and 6.5625 bits per weight. A pass unpacks a super-block's scales and
// mins from the header words with vector integer operations (a few per 32 k, into a small array
// on the stack) instead of reading them stored expanded, then streams its sub-blocks.
//
// The product is weight-only: each weight dequantized to float32 in registers exactly as GGUF's
// dequantizer computes it (the products d * sc * u are exact in float32, so one rounding: GGUF's
// value), times float32 x. Torch-free: errors are std::runtime_error.
#pragma once

#include <cstdint>

#include "kernels/quant_gemm.h"

namespace radixlm {

constexpr int64_t kKSuper = 256;  // k of a super-block

bool is_kquant(QFormat format);
// Bytes of one super-block of a group.
int64_t kq_block_bytes(QFormat format);

// As q_gemm in the kFloat mode, for a K-quant `format` (K a multiple of 256).
void kq_gemm(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t groups, QFormat format, float* out,
             int64_t ld_out, const float* residual, int64_t ld_res, const float* bias);

// As q_columns for a K-quant: out [T, supers * 256], GGUF's values bit for bit.
void kq_columns(const uint8_t* w, int64_t groups, int64_t supers, QFormat format, const int64_t* cols, int64_t T,
                float* out);

// --- Q4_K times ONE row of int8-quantized x: the decode-at-batch-1 product (a token's attention
// projections, each routed expert's gate / up / down columns), built to stream the weights at
// memory speed rather than at the tiled kernel's (quant_gemm.cpp q4k_int8_pass) one-row pace.
//
// Values: to the bit what q_gemm gives for that row in an int8 mode (the same integer dot
// products of each 32-k sub-block, the same float operations in the same order: acc = residual +
// bias, then per sub-block acc += float(dot) * (d * sc * dx), acc += (-dmin * m) * cx).
// How it is faster: a thread's weights are read as one sequential stream (a quant group's
// super-blocks, then the next group's: the prefetchers follow one stream best, where the tiled
// pass reads 2 groups side by side), each sub-block's dot products in two accumulators (the low
// and the high nibbles: independent chains of 4 dot steps), each super-block's d and dmin
// converted once. One thread from memory: ~1.2x the tiled pass's bytes a second (Zen 5).

// Whether q4k_int8_row computes `format` x M rows in `mode`: Q4_K, one row, an int8 mode.
bool q4k_row_takes(QFormat format, QMode mode, int64_t M);

// The int8 dot variant (simd/dot_int8.h) the int8 modes use now (quant_gemm.h int8_variant), as
// q4k_int8_row takes it.
int q4k_row_variant();

// out[0, 16 * groups) = x's one row (quantized for an int8 mode; K values) @ the Q4_K quant groups
// w [groups][K / 256][2304] (+ residual[0, 16 * groups)) (+ bias[0, 16 * groups)), on the calling
// thread (inside a caller's parallel region). out may alias residual. groups even; K a multiple
// of 256; variant from q4k_row_variant().
void q4k_int8_row(const QuantizedX& x, int64_t K, const uint8_t* w, int64_t groups, float* out,
                  const float* residual, const float* bias, int variant);

// The same over the threads (x float32 [K], quantized here as q_gemm's `mode` does, unless
// `quantized` gives it so already). q_gemm routes every product it takes here (q4k_row_takes).
void q4k_int8_row_parallel(const float* x, int64_t K, const uint8_t* w, int64_t groups, QMode mode, float* out,
                           const float* residual, const float* bias, const QuantizedX* quantized = nullptr);

}  // namespace radixlm
