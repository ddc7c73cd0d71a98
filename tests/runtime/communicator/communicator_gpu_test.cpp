// The whole path on GPUs: `arbiter launch`, the default tables, the
// communicator, the trtllm (fused) and nccl (fallback) modules, from C++ and
// from the C API with default options. Runs on one GPU too: with fewer GPUs
// than ranks every rank goes to GPU 0 in the shared-GPU test mode
// (ARBITER_TEST_SHARED_GPU=1), which drops nccl (NCCL refuses two ranks on
// one GPU), so calls above the fused cap are refused there instead of
// falling back. Skips with the reason where there is no GPU.
#define BOOST_TEST_MODULE runtime_communicator_gpu
#include <boost/test/unit_test.hpp>

#include <cuda_runtime_api.h>

#include <string>

#include "run_command.h"

using namespace arbiter::test;

namespace {

namespace utf = boost::unit_test;

int gpu_count() {
  int n = 0;  // unchanged by a failing call
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

int capability() {
  int major = 0;
  int minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  return major * 10 + minor;
}

// A member, not an empty struct: boost::function copies the functor's whole
// buffer, and GCC 12 warns (-Wuninitialized) about an empty one's padding.
struct NeedsGpu {
  int unused;
  boost::test_tools::assertion_result operator()(utf::test_unit_id) const {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    boost::test_tools::assertion_result ok(e == cudaSuccess && n > 0);
    if (e != cudaSuccess) {
      ok.message() << "no CUDA device: " << cudaGetErrorString(e);
    } else if (n == 0) {
      ok.message() << "no CUDA device visible";
    }
    return ok;
  }
};

bool contains(const std::string& s, const std::string& w) { return s.find(w) != std::string::npos; }

// `ranks` processes of the rank program in `mode`, sharing GPU 0 when there
// are fewer GPUs than ranks. The check mode is on (every call's signature
// all-gathered first), as in every test suite, unless `extra` says otherwise.
CommandResult launch(int ranks, const std::string& mode, bool* shared,
                     const std::string& extra = "ARBITER_CHECK_CALLS=1") {
  *shared = ranks > gpu_count();
  const std::string env = std::string("env -u ARBITER_CONFIG -u ARBITER_BACKENDS ") +
                          (*shared ? "ARBITER_TEST_SHARED_GPU=1 " : "-u ARBITER_TEST_SHARED_GPU ") +
                          extra + " ";
  return run_command(env + ARBITER_BIN + " launch --nproc " + std::to_string(ranks) +
                     " --timeout 600 -- " + COMMUNICATOR_GPU_RANK_BIN + " " + mode);
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_pattern_and_dtype_runs_right_at_2_and_4_ranks,
                     *utf::precondition(NeedsGpu{0}) * utf::timeout(900)) {
  for (int ranks : {2, 4}) {
    BOOST_TEST_CONTEXT(ranks << " ranks") {
      bool shared = false;
      const CommandResult r = launch(ranks, "cases", &shared);
      BOOST_TEST(r.exit_code == 0, r.output);
      for (int k = 0; k < ranks; ++k) {
        BOOST_TEST(contains(r.output, "rank " + std::to_string(k) + ": OK"), r.output);
      }
      BOOST_TEST(!contains(r.output, "dropped trtllm"), r.output);
      // One token is fused on trtllm one-shot under every default cell.
      for (const char* p : {"allreduce", "residual_rmsnorm", "residual_rmsnorm_fp8"}) {
        for (const char* d : {"bf16 1x7168", "fp16 1x7168", "fp32 1x4096"}) {
          BOOST_TEST(contains(r.output, std::string("decision ") + p + " " + d +
                                            ": trtllm oneshot fused: ok"),
                     r.output);
        }
      }
      if (ranks == 2 && capability() == 90) {
        // Capability 9.0, 2 ranks: one-shot to 32 MiB, two-shot to 64 MiB
        // (2340 and 2341 tokens of 7168 bf16; 4681 the last fused).
        BOOST_TEST(contains(r.output,
                            "decision residual_rmsnorm bf16 2340x7168: trtllm oneshot "
                            "fused: ok"),
                   r.output);
        BOOST_TEST(contains(r.output,
                            "decision residual_rmsnorm bf16 2341x7168: trtllm twoshot "
                            "fused: ok"),
                   r.output);
        BOOST_TEST(
            contains(r.output, "decision allreduce bf16 4681x7168: trtllm twoshot fused: ok"),
            r.output);
      }
      if (shared) {
        BOOST_TEST(contains(r.output, "shared-GPU test mode (ARBITER_TEST_SHARED_GPU=1"), r.output);
        BOOST_TEST(contains(r.output, "dropped nccl: dropped by the shared-GPU test mode"),
                   r.output);
        BOOST_TEST(contains(r.output, "refused residual_rmsnorm bf16"), r.output);
      } else {
        BOOST_TEST(contains(r.output, "native unfused: ok"), r.output);
      }
      if (capability() < 100) {
        BOOST_TEST(contains(r.output,
                            "refused nvfp4 bf16: no backend can run this "
                            "residual_rmsnorm_fp4 (NVFP4) call"),
                   r.output);
      }
    }
  }
}

// What a C caller gets with default options: one rank (nccl, the fallback,
// since nothing is fused for one rank) and two (trtllm, fused).
BOOST_AUTO_TEST_CASE(the_c_api_with_default_options_works_at_1_and_2_ranks,
                     *utf::precondition(NeedsGpu{0}) * utf::timeout(300)) {
  for (int ranks : {1, 2}) {
    BOOST_TEST_CONTEXT(ranks << " ranks") {
      bool shared = false;
      const CommandResult r = launch(ranks, "c_api", &shared);
      BOOST_TEST(r.exit_code == 0, r.output);
      for (int k = 0; k < ranks; ++k) {
        BOOST_TEST(contains(r.output, "rank " + std::to_string(k) + ": OK"), r.output);
      }
      const std::string expected =
          ranks == 1 ? "nccl native unfused: ok" : "trtllm oneshot fused: ok";
      BOOST_TEST(contains(r.output, "decision c_api residual_rmsnorm bf16 3x4096: " + expected),
                 r.output);
    }
  }
}

// The check mode: a call whose token count differs on one rank is refused
// on every rank before any kernel runs, the next call runs; and what the
// mode costs per call at 1, 4 and 16 tokens (printed: the figures the issue
// asks for).
BOOST_AUTO_TEST_CASE(the_check_mode_refuses_a_differing_call_and_says_what_it_costs,
                     *utf::precondition(NeedsGpu{0}) * utf::timeout(300)) {
  bool shared = false;
  const CommandResult r = launch(2, "check", &shared, "-u ARBITER_CHECK_CALLS");
  BOOST_TEST(r.exit_code == 0, r.output);
  for (int k = 0; k < 2; ++k) {
    BOOST_TEST(contains(r.output, "rank " + std::to_string(k) + ": OK"), r.output);
    BOOST_TEST(contains(r.output, "[rank " + std::to_string(k) +
                                      "] check refused: status 8: check mode: call 0 differs "
                                      "across ranks in tokens: rank 1 has 4, rank 0 has 8"),
               r.output);
  }
  for (const char* tokens : {"at 1 tokens", "at 4 tokens", "at 16 tokens"}) {
    BOOST_TEST(contains(r.output, std::string("check mode cost ") + tokens), r.output);
  }
  BOOST_TEST_MESSAGE(r.output);
}

// A rank that never launches (the test-only fault hook): rank 0's kernel
// waits for it until abort() from another thread; the stream then ends
// without a CUDA error within 100 ms, rank 1 hears of the abort through the
// host's fault board within a second, later calls fail at once, teardown
// waits on nobody, device memory comes back, and a new communicator runs.
BOOST_AUTO_TEST_CASE(abort_ends_a_kernel_waiting_on_a_rank_that_never_launched,
                     *utf::precondition(NeedsGpu{0}) * utf::timeout(300)) {
  bool shared = false;
  const CommandResult r = launch(
      2, "abort", &shared, "-u ARBITER_CHECK_CALLS ARBITER_TEST_FAULT=1:gpu.call.start@5:skip");
  BOOST_TEST(r.exit_code == 0, r.output);
  for (int k = 0; k < 2; ++k) {
    BOOST_TEST(contains(r.output, "rank " + std::to_string(k) + ": OK"), r.output);
  }
  BOOST_TEST(contains(r.output, "abort: the kernel waiting on rank 1 (never launched) returned"),
             r.output);
  BOOST_TEST(contains(r.output, "abort: rank 1 learnt of rank 0's abort()"), r.output);
  BOOST_TEST_MESSAGE(r.output);
}
