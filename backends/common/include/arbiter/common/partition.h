// Two-shot token slices: rank r owns tokens [slice_begin(r), slice_end(r)).
//
// Slices are contiguous and in rank order, their sizes differ by at most one
// (the first tokens % world_size ranks take one more), and every token is
// owned exactly once. With fewer tokens than ranks the last slices are empty.
#pragma once

#include <cstdint>

#include "arbiter/common/host_device.h"

namespace arbiter::common {

// REQUIRES: world_size > 0, rank <= world_size (rank == world_size gives tokens).
ARBITER_HD constexpr std::uint32_t slice_begin(std::uint32_t tokens, std::uint32_t world_size,
                                               std::uint32_t rank) {
  const std::uint32_t per_rank = tokens / world_size;
  const std::uint32_t remainder = tokens % world_size;
  return rank * per_rank + (rank < remainder ? rank : remainder);
}

ARBITER_HD constexpr std::uint32_t slice_end(std::uint32_t tokens, std::uint32_t world_size,
                                             std::uint32_t rank) {
  return slice_begin(tokens, world_size, rank + 1);
}

// The rank whose slice holds `token`. REQUIRES: token < tokens.
ARBITER_HD constexpr std::uint32_t slice_owner(std::uint32_t tokens, std::uint32_t world_size,
                                               std::uint32_t token) {
  const std::uint32_t per_rank = tokens / world_size;
  const std::uint32_t remainder = tokens % world_size;
  const std::uint32_t big = remainder * (per_rank + 1);  // tokens of the larger slices
  return token < big ? token / (per_rank + 1) : remainder + (token - big) / per_rank;
}

}  // namespace arbiter::common
