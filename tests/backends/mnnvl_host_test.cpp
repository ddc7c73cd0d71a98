// The mnnvl backend's host-side arithmetic: the workspace layout the kernels
// index (three Lamport buffers, each a scatter and a broadcast area), the
// per-call capacities and clear ranges, and the guards that refuse a call
// before it can overrun every peer's memory through the multicast mapping.
#define BOOST_TEST_MODULE backends_mnnvl_host
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <set>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "arbiter/common/numeric.h"
#include "arbiter/common/sentinel.h"
#include "arbiter/common/stages.h"
#include "arbiter/mnnvl/guards.h"
#include "arbiter/mnnvl/workspace_layout.h"
#include "guard_args.h"

using namespace arbiter::mnnvl;
using arbiter::common::dtype_size;

namespace {

const std::vector<arbiter_dtype> kDtypes = {ARBITER_DTYPE_FP16, ARBITER_DTYPE_BF16,
                                            ARBITER_DTYPE_FP32};
const std::vector<std::uint32_t> kHiddens = {1024, 2880, 4096, 7168, 8192};
constexpr std::uint64_t kKiB = std::uint64_t{1} << 10;
constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;

bool contains(const std::string& text, const std::string& words) {
  return text.find(words) != std::string::npos;
}

std::uint64_t round_up_128(std::uint64_t v) { return (v + 127) / 128 * 128; }

WorkspaceLayout layout_or_fail(int ws, std::uint64_t max_bytes, arbiter_dtype dtype,
                               std::uint64_t max_tokens = 1u << 20, std::uint64_t hidden = 8192) {
  const Result<WorkspaceLayout> r = make_workspace_layout(ws, max_bytes, dtype, max_tokens, hidden);
  BOOST_REQUIRE_MESSAGE(r.ok(), r.status().message());
  return r.value();
}

// A valid residual_rmsnorm call (support/guard_args.h).
arbiter_allreduce_args valid_args(std::uint32_t tokens, std::uint32_t hidden, arbiter_dtype dtype,
                                  arbiter_algorithm algorithm = ARBITER_ALGORITHM_ONESHOT) {
  return arbiter::test::valid_guard_args(tokens, hidden, dtype, algorithm);
}

void check_refused(const Status& s, arbiter_status code, const std::string& words) {
  BOOST_TEST(!s.ok());
  BOOST_TEST(s.code() == code);
  BOOST_TEST(contains(s.message(), "mnnvl: "),
             "message \"" << s.message() << "\" lacks its prefix");
  BOOST_TEST(contains(s.message(), words),
             "message \"" << s.message() << "\" lacks \"" << words << "\"");
}

}  // namespace

// ------------------------------------------------------------ workspace layout

