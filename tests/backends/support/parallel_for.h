// parallel_for(count, body): body(0 .. count - 1) on up to one thread per
// core, for the host side of the GPU tests (input generation, reference
// checks, downloads). body must be safe to call from several threads.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <thread>
#include <vector>

namespace arbiter::test {

template <class Body>
void parallel_for(std::size_t count, const Body& body) {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const std::size_t workers = std::min<std::size_t>(cores, count);
  if (workers <= 1) {
    for (std::size_t i = 0; i < count; ++i) body(i);
    return;
  }
  std::atomic<std::size_t> next{0};
  std::vector<std::thread> threads;
  for (std::size_t w = 0; w < workers; ++w) {
    threads.emplace_back([&] {
      for (std::size_t i = next.fetch_add(1); i < count; i = next.fetch_add(1)) body(i);
    });
  }
  for (std::thread& t : threads) t.join();
}

}  // namespace arbiter::test
