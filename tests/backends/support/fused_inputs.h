// Inputs of the fused all-reduce GPU tests, made on the host: uniform values
// salted with what looks like the Lamport sentinel (-0.0) or what
// flush-to-zero would turn into it (negative subnormals), and the host views
// the CPU reference reads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "arbiter/common/numeric.h"
#include "arbiter/common/sentinel.h"
#include "arbiter_backend.h"
#include "fused_call.h"
#include "parallel_for.h"

namespace arbiter::test {

// A subnormal of `dtype`: 16-bit types 0x0001-0x007F (0x8001-0x807F when
// negative), fp32 any non-zero mantissa.
inline std::uint32_t subnormal_bits(arbiter_dtype dtype, bool negative, std::uint32_t random) {
  if (dtype == ARBITER_DTYPE_FP32) {
    return (negative ? 0x80000000u : 0u) | (1u + random % 0x007FFFFFu);
  }
  return (negative ? 0x8000u : 0u) | (1u + random % 0x7Fu);
}

// `count` uniform values in [lo, hi). With salt_rank >= 0 some are replaced
// by -0.0 and by negative and positive subnormals, at positions that depend
// on the rank: no element is -0.0 on two ranks (3 x rank differs mod 61 for
// ranks < 16), so every sum has a term that is not -0.0 and one-shot and
// two-shot must agree bit for bit even where a module sanitises -0.0 on one
// path only.
inline Bytes random_elements(std::size_t count, arbiter_dtype dtype, float lo, float hi,
                             std::uint32_t seed, int salt_rank) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  Bytes out(count * common::dtype_size(dtype));
  const std::size_t r = salt_rank < 0 ? 0 : static_cast<std::size_t>(salt_rank);
  for (std::size_t i = 0; i < count; ++i) {
    std::uint32_t bits = common::float_to_dtype_bits(dist(rng), dtype);
    if (salt_rank >= 0) {
      if ((i + 3 * r) % 61 == 0) {
        bits = common::negative_zero_bits(dtype);
      } else if ((i + 5 * r) % 97 == 1) {
        bits = subnormal_bits(dtype, true, rng());
      } else if ((i + 7 * r) % 89 == 2) {
        bits = subnormal_bits(dtype, false, rng());
      }
    }
    common::store_bits(out.data(), i, dtype, bits);
  }
  return out;
}

// Host copies of a sweep's inputs for one dtype, max_tokens x max_hidden
// elements each: a tokens x hidden case reads the first tokens x hidden
// elements (the same prefix on the device), so one upload serves every shape.
struct HostInputs {
  std::vector<Bytes> ranks;  // `ranks` of them; a group of ws ranks uses the first ws
  Bytes residual;            // the same on every rank, as in a model
  Bytes gamma;               // max_hidden elements
};

inline HostInputs make_inputs(arbiter_dtype dtype, int ranks, std::uint32_t max_tokens,
                              std::uint32_t max_hidden) {
  const std::size_t count = std::size_t{max_tokens} * max_hidden;
  const std::uint32_t seed = 1000u * (static_cast<std::uint32_t>(dtype) + 1);
  const auto n = static_cast<std::size_t>(ranks);
  HostInputs in;
  in.ranks.resize(n);
  parallel_for(n + 1, [&](std::size_t k) {
    if (k < n) {
      in.ranks[k] = random_elements(count, dtype, -1.0f, 1.0f, seed + static_cast<std::uint32_t>(k),
                                    static_cast<int>(k));
    } else {
      in.residual = random_elements(count, dtype, -1.0f, 1.0f, seed + 100, -1);
    }
  });
  // Around 0 and around 1: fits weight_bias 0 and Gemma's 1 alike.
  in.gamma = random_elements(max_hidden, dtype, -0.5f, 1.5f, seed + 200, -1);
  return in;
}

// Host pointers to what one call reads (row-major tokens x hidden).
struct HostView {
  std::vector<const std::uint8_t*> inputs;  // one per rank
  const std::uint8_t* residual = nullptr;
  const std::uint8_t* gamma = nullptr;
};

// Payloads that look like the Lamport sentinel, or that flush-to-zero would
// turn into it, on every rank at once. Per token (mod 5):
//  0: -0.0 everywhere (token 0 with a -0.0 residual too);
//  1: negative subnormals;  2: positive subnormals;
//  3: -0.0, negative and positive subnormals and normal values interleaved
//     differently on each rank;
//  4: negative subnormals with a +0.0 residual (a subnormal norm input).
// Every element of tokens 0 is -0.0 on every rank, so its sum is a zero of
// either sign where a module sends +0.0 for -0.0 on one path only.
struct SaltedInputs {
  std::vector<Bytes> ranks;
  Bytes residual;
};

inline SaltedInputs make_salted_inputs(arbiter_dtype d, int world_size, std::uint32_t tokens,
                                       std::uint32_t hidden, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const std::size_t bytes = std::size_t{tokens} * hidden * common::dtype_size(d);
  SaltedInputs in;
  in.ranks.assign(world_size, Bytes(bytes));
  in.residual.resize(bytes);
  const std::uint32_t minus_zero = common::negative_zero_bits(d);
  for (std::uint32_t t = 0; t < tokens; ++t) {
    for (std::uint32_t i = 0; i < hidden; ++i) {
      const std::size_t at = std::size_t{t} * hidden + i;
      for (int r = 0; r < world_size; ++r) {
        std::uint32_t bits = 0;
        switch (t % 5) {
          case 0:
            bits = minus_zero;
            break;
          case 1:
          case 4:
            bits = subnormal_bits(d, true, rng());
            break;
          case 2:
            bits = subnormal_bits(d, false, rng());
            break;
          default:
            switch ((i + static_cast<std::uint32_t>(r)) % 4) {
              case 0:
                bits = minus_zero;
                break;
              case 1:
                bits = subnormal_bits(d, true, rng());
                break;
              case 2:
                bits = subnormal_bits(d, false, rng());
                break;
              default:
                bits = common::float_to_dtype_bits(dist(rng), d);
            }
        }
        common::store_bits(in.ranks[r].data(), at, d, bits);
      }
      const std::uint32_t res = t == 0       ? minus_zero
                                : t % 5 == 4 ? 0u
                                             : common::float_to_dtype_bits(dist(rng), d);
      common::store_bits(in.residual.data(), at, d, res);
    }
  }
  return in;
}

}  // namespace arbiter::test
