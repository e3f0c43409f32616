// GGUF blocks repacked into quant groups (kquant_repack.h). Each block of a 16-channel group is
// made in two passes over a small buffer: each channel's values u (unsigned, k order) decoded
// from its GGUF block, then written where the group's layout wants them, with the channels'
// scale bytes copied into the header; Q4_K and Q5_K (most of a Q4_K_M file) skip the buffer and
// move their nibbles 4 bytes at a time. The layouts are documented in kernels/quant.py (32-k
// formats) and kernels/kquants.py (K-quants).
#include "kernels/kquant_repack.h"

#include <cstring>

#include "kernels/parallel.h"

namespace radixlm {
namespace {

constexpr int kGroup = 16;
constexpr int kMaxBlockK = 256;
const uint8_t kZeroBlock[256] = {};  // a padded channel's GGUF block: zero scales

// One channel's values u [block_k] of one GGUF block `b`.
void decode_block(const uint8_t* b, RepackFormat fmt, uint8_t* u) {
  switch (fmt) {
    case RepackFormat::kQ8_0:  // int8 q -> q + 128
      for (int j = 0; j < 32; ++j) u[j] = static_cast<uint8_t>(b[2 + j] ^ 0x80);
      return;
    case RepackFormat::kQ4_0:
    case RepackFormat::kQ4_1: {  // byte j: value j (low nibble), value 16 + j (high)
      const uint8_t* qs = b + (fmt == RepackFormat::kQ4_1 ? 4 : 2);
      for (int j = 0; j < 16; ++j) {
        u[j] = qs[j] & 0x0F;
        u[16 + j] = qs[j] >> 4;
      }
      return;
    }
    case RepackFormat::kQ4K:
    case RepackFormat::kQ5K: {  // qs byte 32i + l: u[64i + l] (low nibble), u[64i + 32 + l] (high)
      const uint8_t* qs = b + (fmt == RepackFormat::kQ5K ? 48 : 16);
      for (int i = 0; i < 4; ++i) {
        for (int l = 0; l < 32; ++l) {
          u[64 * i + l] = qs[32 * i + l] & 0x0F;
          u[64 * i + 32 + l] = qs[32 * i + l] >> 4;
        }
      }
      if (fmt == RepackFormat::kQ5K) {  // qh byte l, bit t: bit 4 of u[32t + l]
        const uint8_t* qh = b + 16;
        for (int t = 0; t < 8; ++t) {
          for (int l = 0; l < 32; ++l) u[32 * t + l] |= static_cast<uint8_t>(((qh[l] >> t) & 1) << 4);
        }
      }
      return;
    }
    case RepackFormat::kQ6K: {  // ql byte 64h + l: u[128h + l], u[128h + 64 + l]; qh byte 32h + l, bits 2t: u[128h + 32t + l]
      const uint8_t* ql = b;
      const uint8_t* qh = b + 128;
      for (int h = 0; h < 2; ++h) {
        for (int l = 0; l < 64; ++l) {
          u[128 * h + l] = ql[64 * h + l] & 0x0F;
          u[128 * h + 64 + l] = ql[64 * h + l] >> 4;
        }
        for (int t = 0; t < 4; ++t) {
          for (int l = 0; l < 32; ++l) {
            u[128 * h + 32 * t + l] |= static_cast<uint8_t>(((qh[32 * h + l] >> (2 * t)) & 3) << 4);
          }
        }
      }
      return;
    }
  }
}

// Bytes 4c + j of `vectors` 64-byte vectors: the low nibbles of 32 values of each channel c, quad
// 2v in the low and 2v + 1 in the high nibble of vector v (u[c] points at the channel's 32 values).
void write_nibbles(const uint8_t* const* u, uint8_t* out) {
  for (int v = 0; v < 4; ++v) {
    for (int c = 0; c < kGroup; ++c) {
      for (int j = 0; j < 4; ++j) {
        out[64 * v + 4 * c + j] = static_cast<uint8_t>((u[c][8 * v + j] & 0x0F) | ((u[c][8 * v + 4 + j] & 0x0F) << 4));
      }
    }
  }
}

inline uint32_t load_word(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Q4_K / Q5_K sub-block sb = 2i + h straight from the channels' qs (no decoded values): its k are
// 64i + 32h + m, nibble h of qs byte 32i + m; packed byte 4c + j of vector v holds m = 8v + j (low
// nibble) and 8v + 4 + j (high), so each output word is nibble h of two input words.
void write_qs_nibbles(const uint8_t* const* qs, int sb, uint8_t* out) {
  const int i = sb / 2, h = sb % 2;
  for (int v = 0; v < 4; ++v) {
    for (int c = 0; c < kGroup; ++c) {
      const uint32_t lo = load_word(qs[c] + 32 * i + 8 * v), hi = load_word(qs[c] + 32 * i + 8 * v + 4);
      const uint32_t word = h == 0 ? (lo & 0x0F0F0F0Fu) | ((hi << 4) & 0xF0F0F0F0u)
                                   : ((lo >> 4) & 0x0F0F0F0Fu) | (hi & 0xF0F0F0F0u);
      std::memcpy(out + 64 * v + 4 * c, &word, 4);
    }
  }
}

// Whether write_block reads the decoded values (Q4_K and Q5_K move their bits straight from the blocks).
bool reads_values(RepackFormat fmt) { return fmt != RepackFormat::kQ4K && fmt != RepackFormat::kQ5K; }

// Scale bytes as "words": byte 64w + 4c + i = channel c's byte 4w + i of its `words` * 4 bytes at
// offset `at` of its block.
void write_words(const uint8_t* const* blocks, int at, int words, uint8_t* out) {
  for (int w = 0; w < words; ++w) {
    for (int c = 0; c < kGroup; ++c) std::memcpy(out + 64 * w + 4 * c, blocks[c] + at + 4 * w, 4);
  }
}

// A float16 per channel (at offset `at` of its block) -> bytes 2c, 2c + 1 of out.
void write_halves(const uint8_t* const* blocks, int at, uint8_t* out) {
  for (int c = 0; c < kGroup; ++c) std::memcpy(out + 2 * c, blocks[c] + at, 2);
}

// One packed block of a group from its 16 channels' GGUF blocks and decoded values u [16][block_k].
void write_block(const uint8_t* const* blocks, uint8_t (*u)[kMaxBlockK], RepackFormat fmt, uint8_t* out) {
  const uint8_t* at[kGroup];
  switch (fmt) {
    case RepackFormat::kQ8_0:  // 8 quads of 64 bytes (byte 4c + j: u[4q + j]), then d[16]
      for (int q = 0; q < 8; ++q) {
        for (int c = 0; c < kGroup; ++c) std::memcpy(out + 64 * q + 4 * c, u[c] + 4 * q, 4);
      }
      write_halves(blocks, 0, out + 512);
      return;
    case RepackFormat::kQ4_0:
    case RepackFormat::kQ4_1:  // 4 nibble vectors, d[16], q4_1 then m[16]
      for (int c = 0; c < kGroup; ++c) at[c] = u[c];
      write_nibbles(at, out);
      write_halves(blocks, 0, out + 256);
      if (fmt == RepackFormat::kQ4_1) write_halves(blocks, 2, out + 288);
      return;
    default:
      break;
  }
  // K-quants: header (scale words, d[16], Q4_K / Q5_K dmin[16]), then 8 sub-blocks of 32 k
  const bool q6 = fmt == RepackFormat::kQ6K;
  const int words = q6 ? 4 : 3, header = q6 ? 288 : 256;
  const int sub_bytes = fmt == RepackFormat::kQ4K ? 256 : (fmt == RepackFormat::kQ5K ? 320 : 384);
  write_words(blocks, q6 ? 192 : 4, words, out);
  write_halves(blocks, q6 ? 208 : 0, out + 64 * words);
  if (!q6) write_halves(blocks, 2, out + 64 * words + 32);
  if (!q6) {  // qs at 16 (Q4_K) or 48 (Q5_K); Q5_K's qh byte l, bit s: bit 4 of u[32s + l]
    const int qs_at = fmt == RepackFormat::kQ5K ? 48 : 16;
    for (int c = 0; c < kGroup; ++c) at[c] = blocks[c] + qs_at;
    for (int sb = 0; sb < 8; ++sb) {
      uint8_t* sub = out + header + sb * sub_bytes;
      write_qs_nibbles(at, sb, sub);
      if (fmt != RepackFormat::kQ5K) continue;
      for (int c = 0; c < kGroup; ++c) {  // byte 4c + j, bit t: bit 4 of u[32sb + 4t + j]
        const uint8_t* qh = blocks[c] + 16;
        for (int j = 0; j < 4; ++j) {
          int bits = 0;
          for (int t = 0; t < 8; ++t) bits |= ((qh[4 * t + j] >> sb) & 1) << t;
          sub[256 + 4 * c + j] = static_cast<uint8_t>(bits);
        }
      }
    }
    return;
  }
  for (int sb = 0; sb < 8; ++sb) {  // Q6_K
    uint8_t* sub = out + header + sb * sub_bytes;
    for (int c = 0; c < kGroup; ++c) at[c] = u[c] + 32 * sb;
    write_nibbles(at, sub);
    for (int h = 0; h < 2; ++h) {  // vector h, byte 4c + j, bits 2i, 2i + 1: bits 4-5 of u[4(4h + i) + j]
      for (int c = 0; c < kGroup; ++c) {
        for (int j = 0; j < 4; ++j) {
          int bits = 0;
          for (int i = 0; i < 4; ++i) bits |= ((at[c][4 * (4 * h + i) + j] >> 4) & 3) << (2 * i);
          sub[256 + 64 * h + 4 * c + j] = static_cast<uint8_t>(bits);
        }
      }
    }
  }
}

}  // namespace

RepackSizes repack_sizes(RepackFormat fmt) {
  switch (fmt) {
    case RepackFormat::kQ8_0: return {34, 32, 544};
    case RepackFormat::kQ4_0: return {18, 32, 288};
    case RepackFormat::kQ4_1: return {20, 32, 320};
    case RepackFormat::kQ4K: return {144, 256, 2304};
    case RepackFormat::kQ5K: return {176, 256, 2816};
    case RepackFormat::kQ6K: return {210, 256, 3360};
  }
  return {0, 0, 0};
}

void quant_repack(const uint8_t* const* rows, int64_t n, int64_t k, RepackFormat fmt, int64_t padded_n, uint8_t* out) {
  const RepackSizes sizes = repack_sizes(fmt);
  const int64_t blocks = k / sizes.block_k, groups = padded_n / kGroup;
  const bool values = reads_values(fmt);
  // a task is one group's blocks: ~blocks x packed_bytes of output (36 KB for a 2048-k Q4_K row)
  parallel_for(0, groups, 1, [&](int64_t first, int64_t last) {
    uint8_t u[kGroup][kMaxBlockK];
    const uint8_t* src[kGroup];
    for (int64_t g = first; g < last; ++g) {
      for (int64_t b = 0; b < blocks; ++b) {
        for (int c = 0; c < kGroup; ++c) {
          const int64_t channel = g * kGroup + c;
          if (channel < n) {
            src[c] = rows[channel] + b * sizes.gguf_bytes;
            if (values) decode_block(src[c], fmt, u[c]);
          } else {
            src[c] = kZeroBlock;
            if (values) std::memset(u[c], 0, sizeof(u[c]));
          }
        }
        write_block(src, u, fmt, out + (g * blocks + b) * sizes.packed_bytes);
      }
    }
  });
}

}  // namespace radixlm
