// The trtllm backend's host-side arithmetic: workspace sizing, launch
// configuration for every hidden size we ship, and the guards that refuse a
// call before it can overrun a workspace or hang.
#define BOOST_TEST_MODULE backends_trtllm_host
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "arbiter/common/numeric.h"
#include "arbiter/trtllm/guards.h"
#include "arbiter/trtllm/launch_config.h"
#include "arbiter/trtllm/workspace_layout.h"
#include "guard_args.h"

using namespace arbiter::trtllm;
using arbiter::common::dtype_size;

namespace {

const std::vector<int> kWorldSizes = {2, 4, 8, 16};
const std::vector<arbiter_dtype> kDtypes = {ARBITER_DTYPE_FP16, ARBITER_DTYPE_BF16,
                                            ARBITER_DTYPE_FP32};
const std::vector<std::uint32_t> kHiddens = {1024, 2880, 4096, 7168, 8192};
const std::vector<std::uint32_t> kTokens = {1, 7, 128, 1000};
constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;

bool contains(const std::string& text, const std::string& words) {
  return text.find(words) != std::string::npos;
}

// H200: 132 SMs, two 1024-thread CTAs per SM, clusters up to 8.
DeviceLimits h200() {
  DeviceLimits d;
  d.sm_count = 132;
  d.max_threads_per_block = 1024;
  d.resident_blocks_per_sm = 2;
  d.max_cluster_size = 8;
  return d;
}

// A device without clusters (below SM90).
DeviceLimits no_clusters() {
  DeviceLimits d = h200();
  d.sm_count = 108;
  d.max_cluster_size = 1;
  return d;
}

WorkspaceLayout layout_or_fail(int ws, std::uint64_t max_bytes, arbiter_dtype dtype,
                               std::uint64_t max_tokens = 1u << 20, std::uint64_t hidden = 8192) {
  const Result<WorkspaceLayout> r = make_workspace_layout(ws, max_bytes, dtype, max_tokens, hidden);
  BOOST_REQUIRE_MESSAGE(r.ok(), r.status().message());
  return r.value();
}

LaunchRequest request(std::uint32_t tokens, std::uint32_t hidden, arbiter_dtype dtype,
                      arbiter_pattern pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM) {
  LaunchRequest r;
  r.tokens = tokens;
  r.hidden = hidden;
  r.dtype = dtype;
  r.world_size = 8;
  r.pattern = pattern;
  return r;
}

// A valid residual_rmsnorm call (support/guard_args.h).
arbiter_allreduce_args valid_args(std::uint32_t tokens, std::uint32_t hidden, arbiter_dtype dtype,
                                  arbiter_algorithm algorithm = ARBITER_ALGORITHM_ONESHOT) {
  return arbiter::test::valid_guard_args(tokens, hidden, dtype, algorithm);
}

void check_refused(const Status& s, arbiter_status code, const std::string& words) {
  BOOST_TEST(!s.ok());
  BOOST_TEST(s.code() == code);
  BOOST_TEST(contains(s.message(), words),
             "message \"" << s.message() << "\" lacks \"" << words << "\"");
}

}  // namespace

// ------------------------------------------------------------ workspace sizing

