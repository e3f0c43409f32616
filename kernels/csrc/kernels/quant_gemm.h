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
//    what a 4-way int8 dot product (simd/dot_int8.h) multiplies with 4 bytes of x. Q8_0 stores u as bytes (512
//    bytes); Q4 formats pack quads 2i (low nibble) and 2i+1 (high nibble) into one 64-byte
//    vector (256 bytes);
//  - then d[16] as float16 (32 bytes), and for Q4_1 m[16] as float16 (32 bytes).
// So a block is 544 (Q8_0), 288 (Q4_0) or 320 (Q4_1) bytes: the file's bytes per weight exactly
// (34, 18 and 20 per 32), and the format is known from the block size.
//
// GGUF's K-quants (kQ4_K, kQ5_K, kQ6_K: super-blocks of 256 k, sub-block scales) have their own
// layout and kernels (kquant_gemm.h): uint8 [N/16][K/256][super-block bytes], 2304, 2816 and 3360
// bytes, again the file's bytes per weight and again naming the format. q_gemm and q_columns take
// them as they take the others. Q4_K runs every mode (its int8 modes as Q4_1's, with each 32-k
// sub-block's step d * sc and shift -dmin * m for d and m), Q6_K too (each 16-k scale span's exact
// sum of (u - 32) * x times d * sc * dx, two spans to x's block); Q5_K runs the weight-only kFloat
// path in every mode (no int8 x int8 kernel for it yet).
//
// Modes (what x becomes before the products):
//  - kFloat: weight-only. Each weight is dequantized to float32 in registers as GGUF's dequantizer
//    does (d * q, or d * u + m) and multiplied with float32 x: a float32 model's products over
//    the dequantized weights, in another order of additions.
//  - kInt8Block: x quantized per row and 32-block to int8 (scale max|x|/127, as llama.cpp's q8
//    blocks), exact int32 dot products of the weights' values with x's int8 per block, then the
//    block's scales in float32.
//  - kInt8Row: the same with one scale per row of x (per-token dynamic int8: w8a8).
// Both int8 modes run at every ISA level, through an int8 dot variant of simd/dot_int8.h
// (vpdpbusd on AVX512-VNNI or AVX-VNNI, vpmaddubsw on AVX-512BW or AVX2, sdot or smull on NEON,
// exact float lanes at any level): the fastest the CPU runs unless set_int8_variant chose one.
// Every variant gives the same integer sums, so the output of a build does not depend on it.
//
// Torch-free (kernels/parallel.h): errors are std::runtime_error.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace radixlm {

enum class QFormat : int { kQ8_0 = 0, kQ4_0 = 1, kQ4_1 = 2, kQ4_K = 3, kQ5_K = 4, kQ6_K = 5 };
enum class QMode : int { kFloat = 0, kInt8Block = 1, kInt8Row = 2 };

constexpr int64_t kQGroup = 16;  // columns of a group
constexpr int64_t kQBlock = 32;  // k of a block

int64_t q_block_bytes(QFormat format);
// k of a block of `format`: 32, or 256 for a K-quant's super-block.
int64_t q_block_k(QFormat format);
// The format whose block has this many bytes; an error for any other size.
QFormat q_format_of(int64_t block_bytes);

// Whether the kernels may use AVX512-VNNI here (cpu_has(kAvx512Vnni)). The int8 modes no longer
// need it: they run everywhere (int8_variant says how).
bool cpu_has_vnni();
// Calls of q_gemm in an int8 mode, whatever the variant (since the process started): a statistic
// for tests.
int64_t num_vnni_calls();

// The int8 dot variants this build runs on this CPU, fastest first (e.g. "avx512_vnni",
// "avx512bw", "generic"; "avx_vnni", "avx2"; "neon_dotprod", "neon").
std::vector<std::string> int8_variants();
// The variant the int8 modes use now.
std::string int8_variant();
// Make the int8 modes use variant `name` (one of int8_variants()), or "" for the fastest again;
// an error for a variant this build or CPU does not run. Process-wide; for tests and benchmarks.
void set_int8_variant(const std::string& name);

// x's rows as the int8 modes read them: per row its K int8 values (rows K apart; in [-127, 127]),
// per row and 32-block (K/32 apart) the scale dx, the sum of the block's int8 values sq and
// dx * sq. A caller running several products on the same x (a mixture-of-experts layer's column
// slices) quantizes it once (q_quantize_x / q_quantize_blocks) and hands it to each q_gemm.
struct QuantizedX {
  const int8_t* xq = nullptr;
  const float* dx = nullptr;
  const int32_t* sq = nullptr;
  const float* cx = nullptr;
  // The same rows from row r on (rows K apart).
  QuantizedX from_row(int64_t r, int64_t K) const {
    const int64_t nb = K / kQBlock;
    return {xq + r * K, dx + r * nb, sq + r * nb, cx + r * nb};
  }
};

// Whether q_gemm in `mode` reads x quantized (QuantizedX) for `format`: an int8 mode, on a
// format with an int8 kernel (the others run weight-only on float32 x in every mode).
bool q_reads_int8(QFormat format, QMode mode);

// Storage for the quantized rows of x [M, K] (sized by resize; q_quantize_x sizes it).
struct QuantizedXBuffer {
  std::vector<int8_t> xq;
  std::vector<float> dx, cx;
  std::vector<int32_t> sq;
  void resize(int64_t M, int64_t K);
  QuantizedX view() const { return {xq.data(), dx.data(), sq.data(), cx.data()}; }
};

// Rows [0, M) of x [M, K] (rows K apart) quantized as q_gemm's int8 `mode` does, into `out` (resized
// to M x K), on the threads.
void q_quantize_x(const float* x, int64_t M, int64_t K, QMode mode, QuantizedXBuffer& out);
// kInt8Block's quantization of n values at src (n a multiple of 32: n / 32 blocks, each on its own)
// into q[n], dx / sq / cx[n / 32]: a slice of a row quantizes as that slice of the whole row.
void q_quantize_blocks(const float* src, int64_t n, int8_t* q, float* dx, int32_t* sq, float* cx);

// x [M, K] float32 (rows K apart, K a multiple of q_block_k); w quant groups [groups][K/block k][block bytes];
// out / residual rows ld_out / ld_res apart (out may alias residual); bias [groups*16] or null.
// quantized: x already quantized for `mode` (an int8 mode), or null (q_gemm quantizes it); products
// that multiply float32 x (kFloat, the formats without an int8 kernel) read x.
void q_gemm(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t groups, QFormat format, QMode mode,
            float* out, int64_t ld_out, const float* residual, int64_t ld_res, const float* bias,
            const QuantizedX* quantized = nullptr);

// out [T, nb*block k] float32 = columns cols[0..T) of quant groups w ([groups][nb][block bytes]),
// dequantized as GGUF's dequantizer does (d * (u - offset), or d * u + m): for a tied embedding,
// the rows of tokens cols.
void q_columns(const uint8_t* w, int64_t groups, int64_t nb, QFormat format, const int64_t* cols, int64_t T, float* out);

}  // namespace radixlm
