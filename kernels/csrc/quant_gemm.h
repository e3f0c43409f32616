// GEMM over block-quantized weights, read as they are stored (never dequantized to memory):
// out[M, N] = x[M, K] @ W (+ bias) (+ residual), float32 out.
//
// Formats (GGUF's, one scale per 32 consecutive k of a column; `u` is the stored unsigned value):
//  - kQ8_0: W = d * (u - 128), u in [0, 255] (GGUF stores the signed q = u - 128)
//  - kQ4_0: W = d * (u - 8),   u in [0, 15]
//  - kQ4_1: W = d * u + m,     u in [0, 15]
// d and m are float16, as in the file.
//
// Layout ("quant groups"): N is padded to a multiple of 64 columns (zero scales), K must be a
// multiple of 32. The weight is uint8 [N/16][K/32][block_bytes]: group g holds columns 16g..16g+15,
// one contiguous stream of blocks; block b holds k = 32b..32b+31 of those 16 columns:
//  - the values as eight "k-quads" of 64 bytes, byte 4c + j of quad t = column c, k = 4t + j:
//    what vpdpbusd multiplies against a broadcast 4 bytes of x. Q8_0 stores u as bytes (512
//    bytes); Q4 formats pack quads 2i (low nibble) and 2i+1 (high nibble) into one 64-byte
//    vector (256 bytes);
//  - then d[16] as float16 (32 bytes), and for Q4_1 m[16] as float16 (32 bytes).
// So a block is 544 (Q8_0), 288 (Q4_0) or 320 (Q4_1) bytes: the file's bytes per weight exactly
// (34, 18 and 20 per 32), and the format is known from the block size.
//
// Modes (what x becomes before the products):
//  - kFloat: weight-only. Each weight is dequantized to float32 in registers as GGUF's dequantizer
//    does (d * q, or d * u + m) and multiplied with float32 x: a float32 model's products over
//    the dequantized weights, in another order of additions.
//  - kInt8Block: x quantized per row and 32-block to int8 (scale max|x|/127, as llama.cpp's q8
//    blocks), int8 x uint8 dot products with vpdpbusd (AVX512-VNNI) into int32 per block, then
//    the block's scales in float32.
//  - kInt8Row: the same with one scale per row of x (per-token dynamic int8: w8a8).
#pragma once

#include <cstdint>

namespace radixlm {

enum class QFormat : int { kQ8_0 = 0, kQ4_0 = 1, kQ4_1 = 2 };
enum class QMode : int { kFloat = 0, kInt8Block = 1, kInt8Row = 2 };

constexpr int64_t kQGroup = 16;  // columns of a group
constexpr int64_t kQBlock = 32;  // k of a block

int64_t q_block_bytes(QFormat format);
// The format whose block has this many bytes; an error for any other size.
QFormat q_format_of(int64_t block_bytes);

// Whether the CPU has AVX512-VNNI (vpdpbusd): the int8 modes need it.
bool cpu_has_vnni();
// Calls of q_gemm in an int8 mode (since the process started): a statistic for tests.
int64_t num_vnni_calls();

// x [M, K] float32 (rows K apart, K a multiple of 32); w quant groups [groups][K/32][block bytes];
// out / residual rows ld_out / ld_res apart (out may alias residual); bias [groups*16] or null.
void q_gemm(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t groups, QFormat format, QMode mode,
            float* out, int64_t ld_out, const float* residual, int64_t ld_res, const float* bias);

// out [T, nb*32] float32 = columns cols[0..T) of quant groups w ([groups][nb][block bytes]),
// dequantized as GGUF's dequantizer does (d * (u - offset), or d * u + m): for a tied embedding,
// the rows of tokens cols.
void q_columns(const uint8_t* w, int64_t groups, int64_t nb, QFormat format, const int64_t* cols, int64_t T, float* out);

}  // namespace radixlm