BOOST_AUTO_TEST_CASE(one_shot_stages_hold_world_size_slots_of_the_message_capacity) {
  for (const int ws : kWorldSizes) {
    for (const arbiter_dtype dtype : kDtypes) {
      for (const std::uint64_t bytes :
           {std::uint64_t{16}, std::uint64_t{1000}, kMiB, 64 * kMiB + 48, 512 * kMiB}) {
        BOOST_TEST_CONTEXT("ws " << ws << " dtype " << dtype << " max bytes " << bytes) {
          const WorkspaceLayout l = layout_or_fail(ws, bytes, dtype);
          BOOST_TEST(l.world_size == static_cast<std::uint32_t>(ws));
          BOOST_TEST(l.dtype == dtype);
          BOOST_TEST(l.message_capacity == bytes);
          BOOST_TEST(l.slot_bytes >= bytes);
          BOOST_TEST(l.slot_bytes < bytes + kSlotAlignment);
          BOOST_TEST(l.slot_bytes % kSlotAlignment == 0);
          BOOST_TEST(l.stage_bytes == static_cast<std::uint64_t>(ws) * l.slot_bytes);
          BOOST_TEST(l.oneshot_bytes == 3 * l.stage_bytes);
          BOOST_TEST(l.twoshot_bytes == 2 * l.slot_bytes);
          BOOST_TEST(l.flags_bytes >= std::uint64_t{kMaxGridBlocks} * ws * 8);
          BOOST_TEST(l.registered_flags_bytes >= std::uint64_t{kMaxGridBlocks} * ws * 16);
          BOOST_TEST(l.control_bytes >= sizeof(ControlBlock));
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(workspace_regions_are_aligned_contiguous_and_sum_to_the_total) {
  for (const int ws : kWorldSizes) {
    for (const arbiter_dtype dtype : kDtypes) {
      const WorkspaceLayout l = layout_or_fail(ws, 3 * kMiB + 40, dtype);
      BOOST_TEST_CONTEXT("ws " << ws << " dtype " << dtype) {
        for (const std::uint64_t offset :
             {l.control_offset, l.flags_offset, l.oneshot_offset, l.twoshot_offset,
              l.twoshot_sum_offset(), l.registered_flags_offset}) {
          BOOST_TEST(offset % kSlotAlignment == 0);
        }
        BOOST_TEST(l.control_offset == 0u);
        BOOST_TEST(l.flags_offset == l.control_offset + l.control_bytes);
        BOOST_TEST(l.oneshot_offset == l.flags_offset + l.flags_bytes);
        BOOST_TEST(l.twoshot_offset == l.oneshot_offset + l.oneshot_bytes);
        BOOST_TEST(l.registered_flags_offset == l.twoshot_offset + l.twoshot_bytes);
        BOOST_TEST(l.total_bytes == l.control_bytes + l.flags_bytes + l.oneshot_bytes +
                                        l.twoshot_bytes + l.registered_flags_bytes);
        // Every slot of every stage is aligned, disjoint and inside the one-shot region.
        for (std::uint32_t stage = 0; stage < 3; ++stage) {
          for (std::uint32_t rank = 0; rank < static_cast<std::uint32_t>(ws); ++rank) {
            const std::uint64_t slot = l.slot_offset(stage, rank);
            BOOST_TEST(slot % kSlotAlignment == 0);
            BOOST_TEST(slot == l.oneshot_offset + (stage * ws + rank) * l.slot_bytes);
            BOOST_TEST(slot + l.slot_bytes <= l.twoshot_offset);
          }
        }
        BOOST_TEST(l.twoshot_sum_offset() == l.twoshot_input_offset() + l.slot_bytes);
        BOOST_TEST(l.twoshot_sum_offset() + l.slot_bytes == l.registered_flags_offset);
        BOOST_TEST(l.flag_offset(kMaxGridBlocks - 1, ws - 1) + 8 <= l.oneshot_offset);
        BOOST_TEST(l.registered_flag_offset(0, 0) == l.registered_flags_offset);
        BOOST_TEST(l.registered_flag_offset(kMaxGridBlocks - 1, ws - 1) + 16 <= l.total_bytes);
      }
    }
  }
}

// The workspace is one cudaMalloc shared through CUDA IPC, which shares the
// whole block a small allocation was carved from: it takes the total rounded
// up to 2 MiB, small layouts included (the footprint reports this figure:
// cli_test's footprint_counts_three_lamport_stages_for_trtllm_without_a_gpu).
BOOST_AUTO_TEST_CASE(the_allocation_is_the_total_rounded_up_to_2_MiB) {
  for (const int ws : kWorldSizes) {
    for (const std::uint64_t message :
         {std::uint64_t{256}, std::uint64_t{40 * 1024 + 8}, 3 * kMiB + 40}) {
      BOOST_TEST_CONTEXT("ws " << ws << " max message " << message) {
        const WorkspaceLayout l = layout_or_fail(ws, message, ARBITER_DTYPE_BF16);
        BOOST_TEST(l.allocation_bytes() % (2 * kMiB) == 0u);
        BOOST_TEST(l.allocation_bytes() >= l.total_bytes);
        BOOST_TEST(l.allocation_bytes() - l.total_bytes < 2 * kMiB);
      }
    }
  }
  BOOST_TEST(layout_or_fail(2, 256, ARBITER_DTYPE_BF16).allocation_bytes() == 2 * kMiB);
}

BOOST_AUTO_TEST_CASE(capacity_is_the_smaller_of_max_message_bytes_and_the_largest_call) {
  // tp 8, 2048 tokens x 7168 bf16 = 28 MiB per rank, below a 64 MiB table limit.
  const WorkspaceLayout l = layout_or_fail(8, 64 * kMiB, ARBITER_DTYPE_BF16, 2048, 7168);
  BOOST_TEST(l.message_capacity == 28 * kMiB);
  BOOST_TEST(l.stage_bytes == 8 * 28 * kMiB);
  BOOST_TEST(l.oneshot_bytes == 3 * 8 * 28 * kMiB);
  // The table limit wins when it is the smaller.
  const WorkspaceLayout m = layout_or_fail(8, 4 * kMiB, ARBITER_DTYPE_BF16, 2048, 7168);
  BOOST_TEST(m.message_capacity == 4 * kMiB);
}

BOOST_AUTO_TEST_CASE(per_call_capacity_is_one_slot_for_one_shot_and_the_scratch_for_two_shot) {
  for (const int ws : kWorldSizes) {
    const WorkspaceLayout l = layout_or_fail(ws, 5 * kMiB + 8, ARBITER_DTYPE_FP16);
    BOOST_TEST(per_call_capacity(l, ARBITER_ALGORITHM_ONESHOT) == 5 * kMiB + 8);
    BOOST_TEST(per_call_capacity(l, ARBITER_ALGORITHM_ONESHOT) <= l.slot_bytes);
    // Not a third of the whole workspace, not the whole stage (vLLM #50932).
    BOOST_TEST(per_call_capacity(l, ARBITER_ALGORITHM_ONESHOT) < l.stage_bytes);
    BOOST_TEST(per_call_capacity(l, ARBITER_ALGORITHM_TWOSHOT) == 5 * kMiB + 8);
    BOOST_TEST(per_call_capacity(l, ARBITER_ALGORITHM_TWOSHOT) <= l.twoshot_bytes / 2);
    BOOST_TEST(per_call_capacity(l, ARBITER_ALGORITHM_NATIVE) == 0u);
  }
}

BOOST_AUTO_TEST_CASE(workspace_sizes_that_would_overflow_are_rejected_not_wrapped) {
  const std::uint64_t max = std::numeric_limits<std::uint64_t>::max();
  for (const std::uint64_t bytes : {max, max - 100, kMaxSlotBytes + 1}) {
    const Result<WorkspaceLayout> r =
        make_workspace_layout(16, bytes, ARBITER_DTYPE_FP32, max, max);
    check_refused(r.status(), ARBITER_UNSUPPORTED, "exceeds 4294967296 bytes");
  }
  // The largest slot still lays out without wrapping.
  const WorkspaceLayout l =
      layout_or_fail(16, kMaxSlotBytes, ARBITER_DTYPE_FP32, 1u << 30, 1u << 20);
  BOOST_TEST(l.oneshot_bytes == 3 * 16 * kMaxSlotBytes);
  BOOST_TEST(l.total_bytes > l.oneshot_bytes);
  // max_tokens x hidden overflowing 64 bits just leaves max_message_bytes in charge.
  const WorkspaceLayout m = layout_or_fail(2, kMiB, ARBITER_DTYPE_FP16, max, max);
  BOOST_TEST(m.message_capacity == kMiB);
}

BOOST_AUTO_TEST_CASE(workspace_refuses_unsupported_world_sizes_dtypes_and_zero_sizes) {
  for (const int ws : {-2, 0, 1, 3, 6, 12, 32}) {
    check_refused(make_workspace_layout(ws, kMiB, ARBITER_DTYPE_BF16, 128, 4096).status(),
                  ARBITER_UNSUPPORTED,
                  "world size " + std::to_string(ws) + " is not one of 2, 4, 8, 16");
  }
  check_refused(make_workspace_layout(8, kMiB, 7, 128, 4096).status(), ARBITER_UNSUPPORTED,
                "dtype 7 is not fp16, bf16 or fp32");
  check_refused(make_workspace_layout(8, 0, ARBITER_DTYPE_BF16, 128, 4096).status(),
                ARBITER_INVALID_ARGUMENT, "must all be > 0");
  check_refused(make_workspace_layout(8, kMiB, ARBITER_DTYPE_BF16, 0, 4096).status(),
                ARBITER_INVALID_ARGUMENT, "must all be > 0");
  check_refused(make_workspace_layout(8, kMiB, ARBITER_DTYPE_BF16, 128, 0).status(),
                ARBITER_INVALID_ARGUMENT, "must all be > 0");
}

// ------------------------------------------------------- launch configuration

BOOST_AUTO_TEST_CASE(vector_width_is_sixteen_bytes_per_thread) {
  BOOST_TEST(vector_elements(ARBITER_DTYPE_FP16) == 8u);
  BOOST_TEST(vector_elements(ARBITER_DTYPE_BF16) == 8u);
  BOOST_TEST(vector_elements(ARBITER_DTYPE_FP32) == 4u);
  BOOST_TEST(max_hidden(ARBITER_DTYPE_BF16) == 65536u);
  BOOST_TEST(max_hidden(ARBITER_DTYPE_FP32) == 32768u);
}

BOOST_AUTO_TEST_CASE(launch_config_covers_every_shipped_hidden_size_within_one_wave) {
  for (const DeviceLimits& device : {h200(), no_clusters()}) {
    for (const std::uint32_t hidden : kHiddens) {
      for (const arbiter_dtype dtype : kDtypes) {
        for (const std::uint32_t tokens : kTokens) {
          BOOST_TEST_CONTEXT("max cluster " << device.max_cluster_size << " hidden " << hidden
                                            << " dtype " << dtype << " tokens " << tokens) {
            const Result<LaunchConfig> r =
                choose_launch_config(request(tokens, hidden, dtype), device);
            const std::uint32_t vec = vector_elements(dtype);
            if (hidden / vec > 1024 && device.max_cluster_size == 1) {
              // 8192 fp32 needs 2048 threads per token: impossible without clusters.
              check_refused(r.status(), ARBITER_UNSUPPORTED, "threads per token");
              continue;
            }
            BOOST_REQUIRE_MESSAGE(r.ok(), r.status().message());
            const LaunchConfig& c = r.value();
            BOOST_TEST(c.vector_elements == vec);
            BOOST_TEST(c.threads_per_token == hidden / vec);
            const std::uint32_t cl = c.cluster_size;
            BOOST_TEST((cl == 1 || cl == 2 || cl == 4 || cl == 8));
            BOOST_TEST(cl <= device.max_cluster_size);
            BOOST_TEST(c.cta_threads <= 1024u);
            BOOST_TEST(c.cta_threads >= 32u);
            BOOST_TEST(std::uint64_t{cl} * c.cta_threads * vec >= hidden);
            // No CTA of the cluster is wholly idle.
            BOOST_TEST(std::uint64_t{cl - 1} * c.cta_threads < c.threads_per_token);
            BOOST_TEST(c.idle_threads == cl * c.cta_threads - c.threads_per_token);
            BOOST_TEST(c.warps_per_cta == (c.cta_threads + 31) / 32);
            BOOST_TEST(c.partial_warp == (c.cta_threads % 32 != 0));
            BOOST_TEST(c.dsmem_reduction == (cl > 1));
            const std::uint32_t wave = device.sm_count * device.resident_blocks_per_sm;
            BOOST_TEST(c.grid_blocks >= cl);
            BOOST_TEST(c.grid_blocks <= wave);
            BOOST_TEST(c.grid_blocks <= c.wave_blocks);
            BOOST_TEST(c.grid_blocks <= std::uint64_t{tokens} * cl);
            BOOST_TEST(c.grid_blocks % cl == 0u);
            BOOST_TEST(c.grid_clusters * cl == c.grid_blocks);
          }
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(hidden_2880_gives_partial_warp_blocks) {
  // 360 threads per bf16 token: one token spreads over 2 CTAs of 180.
  const LaunchConfig one =
      choose_launch_config(request(1, 2880, ARBITER_DTYPE_BF16), h200()).value();
  BOOST_TEST(one.cluster_size == 2u);
  BOOST_TEST(one.cta_threads == 180u);
  BOOST_TEST(one.partial_warp);
  BOOST_TEST(one.warps_per_cta == 6u);
  BOOST_TEST(one.idle_threads == 0u);
  BOOST_TEST(one.grid_blocks == 2u);
  // Many tokens fill the wave with one CTA of 360 per token.
  const LaunchConfig many =
      choose_launch_config(request(1000, 2880, ARBITER_DTYPE_FP16), h200()).value();
  BOOST_TEST(many.cluster_size == 1u);
  BOOST_TEST(many.cta_threads == 360u);
  BOOST_TEST(many.partial_warp);
  BOOST_TEST(many.grid_blocks == 264u);
  BOOST_TEST(!many.dsmem_reduction);
  // fp32: 16-byte vectors of 4, 720 threads per token.
  const LaunchConfig fp32 =
      choose_launch_config(request(1, 2880, ARBITER_DTYPE_FP32), h200()).value();
  BOOST_TEST(fp32.threads_per_token == 720u);
  BOOST_TEST(fp32.cluster_size == 4u);
  BOOST_TEST(fp32.cta_threads == 180u);
}

BOOST_AUTO_TEST_CASE(few_tokens_spread_over_a_cluster_many_tokens_do_not) {
  const LaunchConfig h7168 =
      choose_launch_config(request(1, 7168, ARBITER_DTYPE_BF16), h200()).value();
  BOOST_TEST(h7168.cluster_size == 4u);  // 896 = 4 x 224; 8 x 112 would be under 128
  BOOST_TEST(h7168.cta_threads == 224u);
  const LaunchConfig h8192 =
      choose_launch_config(request(1, 8192, ARBITER_DTYPE_BF16), h200()).value();
  BOOST_TEST(h8192.cluster_size == 8u);
  BOOST_TEST(h8192.cta_threads == 128u);
  const LaunchConfig busy =
      choose_launch_config(request(1000, 8192, ARBITER_DTYPE_BF16), h200()).value();
  BOOST_TEST(busy.cluster_size == 1u);
  BOOST_TEST(busy.cta_threads == 1024u);
  // fp32 8192 needs 2048 threads: a cluster of at least 2 even when busy.
  const LaunchConfig wide =
      choose_launch_config(request(1000, 8192, ARBITER_DTYPE_FP32), h200()).value();
  BOOST_TEST(wide.cluster_size == 2u);
  BOOST_TEST(wide.cta_threads == 1024u);
  BOOST_TEST(wide.dsmem_reduction);
  BOOST_TEST(wide.grid_blocks == 264u);
}

BOOST_AUTO_TEST_CASE(grid_never_exceeds_resident_clusters_or_barrier_slots) {
  DeviceLimits d = h200();
  d.max_active_clusters = 20;
  const LaunchConfig c = choose_launch_config(request(1000, 8192, ARBITER_DTYPE_FP32), d).value();
  BOOST_TEST(c.cluster_size == 2u);
  BOOST_TEST(c.grid_blocks == 40u);
  DeviceLimits huge = h200();
  huge.sm_count = 1000;
  huge.resident_blocks_per_sm = 32;
  const LaunchConfig h =
      choose_launch_config(request(100000, 1024, ARBITER_DTYPE_BF16), huge).value();
  BOOST_TEST(h.grid_blocks == kMaxGridBlocks);
}

BOOST_AUTO_TEST_CASE(per_size_cluster_residency_bounds_the_wave_of_that_size) {
  DeviceLimits d = h200();
  d.resident_blocks_per_sm = 1;
  d.active_clusters[1] = 60;  // clusters of 2 resident at once
  d.active_clusters[2] = 28;
  d.active_clusters[3] = 14;
  // fp32 hidden 8192 is 2048 threads: clusters of 2 CTAs of 1024.
  const LaunchConfig c = choose_launch_config(request(1000, 8192, ARBITER_DTYPE_FP32), d).value();
  BOOST_TEST(c.cluster_size == 2u);
  BOOST_TEST(c.grid_blocks == 120u);

  // One GPU shared by 16 loopback ranks: each gets 132 / 16 SMs and its
  // share of the resident clusters, so all ranks' CTAs fit at once.
  DeviceLimits share;
  share.sm_count = 8;
  share.resident_blocks_per_sm = 1;
  share.max_cluster_size = 4;
  share.active_clusters[0] = 8;
  share.active_clusters[1] = 3;
  share.active_clusters[2] = 1;
  const LaunchConfig f =
      choose_launch_config(request(1000, 8192, ARBITER_DTYPE_FP32), share).value();
  BOOST_TEST(f.cluster_size == 2u);
  BOOST_TEST(f.grid_blocks == 6u);
  const LaunchConfig b = choose_launch_config(request(1, 8192, ARBITER_DTYPE_BF16), share).value();
  BOOST_TEST(b.cluster_size == 4u);
  BOOST_TEST(b.cta_threads == 256u);
  BOOST_TEST(b.grid_blocks == 4u);
}

BOOST_AUTO_TEST_CASE(a_non_power_of_two_cluster_limit_rounds_down) {
  DeviceLimits d = h200();
  d.max_cluster_size = 7;  // never launch a cluster of 7 (FlashInfer #2557)
  const LaunchConfig c = choose_launch_config(request(1, 8192, ARBITER_DTYPE_BF16), d).value();
  BOOST_TEST(c.cluster_size == 4u);
  BOOST_TEST(c.cta_threads == 256u);
}

BOOST_AUTO_TEST_CASE(nvfp4_blocks_never_straddle_two_ctas) {
  // 1026 threads per token need a cluster of 2; 513 each would split a
  // 16-element block, so NVFP4 takes 514.
  const LaunchConfig plain =
      choose_launch_config(request(1000, 8208, ARBITER_DTYPE_BF16), h200()).value();
  BOOST_TEST(plain.cluster_size == 2u);
  BOOST_TEST(plain.cta_threads == 513u);
  const LaunchConfig fp4 =
      choose_launch_config(
          request(1000, 8208, ARBITER_DTYPE_BF16, ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4), h200())
          .value();
  BOOST_TEST(fp4.cluster_size == 2u);
  BOOST_TEST(fp4.cta_threads == 514u);
  BOOST_TEST(fp4.idle_threads == 2u);
}

BOOST_AUTO_TEST_CASE(hidden_not_a_multiple_of_the_vector_width_is_rejected_with_the_reason) {
  // 2884 bf16: 5768 bytes, not a multiple of 16. The same hidden in fp32 is fine.
  check_refused(
      choose_launch_config(request(1, 2884, ARBITER_DTYPE_BF16), h200()).status(),
      ARBITER_UNSUPPORTED,
      "hidden 2884 is not a multiple of 8 (hidden x 2 bytes must be a multiple of 16 bytes");
  BOOST_TEST(choose_launch_config(request(1, 2884, ARBITER_DTYPE_FP32), h200()).ok());
  check_refused(choose_launch_config(request(1, 2882, ARBITER_DTYPE_FP32), h200()).status(),
                ARBITER_UNSUPPORTED, "hidden 2882 is not a multiple of 4");
  check_refused(choose_launch_config(request(1, 2882, ARBITER_DTYPE_FP16), h200()).status(),
                ARBITER_UNSUPPORTED, "hidden 2882 is not a multiple of 8");
}

BOOST_AUTO_TEST_CASE(hidden_above_the_supported_maximum_is_rejected_with_the_reason) {
  BOOST_TEST(choose_launch_config(request(1, 65536, ARBITER_DTYPE_BF16), h200()).ok());
  check_refused(choose_launch_config(request(1, 65544, ARBITER_DTYPE_BF16), h200()).status(),
                ARBITER_UNSUPPORTED,
                "hidden 65544 exceeds the supported maximum 65536 (8 CTAs x 1024 threads x 8");
  check_refused(choose_launch_config(request(1, 32772, ARBITER_DTYPE_FP32), h200()).status(),
                ARBITER_UNSUPPORTED, "exceeds the supported maximum 32768");
  // Without clusters the device covers 1024 threads per token only.
  check_refused(choose_launch_config(request(1, 16384, ARBITER_DTYPE_BF16), no_clusters()).status(),
                ARBITER_UNSUPPORTED, "more than a cluster of 1 CTAs x 1024 threads");
  check_refused(choose_launch_config(request(0, 4096, ARBITER_DTYPE_BF16), h200()).status(),
                ARBITER_INVALID_ARGUMENT, "tokens is 0");
}

// ------------------------------------------------------------------- guards

BOOST_AUTO_TEST_CASE(a_valid_call_passes_the_guards) {
  for (const int ws : kWorldSizes) {
    const WorkspaceLayout l = layout_or_fail(ws, 64 * kMiB, ARBITER_DTYPE_BF16, 4096, 8192);
    for (const std::uint32_t hidden : kHiddens) {
      arbiter_allreduce_args one = valid_args(128, hidden, ARBITER_DTYPE_BF16);
      const Status s = check_call(l, &one, 90);
      BOOST_TEST(s.ok(), s.message());
      arbiter_allreduce_args two =
          valid_args(128, hidden, ARBITER_DTYPE_BF16, ARBITER_ALGORITHM_TWOSHOT);
      BOOST_TEST(check_call(l, &two, 90).ok());
    }
  }
}

BOOST_AUTO_TEST_CASE(a_message_above_the_per_call_capacity_is_refused_on_the_host) {
  // Capacity 1 MiB: 128 tokens x 4096 bf16 fits exactly, 129 do not.
  const WorkspaceLayout l = layout_or_fail(4, kMiB, ARBITER_DTYPE_BF16, 4096, 4096);
  arbiter_allreduce_args fits = valid_args(128, 4096, ARBITER_DTYPE_BF16);
  BOOST_TEST(check_call(l, &fits, 90).ok());
  arbiter_allreduce_args over = valid_args(129, 4096, ARBITER_DTYPE_BF16);
  check_refused(check_call(l, &over, 90), ARBITER_UNSUPPORTED,
                "a message of 1056768 bytes (129 tokens x 4096 x 2 bytes) exceeds the "
                "workspace's one-shot capacity of 1048576 bytes per call");
  over.algorithm = ARBITER_ALGORITHM_TWOSHOT;
  check_refused(check_call(l, &over, 90), ARBITER_UNSUPPORTED, "two-shot capacity of 1048576");
}

BOOST_AUTO_TEST_CASE(a_registered_call_above_the_capacity_passes_up_to_2_to_the_31_tokens) {
  // Registered memory bounds the call, not the workspace; the kernels count
  // tokens in 32 bits, so a call near 2^32 tokens is refused.
  const WorkspaceLayout l = layout_or_fail(4, kMiB, ARBITER_DTYPE_BF16, 4096, 4096);
  arbiter_allreduce_args a = valid_args(129, 4096, ARBITER_DTYPE_BF16);
  BOOST_TEST(check_call(l, &a, 90, /*registered=*/true).ok());
  a.tokens = kMaxRegisteredTokens;
  BOOST_TEST(check_call(l, &a, 90, /*registered=*/true).ok());
  a.tokens = kMaxRegisteredTokens + 1;
  check_refused(check_call(l, &a, 90, /*registered=*/true), ARBITER_UNSUPPORTED,
                "a registered call of 2147483649 tokens; at most 2147483648 per call");
  a.tokens = 0xFFFFFFFFu;
  check_refused(check_call(l, &a, 90, /*registered=*/true), ARBITER_UNSUPPORTED, "per call");
}

BOOST_AUTO_TEST_CASE(two_shot_needs_at_least_one_token_per_rank) {
  const WorkspaceLayout l = layout_or_fail(8, kMiB, ARBITER_DTYPE_FP16);
  arbiter_allreduce_args a = valid_args(7, 1024, ARBITER_DTYPE_FP16, ARBITER_ALGORITHM_TWOSHOT);
  check_refused(check_call(l, &a, 90), ARBITER_UNSUPPORTED,
                "two-shot needs tokens >= world size (7 tokens, world size 8)");
  a.tokens = 8;
  BOOST_TEST(check_call(l, &a, 90).ok());
  a.tokens = 7;
  a.algorithm = ARBITER_ALGORITHM_ONESHOT;
  BOOST_TEST(check_call(l, &a, 90).ok());
}

BOOST_AUTO_TEST_CASE(only_world_sizes_2_4_8_16_pass) {
  WorkspaceLayout l = layout_or_fail(8, kMiB, ARBITER_DTYPE_FP16);
  l.world_size = 6;  // as if built by hand
  arbiter_allreduce_args a = valid_args(16, 1024, ARBITER_DTYPE_FP16);
  check_refused(check_call(l, &a, 90), ARBITER_UNSUPPORTED,
                "world size 6 is not one of 2, 4, 8, 16");
}

BOOST_AUTO_TEST_CASE(nvfp4_is_refused_below_capability_100_with_a_clear_error) {
  const WorkspaceLayout l = layout_or_fail(4, kMiB, ARBITER_DTYPE_BF16);
  arbiter_allreduce_args a = valid_args(16, 4096, ARBITER_DTYPE_BF16);
  a.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4;
  const Status hopper = check_call(l, &a, 90);
  BOOST_TEST(hopper.code() == ARBITER_UNSUPPORTED);
  BOOST_TEST(hopper.message() == "NVFP4 needs capability >= 100 (this device is 90)");
  BOOST_TEST(check_call(l, &a, 100).ok());
  BOOST_TEST(check_call(l, &a, 103).ok());
}

BOOST_AUTO_TEST_CASE(hidden_limits_are_enforced_by_the_guards) {
  const WorkspaceLayout l = layout_or_fail(2, 64 * kMiB, ARBITER_DTYPE_BF16);
  arbiter_allreduce_args a = valid_args(1, 2884, ARBITER_DTYPE_BF16);
  check_refused(check_call(l, &a, 90), ARBITER_UNSUPPORTED, "hidden 2884 is not a multiple of 8");
  a.hidden = 65544;
  check_refused(check_call(l, &a, 90), ARBITER_UNSUPPORTED, "exceeds the supported maximum 65536");
  a.hidden = 0;
  check_refused(check_call(l, &a, 90), ARBITER_INVALID_ARGUMENT, "hidden is 0");
  a.hidden = 4096;
  a.tokens = 0;
  check_refused(check_call(l, &a, 90), ARBITER_INVALID_ARGUMENT, "tokens is 0");
}

BOOST_AUTO_TEST_CASE(a_dtype_other_than_the_workspace_dtype_is_refused) {
  // The stages hold bf16 -0.0 (0x8000 halves); fp32 readers would never see 0x80000000.
  const WorkspaceLayout l = layout_or_fail(4, kMiB, ARBITER_DTYPE_BF16);
  arbiter_allreduce_args a = valid_args(16, 1024, ARBITER_DTYPE_FP32);
  check_refused(check_call(l, &a, 90), ARBITER_UNSUPPORTED, "differs from the workspace's dtype");
  a.dtype = static_cast<arbiter_dtype>(9);
  check_refused(check_call(l, &a, 90), ARBITER_UNSUPPORTED, "dtype 9 is not fp16, bf16 or fp32");
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
