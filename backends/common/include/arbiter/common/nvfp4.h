// NVFP4: e2m1 values in blocks of 16, each block with an e4m3 scale factor,
// the whole tensor with an fp32 global scale.
//
// Per block (FlashInfer/TensorRT-LLM convention):
//   sf    = e4m3(global_scale * amax / 6)            (stored in scale_out)
//   q[i]  = e2m1(x[i] * (global_scale / float(sf)))  (0 when sf is 0)
// so x[i] ~= float(q[i]) * float(sf) / global_scale.
// Two values share a byte: element 2k in the low nibble, 2k+1 in the high one.
// Scale factors are laid out linearly (row * blocks_per_row + block) or in the
// 128x4 swizzled layout the Blackwell block-scaled GEMMs read.
#pragma once

#include <cstddef>
#include <cstdint>

#include "arbiter/common/bits.h"
#include "arbiter/common/fp8.h"
#include "arbiter/common/host_device.h"

namespace arbiter::common {

inline constexpr std::uint32_t kNvfp4BlockSize = 16;
inline constexpr float kE2m1Max = 6.0f;

// float -> e2m1 code (low nibble; bit 3 is the sign). Magnitudes 0, 0.5, 1,
// 1.5, 2, 3, 4, 6 are codes 0..7. Rounds to nearest even, saturates at 6.
// e2m1 has no NaN: NaN becomes +6 (our choice; documented, never relied on).
ARBITER_HD inline std::uint8_t float_to_e2m1(float value) {
  const std::uint32_t bits = float_bits(value);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return 0x7;
  const std::uint8_t sign = static_cast<std::uint8_t>((bits >> 28) & 0x8u);
  const float magnitude = bits_float(bits & 0x7FFFFFFFu);
  // The midpoints between neighbours; a tie goes to the even code.
  std::uint8_t code;
  if (magnitude <= 0.25f) {
    code = 0;
  } else if (magnitude < 0.75f) {
    code = 1;
  } else if (magnitude <= 1.25f) {
    code = 2;
  } else if (magnitude < 1.75f) {
    code = 3;
  } else if (magnitude <= 2.5f) {
    code = 4;
  } else if (magnitude < 3.5f) {
    code = 5;
  } else if (magnitude <= 5.0f) {
    code = 6;
  } else {
    code = 7;
  }
  return sign | code;
}

ARBITER_HD inline float e2m1_to_float(std::uint8_t code) {
  constexpr float kMagnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float magnitude = kMagnitudes[code & 0x7u];
  return (code & 0x8u) ? -magnitude : magnitude;
}

ARBITER_HD constexpr std::uint8_t pack_e2m1(std::uint8_t even, std::uint8_t odd) {
  return static_cast<std::uint8_t>((even & 0xFu) | ((odd & 0xFu) << 4));
}

// The e4m3 scale factor of a block whose largest magnitude is `amax`.
ARBITER_HD inline std::uint8_t nvfp4_block_scale(float amax, float global_scale) {
  return float_to_e4m3(global_scale * (amax / kE2m1Max));
}

// What each value of a block with scale factor `sf` is multiplied by before
// rounding to e2m1.
ARBITER_HD inline float nvfp4_value_scale(std::uint8_t sf, float global_scale) {
  const float decoded = e4m3_to_float(sf);
  return decoded == 0.0f ? 0.0f : global_scale / decoded;
}

// The value an e2m1 code stands for, given its block's scale factor.
ARBITER_HD inline float nvfp4_dequantize(std::uint8_t code, std::uint8_t sf, float global_scale) {
  return e2m1_to_float(code) * e4m3_to_float(sf) / global_scale;
}

ARBITER_HD constexpr std::uint32_t nvfp4_blocks_per_row(std::uint32_t hidden) {
  return (hidden + kNvfp4BlockSize - 1) / kNvfp4BlockSize;
}

// Linear layout: rows x block_cols bytes.
ARBITER_HD constexpr std::size_t linear_scale_offset(std::uint32_t row, std::uint32_t block_col,
                                                     std::uint32_t block_cols) {
  return static_cast<std::size_t>(row) * block_cols + block_col;
}

// 128x4 swizzled layout: 128-row x 4-column tiles of 512 bytes, row-major over
// tiles; inside a tile, row m sits at (m % 32) * 16 + (m / 32) * 4 and
// column k at k. Rows pad to a multiple of 128, columns to a multiple of 4.
ARBITER_HD constexpr std::size_t swizzled_128x4_offset(std::uint32_t row, std::uint32_t block_col,
                                                       std::uint32_t block_cols) {
  const std::size_t column_tiles = (block_cols + 3) / 4;
  const std::size_t row_tile = row / 128;
  const std::size_t column_tile = block_col / 4;
  return row_tile * column_tiles * 512 + column_tile * 512 + (row % 32) * 16 +
         ((row % 128) / 32) * 4 + (block_col % 4);
}

// Bytes scale_out must hold for `rows` rows of `block_cols` scale factors.
ARBITER_HD constexpr std::size_t swizzled_128x4_bytes(std::uint32_t rows,
                                                      std::uint32_t block_cols) {
  return static_cast<std::size_t>((rows + 127) / 128) * 128 * ((block_cols + 3) / 4) * 4;
}

ARBITER_HD constexpr std::size_t linear_scale_bytes(std::uint32_t rows, std::uint32_t block_cols) {
  return static_cast<std::size_t>(rows) * block_cols;
}

ARBITER_HD constexpr std::size_t scale_offset(bool linear, std::uint32_t row,
                                              std::uint32_t block_col, std::uint32_t block_cols) {
  return linear ? linear_scale_offset(row, block_col, block_cols)
                : swizzled_128x4_offset(row, block_col, block_cols);
}

}  // namespace arbiter::common
