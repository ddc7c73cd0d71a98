// Tokens [first, first + count) of a call as a call of their own: the norm is
// per token, so a slice of whole tokens is a complete call. Used to run a
// call larger than a workspace in pieces (the shm module streams through its
// slots; the communicator slices for fixed-capacity fallbacks).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "arbiter/common/numeric.h"
#include "arbiter_backend.h"

namespace arbiter::common {

namespace detail {

inline const void* advanced(const void* p, std::size_t bytes) {
  return p == nullptr ? nullptr : static_cast<const std::byte*>(p) + bytes;
}
inline void* advanced(void* p, std::size_t bytes) {
  return p == nullptr ? nullptr : static_cast<std::byte*>(p) + bytes;
}

}  // namespace detail

// REQUIRES: a valid dtype, first + count <= call.tokens, and a pattern other
// than NVFP4 (its swizzled scale_out does not slice by token; callers refuse
// it). quant_out holds one byte per element (FP8).
inline arbiter_allreduce_args token_slice(const arbiter_allreduce_args& call, std::uint32_t first,
                                          std::uint32_t count) {
  const std::size_t row_bytes = std::size_t{call.hidden} * dtype_size(call.dtype);
  const std::size_t offset = std::size_t{first} * row_bytes;
  arbiter_allreduce_args slice = call;
  slice.tokens = count;
  slice.input = detail::advanced(call.input, offset);
  slice.allreduce_out = detail::advanced(call.allreduce_out, offset);
  slice.residual_in = detail::advanced(call.residual_in, offset);
  slice.residual_out = detail::advanced(call.residual_out, offset);
  slice.norm_out = detail::advanced(call.norm_out, offset);
  slice.quant_out = detail::advanced(call.quant_out, std::size_t{first} * call.hidden);
  return slice;
}

// Calls fn(slice) for the consecutive slices of at most `per_slice` (> 0)
// tokens that cover `call`, in order, while fn returns true; returns whether
// every slice ran. Each step advances by the slice's own length, so a call of
// up to 2^32 - 1 tokens ends whatever `per_slice` is (stepping by per_slice
// would wrap past 2^32 and start over).
template <class Fn>
bool for_each_token_slice(const arbiter_allreduce_args& call, std::uint64_t per_slice, Fn&& fn) {
  for (std::uint32_t done = 0; done < call.tokens;) {
    const auto count =
        static_cast<std::uint32_t>(std::min<std::uint64_t>(per_slice, call.tokens - done));
    if (!fn(token_slice(call, done, count))) return false;
    done += count;
  }
  return true;
}

}  // namespace arbiter::common
