// Words of the shared mapping as atomics (the one-shot sequence lines), and
// the sanitising copy into a two-shot / native input slot: one 64-bit word
// (or one element, for the tail) at a time, every -0.0 replaced by +0.0.
// Those slots are read only after a barrier.
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

}  // namespace arbiter::shm
