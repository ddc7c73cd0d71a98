// Words of the shared mapping accessed as atomics: the one-shot sequence
// lines (oneshot.cpp). Everything else in the mapping is plain memory,
// ordered by those words and by the barrier flags.
#pragma once

#include <atomic>
#include <cstddef>

namespace arbiter::shm {

template <class Word>
std::atomic_ref<Word> shared_word(std::byte* address) {
  return std::atomic_ref<Word>(*reinterpret_cast<Word*>(address));
}

}  // namespace arbiter::shm