BOOST_AUTO_TEST_CASE(regions_are_aligned_contiguous_and_sum_to_the_total_for_world_sizes_2_to_64) {
  for (int ws = 2; ws <= 64; ++ws) {
    for (const arbiter_dtype dtype : kDtypes) {
      for (const std::uint64_t bytes :
           {std::uint64_t{16}, std::uint64_t{1000}, kMiB, 64 * kMiB + 48, 512 * kMiB}) {
        for (const std::uint64_t hidden : {std::uint64_t{1024}, std::uint64_t{2880}}) {
          BOOST_TEST_CONTEXT("ws " << ws << " dtype " << dtype << " max bytes " << bytes
                                   << " hidden " << hidden) {
            const WorkspaceLayout l = layout_or_fail(ws, bytes, dtype, 1u << 20, hidden);
            const std::uint64_t row = hidden * dtype_size(dtype);
            BOOST_TEST(l.world_size == static_cast<std::uint32_t>(ws));
            BOOST_TEST(l.dtype == dtype);
            BOOST_TEST(l.row_bytes == row);
            BOOST_TEST(l.message_capacity == bytes);
            BOOST_TEST(l.control_offset == 0u);
            BOOST_TEST(l.control_bytes == 128u);
            BOOST_TEST(l.buffers_offset == 128u);
            BOOST_TEST(l.scatter_bytes == round_up_128(bytes + ws * row));
            BOOST_TEST(l.broadcast_bytes == round_up_128(bytes));
            BOOST_TEST(l.buffer_bytes == l.scatter_bytes + l.broadcast_bytes);
            BOOST_TEST(l.buffers_bytes == 3 * l.buffer_bytes);
            BOOST_TEST(l.total_bytes == 128 + 3 * l.buffer_bytes);
            // Contiguous: control, then buffer 0's scatter and broadcast areas,
            // then buffer 1, ... ending exactly at the total.
            BOOST_TEST(l.buffer_offset(0) == l.control_offset + l.control_bytes);
            for (std::uint32_t b = 0; b < 3; ++b) {
              BOOST_TEST(l.scatter_offset(b) == l.buffer_offset(b));
              BOOST_TEST(l.broadcast_offset(b) == l.scatter_offset(b) + l.scatter_bytes);
              BOOST_TEST(l.buffer_offset(b + 1) == l.broadcast_offset(b) + l.broadcast_bytes);
              BOOST_TEST(l.scatter_offset(b) % 128 == 0u);
              BOOST_TEST(l.broadcast_offset(b) % 128 == 0u);
            }
            BOOST_TEST(l.buffer_offset(3) == l.total_bytes);
            BOOST_TEST(l.total_bytes % 128 == 0u);
          }
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(message_capacity_is_the_smaller_of_max_message_bytes_and_the_largest_call) {
  // 2048 tokens x 7168 bf16 = 28 MiB < 64 MiB.
  const WorkspaceLayout l = layout_or_fail(8, 64 * kMiB, ARBITER_DTYPE_BF16, 2048, 7168);
  BOOST_TEST(l.message_capacity == 28 * kMiB);
  BOOST_TEST(l.scatter_bytes == 28 * kMiB + 8 * 7168 * 2);
  BOOST_TEST(l.broadcast_bytes == 28 * kMiB);
  const WorkspaceLayout m = layout_or_fail(8, 4 * kMiB, ARBITER_DTYPE_BF16, 2048, 7168);
  BOOST_TEST(m.message_capacity == 4 * kMiB);
  // max_tokens x hidden overflowing 64 bits just leaves max_message_bytes in charge.
  const WorkspaceLayout big =
      layout_or_fail(2, kMiB, ARBITER_DTYPE_FP32, std::uint64_t{1} << 50, std::uint64_t{1} << 20);
  BOOST_TEST(big.message_capacity == kMiB);
  BOOST_TEST(big.scatter_bytes == kMiB + 2 * (std::uint64_t{1} << 22));
}

BOOST_AUTO_TEST_CASE(compute_workspace_layout_is_constexpr) {
  constexpr auto layout = [] {
    WorkspaceLayout l;
    compute_workspace_layout(16, kMiB, ARBITER_DTYPE_BF16, 4096, 4096, &l);
    return l;
  }();
  static_assert(layout.scatter_bytes == kMiB + 16 * 8192);
  static_assert(layout.broadcast_bytes == kMiB);
  static_assert(per_call_capacity(layout, ARBITER_ALGORITHM_ONESHOT) ==
                (2 * kMiB + 16 * 8192) / 16 / 16 * 16);
  BOOST_TEST(layout.total_bytes == 128 + 3 * (2 * kMiB + 16 * 8192));
}

BOOST_AUTO_TEST_CASE(one_shot_capacity_is_a_world_size_th_of_one_buffer_never_of_the_workspace) {
  for (int ws = 2; ws <= 64; ++ws) {
    for (const arbiter_dtype dtype : kDtypes) {
      for (const std::uint64_t bytes : {std::uint64_t{1000}, kMiB, 64 * kMiB + 48}) {
        BOOST_TEST_CONTEXT("ws " << ws << " dtype " << dtype << " max bytes " << bytes) {
          const WorkspaceLayout l = layout_or_fail(ws, bytes, dtype, 1u << 20, 4096);
          const std::uint64_t cap = per_call_capacity(l, ARBITER_ALGORITHM_ONESHOT);
          BOOST_TEST(cap % 16 == 0u);
          // ws slots of cap fill at most one buffer of three...
          BOOST_TEST(cap * ws <= l.buffer_bytes);
          BOOST_TEST((cap + 16) * ws > l.buffer_bytes);
          BOOST_TEST(l.oneshot_slot_offset(2, ws - 1, cap) + cap <=
                     l.buffer_offset(2) + l.buffer_bytes);
          // ...so it is a third of what dividing the whole workspace would give
          // (vLLM #50932), and that larger size must never be admitted.
          const std::uint64_t whole = (l.total_bytes / ws) / 16 * 16;
          BOOST_TEST(cap < whole);
          BOOST_TEST(cap * 3 <= whole + 48);
        }
      }
    }
  }
  // Two-shot: M, which both areas hold.
  const WorkspaceLayout l = layout_or_fail(16, kMiB, ARBITER_DTYPE_BF16, 4096, 4096);
  BOOST_TEST(per_call_capacity(l, ARBITER_ALGORITHM_TWOSHOT) == kMiB);
  BOOST_TEST(per_call_capacity(l, ARBITER_ALGORITHM_NATIVE) == 0u);
  BOOST_TEST(per_call_capacity(WorkspaceLayout{}, ARBITER_ALGORITHM_ONESHOT) == 0u);
}

BOOST_AUTO_TEST_CASE(a_message_sized_by_the_whole_workspace_is_refused) {
  // vLLM #50932 took the workspace size over ws as the one-shot limit; the
  // call it admitted overruns the buffer in use.
  const WorkspaceLayout l = layout_or_fail(16, kMiB, ARBITER_DTYPE_BF16, 4096, 4096);
  const std::uint32_t row = 4096 * 2;
  const auto tokens_for = [&](std::uint64_t bytes) {
    return static_cast<std::uint32_t>(bytes / row);
  };
  arbiter_allreduce_args fits = valid_args(
      tokens_for(per_call_capacity(l, ARBITER_ALGORITHM_ONESHOT)), 4096, ARBITER_DTYPE_BF16);
  BOOST_TEST(check_call(l, &fits, 100).ok());
  arbiter_allreduce_args whole =
      valid_args(tokens_for(l.total_bytes / 16), 4096, ARBITER_DTYPE_BF16);
  check_refused(check_call(l, &whole, 100), ARBITER_UNSUPPORTED, "use two-shot");
}

BOOST_AUTO_TEST_CASE(two_shot_scatter_rows_fit_for_every_token_count_up_to_the_capacity) {
  for (const std::uint32_t ws : {2u, 3u, 4u, 7u, 8u, 12u, 16u, 64u}) {
    for (const arbiter_dtype dtype : kDtypes) {
      const std::uint64_t hidden = 2880;
      const std::uint64_t row = hidden * dtype_size(dtype);
      const std::uint64_t max_tokens = 300;
      const WorkspaceLayout l =
          layout_or_fail(static_cast<int>(ws), 64 * kMiB, dtype, max_tokens, hidden);
      BOOST_TEST_CONTEXT("ws " << ws << " dtype " << dtype) {
        BOOST_TEST(l.message_capacity == max_tokens * row);
        for (std::uint32_t t = 1; t * row <= l.message_capacity; ++t) {
          const std::uint64_t need = twoshot_scatter_bytes(ws, t, row);
          BOOST_TEST(need == ws * ((t + ws - 1) / ws) * row);
          BOOST_TEST(need <= l.scatter_bytes, "tokens " << t);
          BOOST_TEST(t * row <= l.broadcast_bytes);
          // The last row written (sender ws-1, the highest token) ends inside the area.
          const std::uint64_t end = l.scatter_row_offset(1, ws - 1, t - 1, t, row) + row;
          BOOST_TEST(end <= l.scatter_offset(1) + need);
          BOOST_TEST(l.broadcast_row_offset(1, t - 1, row) + row <=
                     l.broadcast_offset(1) + l.broadcast_bytes);
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(two_shot_rows_are_distinct_per_owner_for_a_token_count_not_divisible_by_ws) {
  // 17 tokens over 16 ranks: ceil = 2 rows per sender; owner 0 gets tokens 0
  // and 16, owner 1..15 one token each.
  const std::uint32_t ws = 16;
  const std::uint32_t tokens = 17;
  const std::uint64_t row = 8192;
  const WorkspaceLayout l = layout_or_fail(16, kMiB, ARBITER_DTYPE_BF16, 4096, 4096);
  BOOST_TEST(twoshot_rows_per_rank(tokens, ws) == 2u);
  BOOST_TEST(twoshot_scatter_bytes(ws, tokens, row) == 16u * 2 * 8192);
  std::vector<std::set<std::uint64_t>> rows(ws);
  for (std::uint32_t sender = 0; sender < ws; ++sender) {
    for (std::uint32_t t = 0; t < tokens; ++t) {
      const std::uint32_t owner = twoshot_owner(t, ws);
      const std::uint64_t offset = l.scatter_row_offset(0, sender, t, tokens, row);
      BOOST_TEST(offset == l.scatter_offset(0) + (sender * 2 + t / ws) * row);
      BOOST_TEST(rows[owner].insert(offset).second, "sender " << sender << " token " << t);
      BOOST_TEST(offset + row <= l.scatter_offset(0) + twoshot_scatter_bytes(ws, tokens, row));
    }
  }
  BOOST_TEST(rows[0].size() == 32u);  // two tokens from each of 16 senders
  BOOST_TEST(rows[1].size() == 16u);
}

BOOST_AUTO_TEST_CASE(clear_ranges_are_what_each_call_writes) {
  const ClearRanges one = oneshot_clear_ranges(16, 3 * 8192);
  BOOST_TEST(one.scatter_bytes == 16u * 3 * 8192);
  BOOST_TEST(one.broadcast_bytes == 0u);
  const ClearRanges two = twoshot_clear_ranges(16, 17, 8192);
  BOOST_TEST(two.scatter_bytes == 16u * 2 * 8192);
  BOOST_TEST(two.broadcast_bytes == 17u * 8192);
  // For every admitted call the ranges stay inside the buffer (one-shot: from
  // its start, running on into the broadcast area) or their area (two-shot).
  for (const std::uint32_t ws : {2u, 5u, 16u, 64u}) {
    const WorkspaceLayout l =
        layout_or_fail(static_cast<int>(ws), 4 * kMiB, ARBITER_DTYPE_BF16, 1u << 20, 4096);
    for (std::uint32_t t = 1; t <= 600; ++t) {
      arbiter_allreduce_args a = valid_args(t, 4096, ARBITER_DTYPE_BF16);
      if (check_call(l, &a, 100).ok()) {
        BOOST_TEST(oneshot_clear_ranges(ws, t * 8192ull).scatter_bytes <= l.buffer_bytes);
      }
      a.algorithm = ARBITER_ALGORITHM_TWOSHOT;
      if (check_call(l, &a, 100).ok()) {
        const ClearRanges c = twoshot_clear_ranges(ws, t, 8192);
        BOOST_TEST(c.scatter_bytes <= l.scatter_bytes);
        BOOST_TEST(c.broadcast_bytes <= l.broadcast_bytes);
        BOOST_TEST(c.scatter_bytes % 16 == 0u);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(the_control_block_fits_starts_zeroed_and_may_live_in_shared_memory) {
  static_assert(sizeof(ControlBlock) <= 128);
  static_assert(std::is_trivial_v<ControlBlock> && std::is_trivial_v<ClearRanges>);
  const ControlBlock c{};
  BOOST_TEST(c.buffer == 0u);
  BOOST_TEST(c.arrivals == 0u);
  BOOST_TEST(c.clear.scatter_bytes == 0u);
  BOOST_TEST(c.clear.broadcast_bytes == 0u);
  // The next call of buffer b resets b: stage_to_clear(next_stage(b)) == b.
  for (std::uint32_t b = 0; b < 3; ++b) {
    BOOST_TEST(arbiter::common::stage_to_clear(arbiter::common::next_stage(b)) == b);
  }
}

BOOST_AUTO_TEST_CASE(no_sanitised_payload_word_equals_the_sentinel) {
  BOOST_TEST(kLamportSentinel == 0x80000000u);
  BOOST_TEST(is_sentinel(0x80000000u));
  BOOST_TEST(!is_sentinel(0x00000000u));
  BOOST_TEST(!is_sentinel(0x80000001u));  // fp32 negative subnormal: data, not the sentinel
  // fp32: the word is the element; -0.0 is sanitised away.
  BOOST_TEST(arbiter::common::sanitize_bits32(0x80000000u) == 0u);
  // fp16/bf16: a word is (high element << 16) | low element. Only a high
  // element of 0x8000 could make the sentinel, and sanitising removes it.
  for (std::uint32_t high = 0; high <= 0xFFFF; ++high) {
    for (const std::uint32_t low : {0x0000u, 0x8000u, 0x0001u, 0x8001u}) {
      const std::uint32_t word =
          (std::uint32_t{arbiter::common::sanitize_bits16(static_cast<std::uint16_t>(high))}
           << 16) |
          arbiter::common::sanitize_bits16(static_cast<std::uint16_t>(low));
      if (is_sentinel(word)) BOOST_FAIL("high " << high << " low " << low);
    }
  }
}

BOOST_AUTO_TEST_CASE(allocation_bytes_rounds_the_total_up_to_the_granularity) {
  BOOST_TEST(allocation_bytes(1, 2 * kMiB) == 2 * kMiB);
  BOOST_TEST(allocation_bytes(2 * kMiB, 2 * kMiB) == 2 * kMiB);
  BOOST_TEST(allocation_bytes(2 * kMiB + 128, 2 * kMiB) == 4 * kMiB);
  BOOST_TEST(allocation_bytes(1000, 384) == 1152u);  // not a power of two
  BOOST_TEST(allocation_bytes(1000, 0) == 0u);
  BOOST_TEST(allocation_bytes(~std::uint64_t{0} - 5, 2 * kMiB) == 0u);
  const WorkspaceLayout l = layout_or_fail(16, 64 * kMiB, ARBITER_DTYPE_BF16, 2048, 7168);
  const std::uint64_t a = allocation_bytes(l.total_bytes, 2 * kMiB);
  BOOST_TEST(a >= l.total_bytes);
  BOOST_TEST(a - l.total_bytes < 2 * kMiB);
  BOOST_TEST(a % (2 * kMiB) == 0u);
}

BOOST_AUTO_TEST_CASE(bad_specs_are_refused_with_what_to_lower) {
  for (const int ws : {-1, 0, 1, 65, 72}) {
    const Result<WorkspaceLayout> r = make_workspace_layout(ws, kMiB, ARBITER_DTYPE_BF16, 16, 1024);
    BOOST_TEST(r.status().code() == ARBITER_UNSUPPORTED);
    BOOST_TEST(
        contains(r.status().message(), "world size " + std::to_string(ws) + " is not in 2..64"),
        r.status().message());
  }
  BOOST_TEST(make_workspace_layout(64, kMiB, ARBITER_DTYPE_BF16, 16, 1024).ok());
  BOOST_TEST(make_workspace_layout(3, kMiB, ARBITER_DTYPE_BF16, 16, 1024).ok());
  BOOST_TEST(contains(make_workspace_layout(8, kMiB, 3, 16, 1024).status().message(),
                      "dtype 3 is not fp16, bf16 or fp32"));
  const std::tuple<std::uint64_t, std::uint64_t, std::uint64_t> zeros[] = {
      {0, 16, 1024}, {kMiB, 0, 1024}, {kMiB, 16, 0}};
  for (const auto& [bytes, tokens, hidden] : zeros) {
    const Result<WorkspaceLayout> r =
        make_workspace_layout(8, bytes, ARBITER_DTYPE_BF16, tokens, hidden);
    BOOST_TEST(r.status().code() == ARBITER_INVALID_ARGUMENT);
    BOOST_TEST(contains(r.status().message(), "must all be > 0"));
  }
}

BOOST_AUTO_TEST_CASE(absurd_sizes_are_refused_not_wrapped) {
  const std::uint64_t tib = std::uint64_t{1} << 40;
  const std::uint64_t huge = ~std::uint64_t{0};
  // M itself above 2^40.
  Result<WorkspaceLayout> r = make_workspace_layout(2, 2 * tib, ARBITER_DTYPE_BF16, huge, 8192);
  BOOST_TEST(r.status().code() == ARBITER_UNSUPPORTED);
  BOOST_TEST(contains(r.status().message(),
                      "exceeds 1099511627776 bytes; lower max_message_bytes "
                      "or max_tokens"),
             r.status().message());
  // M = 2^40 exactly: the buffer (scatter + broadcast) is larger still.
  r = make_workspace_layout(2, tib, ARBITER_DTYPE_BF16, huge, 8192);
  BOOST_TEST(contains(r.status().message(), "lower max_message_bytes or max_tokens"));
  // A buffer just below the limit is fine: M = 2^39 - 2^20, padding 2 x 16 KiB.
  r = make_workspace_layout(2, tib / 2 - kMiB, ARBITER_DTYPE_BF16, huge, 8192);
  BOOST_TEST(r.ok(), r.status().message());
  BOOST_TEST(r.value().buffer_bytes <= tib);
  // max_message_bytes of 2^64 - 1 with a small largest call is just that call.
  r = make_workspace_layout(64, huge, ARBITER_DTYPE_FP32, 8, 1024);
  BOOST_TEST(r.ok());
  BOOST_TEST(r.value().message_capacity == 8u * 1024 * 4);
  // A hidden whose row or world-size padding does not fit in 64 bits.
  const std::pair<int, std::uint64_t> overflowing[] = {{2, std::uint64_t{1} << 63},
                                                       {64, std::uint64_t{1} << 58}};
  for (const auto& [ws, hidden] : overflowing) {
    r = make_workspace_layout(ws, kMiB, ARBITER_DTYPE_FP32, 1, hidden);
    BOOST_TEST(r.status().code() == ARBITER_UNSUPPORTED);
    BOOST_TEST(contains(r.status().message(), "overflows 64 bits; lower hidden"),
               r.status().message());
  }
  // A large but representable padding is a buffer too big, not an overflow.
  r = make_workspace_layout(2, kMiB, ARBITER_DTYPE_FP32, 1, std::uint64_t{1} << 40);
  BOOST_TEST(contains(r.status().message(), "exceeds 1099511627776 bytes"), r.status().message());
  WorkspaceLayout untouched;
  untouched.total_bytes = 7;
  BOOST_TEST((compute_workspace_layout(2, kMiB, ARBITER_DTYPE_FP32, 1, std::uint64_t{1} << 63,
                                       &untouched) == LayoutError::kOverflow));
  BOOST_TEST(untouched.total_bytes == 7u);
}

// ------------------------------------------------------------------- guards

BOOST_AUTO_TEST_CASE(a_valid_call_passes_the_guards) {
  for (const int ws : {2, 3, 4, 8, 12, 16, 32, 64}) {
    const WorkspaceLayout l = layout_or_fail(ws, 64 * kMiB, ARBITER_DTYPE_BF16, 4096, 8192);
    for (const std::uint32_t hidden : kHiddens) {
      for (const std::uint32_t tokens : {1u, 3u, 7u}) {
        BOOST_TEST_CONTEXT("ws " << ws << " hidden " << hidden << " tokens " << tokens) {
          arbiter_allreduce_args one = valid_args(tokens, hidden, ARBITER_DTYPE_BF16);
          const Status s = check_call(l, &one, 100);
          BOOST_TEST(s.ok(), s.message());
          // Two-shot runs with fewer tokens than ranks too (owners idle).
          arbiter_allreduce_args two =
              valid_args(tokens, hidden, ARBITER_DTYPE_BF16, ARBITER_ALGORITHM_TWOSHOT);
          const Status t = check_call(l, &two, 100);
          BOOST_TEST(t.ok(), t.message());
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(one_shot_above_a_ws_th_of_the_buffer_is_refused_naming_the_numbers) {
  // ws 16, bf16, M = 1 MiB, row 8192: buffer = (1 MiB + 16 x 8192) + 1 MiB =
  // 2228224 bytes; one-shot holds 2228224 / 16 = 139264 bytes = 17 tokens.
  const WorkspaceLayout l = layout_or_fail(16, kMiB, ARBITER_DTYPE_BF16, 1u << 20, 4096);
  BOOST_TEST(l.buffer_bytes == 2228224u);
  BOOST_TEST(per_call_capacity(l, ARBITER_ALGORITHM_ONESHOT) == 139264u);
  arbiter_allreduce_args fits = valid_args(17, 4096, ARBITER_DTYPE_BF16);
  BOOST_TEST(check_call(l, &fits, 100).ok());
  arbiter_allreduce_args over = valid_args(18, 4096, ARBITER_DTYPE_BF16);
  const Status s = check_call(l, &over, 100);
  BOOST_TEST(s.code() == ARBITER_UNSUPPORTED);
  BOOST_TEST(s.message() ==
             "mnnvl: one-shot needs tokens x hidden x world size x element size <= the buffer "
             "(18 x 4096 x 16 x 2 = 2359296 bytes > 2228224 bytes); use two-shot");
  over.algorithm = ARBITER_ALGORITHM_TWOSHOT;
  BOOST_TEST(check_call(l, &over, 100).ok());
}

BOOST_AUTO_TEST_CASE(two_shot_above_the_message_capacity_is_refused_naming_the_numbers) {
  const WorkspaceLayout l = layout_or_fail(16, kMiB, ARBITER_DTYPE_BF16, 1u << 20, 4096);
  arbiter_allreduce_args fits =
      valid_args(128, 4096, ARBITER_DTYPE_BF16, ARBITER_ALGORITHM_TWOSHOT);
  BOOST_TEST(check_call(l, &fits, 100).ok());
  arbiter_allreduce_args over =
      valid_args(129, 4096, ARBITER_DTYPE_BF16, ARBITER_ALGORITHM_TWOSHOT);
  check_refused(check_call(l, &over, 100), ARBITER_UNSUPPORTED,
                "a message of 1056768 bytes (129 tokens x 4096 x 2 bytes) exceeds the "
                "workspace's two-shot capacity of 1048576 bytes per call");
}

BOOST_AUTO_TEST_CASE(two_shot_rows_wider_than_the_workspace_are_checked_against_the_scatter_area) {
  // Sized for hidden 1024 (2 KiB rows) and M = 17 x 128 KiB; a call of 17
  // tokens x hidden 65536 is M exactly, but its 16 x 2 rows of 128 KiB do not
  // fit the 2260992-byte scatter area.
  const WorkspaceLayout l = layout_or_fail(16, 17 * 128 * kKiB, ARBITER_DTYPE_BF16, 1u << 20, 1024);
  BOOST_TEST(l.scatter_bytes == 2260992u);
  arbiter_allreduce_args a = valid_args(17, 65536, ARBITER_DTYPE_BF16, ARBITER_ALGORITHM_TWOSHOT);
  check_refused(check_call(l, &a, 100), ARBITER_UNSUPPORTED,
                "two-shot scatters world size x ceil(tokens / world size) x row bytes "
                "(16 x 2 x 131072 = 4194304 bytes) into a scatter area of 2260992 bytes");
  a.tokens = 16;  // one row per sender: 2 MiB fits
  BOOST_TEST(check_call(l, &a, 100).ok());
}

BOOST_AUTO_TEST_CASE(only_world_sizes_2_to_64_pass) {
  WorkspaceLayout l = layout_or_fail(8, kMiB, ARBITER_DTYPE_FP16);
  arbiter_allreduce_args a = valid_args(16, 1024, ARBITER_DTYPE_FP16);
  for (const std::uint32_t ws : {0u, 1u, 65u}) {
    l.world_size = ws;  // as if built by hand
    check_refused(check_call(l, &a, 100), ARBITER_UNSUPPORTED,
                  "world size " + std::to_string(ws) + " is not in 2..64");
  }
}

BOOST_AUTO_TEST_CASE(nvfp4_is_refused_on_90_with_a_clear_error_and_runs_on_100_and_103) {
  const WorkspaceLayout l = layout_or_fail(16, kMiB, ARBITER_DTYPE_BF16);
  arbiter_allreduce_args a = valid_args(16, 4096, ARBITER_DTYPE_BF16);
  a.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4;
  const Status hopper = check_call(l, &a, 90);
  BOOST_TEST(hopper.code() == ARBITER_UNSUPPORTED);
  BOOST_TEST(hopper.message() == "mnnvl: NVFP4 needs capability >= 100 (this device is 90)");
  BOOST_TEST(check_call(l, &a, 100).ok());
  BOOST_TEST(check_call(l, &a, 103).ok());
}

BOOST_AUTO_TEST_CASE(hidden_limits_and_token_count_are_enforced) {
  const WorkspaceLayout l = layout_or_fail(2, 64 * kMiB, ARBITER_DTYPE_BF16);
  arbiter_allreduce_args a = valid_args(1, 2884, ARBITER_DTYPE_BF16);
  check_refused(check_call(l, &a, 100), ARBITER_UNSUPPORTED, "hidden 2884 is not a multiple of 8");
  a.hidden = 65544;
  check_refused(check_call(l, &a, 100), ARBITER_UNSUPPORTED,
                "exceeds the supported maximum 65536 (8 CTAs x 1024 threads x 8 elements)");
  a.hidden = 65536;
  BOOST_TEST(check_call(l, &a, 100).ok());
  a.hidden = 0;
  check_refused(check_call(l, &a, 100), ARBITER_INVALID_ARGUMENT, "hidden is 0");
  a.hidden = 4096;
  a.tokens = 0;
  check_refused(check_call(l, &a, 100), ARBITER_INVALID_ARGUMENT, "tokens is 0");
  const WorkspaceLayout f = layout_or_fail(2, 64 * kMiB, ARBITER_DTYPE_FP32);
  arbiter_allreduce_args b = valid_args(1, 32772, ARBITER_DTYPE_FP32);
  check_refused(check_call(f, &b, 100), ARBITER_UNSUPPORTED, "exceeds the supported maximum 32768");
  b.hidden = 1026;  // 4104 bytes: not a multiple of 16
  check_refused(check_call(f, &b, 100), ARBITER_UNSUPPORTED, "hidden 1026 is not a multiple of 4");
}

BOOST_AUTO_TEST_CASE(a_dtype_other_than_the_workspace_dtype_is_refused) {
  const WorkspaceLayout l = layout_or_fail(4, kMiB, ARBITER_DTYPE_BF16);
  arbiter_allreduce_args a = valid_args(16, 1024, ARBITER_DTYPE_FP16);
  check_refused(check_call(l, &a, 100), ARBITER_UNSUPPORTED,
                "dtype 0 differs from the workspace's dtype 1");
  a.dtype = static_cast<arbiter_dtype>(9);
  check_refused(check_call(l, &a, 100), ARBITER_UNSUPPORTED, "dtype 9 is not fp16, bf16 or fp32");
}

// The checks every fused module shares (arbiter/common/call_checks.h and
// aliasing.h, tested in backends_call_checks_test) run in the guards: one
// call per rule is refused before it can reach a kernel, with the module's
// name, and vLLM's in-place call passes.
BOOST_AUTO_TEST_CASE(the_common_call_checks_run_in_the_guards) {
  const WorkspaceLayout l = layout_or_fail(4, kMiB, ARBITER_DTYPE_BF16);
  check_refused(check_call(l, nullptr, 100), ARBITER_INVALID_ARGUMENT, "args is NULL");
  const arbiter_allreduce_args in_place = arbiter::test::in_place_guard_args(16, 1024);
  BOOST_TEST(check_call(l, &in_place, 100).ok());
  for (const arbiter::test::RefusedCall& c : arbiter::test::call_check_breaches(16, 1024)) {
    check_refused(check_call(l, &c.args, c.capability), c.code, c.words);
  }
}
