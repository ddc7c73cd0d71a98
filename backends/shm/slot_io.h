// Moving messages in and out of shared slots one 64-bit word (or one
// element, for the tail) at a time, each word a single atomic access.
//
// Peers poll one-shot slots while their owner writes them, so a word must
// never be seen half written: memcpy may copy byte by byte and show a reader
// the high byte of a new element next to the low byte of -0.0. Element
// boundaries never straddle a word (slots are 64-byte aligned, elements 2 or
// 4 bytes), so word-atomic means element-atomic.
#pragma once

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "arbiter/common/numeric.h"
#include "arbiter/common/sentinel.h"
#include "arbiter_backend.h"

namespace arbiter::shm {

static_assert(std::endian::native == std::endian::little,
              "element k of a word is its k-th lowest lane");

template <class Word>
std::atomic_ref<Word> shared_word(std::byte* address) {
  return std::atomic_ref<Word>(*reinterpret_cast<Word*>(address));
}

// Writes `bytes` of `source` to `slot` with every -0.0 replaced by +0.0,
// each word with release order: a peer that reads a word (acquire) also sees
// everything this rank wrote before the call, such as slot clears.
inline void write_sanitized(std::byte* slot, const void* source, std::uint64_t bytes,
                            arbiter_dtype dtype) {
  const auto* in = static_cast<const std::byte*>(source);
  const std::uint64_t words = bytes / 8;
  for (std::uint64_t w = 0; w < words; ++w) {
    std::uint64_t word;
    std::memcpy(&word, in + w * 8, 8);  // the caller's buffer may be unaligned
    shared_word<std::uint64_t>(slot + w * 8)
        .store(common::sanitize_word(word, dtype), std::memory_order_release);
  }
  const std::size_t element = common::dtype_size(dtype);
  for (std::uint64_t offset = words * 8; offset < bytes; offset += element) {
    if (element == 4) {
      std::uint32_t value;
      std::memcpy(&value, in + offset, 4);
      shared_word<std::uint32_t>(slot + offset)
          .store(common::sanitize_bits32(value), std::memory_order_release);
    } else {
      std::uint16_t value;
      std::memcpy(&value, in + offset, 2);
      shared_word<std::uint16_t>(slot + offset)
          .store(common::sanitize_bits16(value), std::memory_order_release);
    }
  }
}

// Resets `bytes` of `slot` to the dtype's -0.0.
inline void clear_slot(std::byte* slot, std::uint64_t bytes, arbiter_dtype dtype) {
  const std::uint64_t fill = common::negative_zero_word(dtype);
  const std::uint64_t words = bytes / 8;
  for (std::uint64_t w = 0; w < words; ++w) {
    shared_word<std::uint64_t>(slot + w * 8).store(fill, std::memory_order_relaxed);
  }
  const std::size_t element = common::dtype_size(dtype);
  for (std::uint64_t offset = words * 8; offset < bytes; offset += element) {
    if (element == 4) {
      shared_word<std::uint32_t>(slot + offset)
          .store(common::kNegativeZeroBits32, std::memory_order_relaxed);
    } else {
      shared_word<std::uint16_t>(slot + offset)
          .store(common::kNegativeZeroBits16, std::memory_order_relaxed);
    }
  }
}

// The elements of a word as floats, lowest lane first; returns the count.
inline int decode_word(std::uint64_t word, arbiter_dtype dtype, float* out) {
  if (dtype == ARBITER_DTYPE_FP32) {
    out[0] = common::bits_float(static_cast<std::uint32_t>(word));
    out[1] = common::bits_float(static_cast<std::uint32_t>(word >> 32));
    return 2;
  }
  for (int lane = 0; lane < 4; ++lane) {
    out[lane] = common::dtype_bits_to_float(static_cast<std::uint16_t>(word >> (16 * lane)), dtype);
  }
  return 4;
}

}  // namespace arbiter::shm
