// GGUF blocks -> the quant groups our quantized kernels read (the layouts: kernels/quant.py and
// kernels/kquants.py, whose `pack` is the reference this must match byte for byte). The file's
// blocks of one output channel lie in a row; a quant group interleaves 16 channels' blocks so a
// vector load reads 16 columns at once. Pure byte moves (no arithmetic on the values), split
// between threads over groups: the result is the same on any thread count.
//
// Torch-free (kernels/parallel.h); the torch entry point is bindings/torch_repack.cpp.
#pragma once

#include <cstdint>

namespace radixlm {

// GGUF's block formats we keep quantized.
enum class RepackFormat : int { kQ8_0, kQ4_0, kQ4_1, kQ4K, kQ5K, kQ6K };

struct RepackSizes {
  int64_t gguf_bytes;    // one GGUF block: `block_k` consecutive k of one channel
  int64_t block_k;       // 32, or 256 for the K-quants
  int64_t packed_bytes;  // one block of a 16-channel group, as packed
};

RepackSizes repack_sizes(RepackFormat fmt);

// out [padded_n / 16, k / block_k, packed_bytes] from n channels (n <= padded_n, padded_n a multiple
// of 16): channel c's k / block_k GGUF blocks start at rows[c] (each row read, never written);
// channels n..padded_n-1 are zero bytes (zero scales). k a multiple of block_k.
void quant_repack(const uint8_t* const* rows, int64_t n, int64_t k, RepackFormat fmt, int64_t padded_n, uint8_t* out);

}  // namespace radixlm
