// A registered call's input among a module's registered allocations (ABI
// v2), found alike in every module: the allocation that holds the whole
// input, or why none does; and the key that names allocation and offset
// across ranks. Host only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace arbiter::common {

// Offsets below 2^40 (modules cap a part at 1 TiB); serial + 1 is never 0,
// so 0 can mean "not registered".
inline std::uint64_t registered_key(std::uint64_t serial, std::uint64_t offset) {
  return ((serial + 1) << 40) | offset;
}

// The allocation of `allocations` (each with `local`, this rank's part, and
// `bytes`) for which `usable(a)` holds and that holds [pointer, pointer +
// bytes), or nullptr with `why` set.
template <typename Allocation, typename Usable>
const Allocation* find_registered(const std::vector<Allocation>& allocations, const void* pointer,
                                  std::uint64_t bytes, std::string& why, Usable usable) {
  const auto* p = static_cast<const std::byte*>(pointer);
  for (const Allocation& a : allocations) {
    const auto* local = reinterpret_cast<const std::byte*>(a.local);
    if (!usable(a) || p < local || p >= local + a.bytes) continue;
    const auto offset = static_cast<std::uint64_t>(p - local);
    if (bytes > a.bytes - offset) {
      why = "the registered input (" + std::to_string(bytes) + " bytes at offset " +
            std::to_string(offset) + ") crosses the end of its allocation of " +
            std::to_string(a.bytes) + " bytes; pass a view that lies inside it";
      return nullptr;
    }
    return &a;
  }
  why =
      "the input is not in memory registered with this workspace (allocate it with this "
      "communicator: arbiter_comm_alloc, alloc_registered(), Python's empty(); or make an "
      "unregistered call)";
  return nullptr;
}

}  // namespace arbiter::common
