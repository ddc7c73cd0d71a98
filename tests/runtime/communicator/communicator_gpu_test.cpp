// The whole path on GPUs: `arbiter launch` with one rank per GPU, the default
// tables, the communicator, and the trtllm (fused) and nccl (fallback)
// modules. Needs at least two GPUs with a peer-to-peer path (NCCL refuses two
// ranks on one GPU, so the fallback cannot be loopback); skips with the
// reason elsewhere. The kernels alone are checked on one GPU by the
// loopback tests in tests/backends.
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

// A member, not an empty struct: boost::function copies the functor's whole
// buffer, and GCC 12 warns (-Wuninitialized) about an empty one's padding.
struct NeedsGpus {
  int count;
  boost::test_tools::assertion_result operator()(utf::test_unit_id) const {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    boost::test_tools::assertion_result ok(e == cudaSuccess && n >= count);
    if (e != cudaSuccess) {
      ok.message() << "no CUDA device: " << cudaGetErrorString(e);
    } else if (n < count) {
      ok.message() << "needs " << count << " GPUs (one rank per GPU), " << n << " visible";
    }
    return ok;
  }
};

bool contains(const std::string& s, const std::string& w) { return s.find(w) != std::string::npos; }

}  // namespace

BOOST_AUTO_TEST_CASE(small_calls_run_fused_on_trtllm_and_large_ones_on_nccl,
                     *utf::precondition(NeedsGpus{2})) {
  const int gpus = gpu_count();
  for (int ranks : {2, 4, 8}) {
    if (ranks > gpus) break;
    BOOST_TEST_CONTEXT(ranks << " ranks") {
      const CommandResult r =
          run_command(std::string("env -u ARBITER_CONFIG -u ARBITER_BACKENDS ") + ARBITER_BIN +
                      " launch --nproc " + std::to_string(ranks) + " --timeout 300 -- " +
                      COMMUNICATOR_GPU_RANK_BIN);
      BOOST_TEST(r.exit_code == 0, r.output);
      for (int k = 0; k < ranks; ++k) {
        BOOST_TEST(contains(r.output, "rank " + std::to_string(k) + ": OK"), r.output);
      }
      BOOST_TEST(!contains(r.output, "dropped trtllm"), r.output);
      // One token (14 KiB) is fused on trtllm one-shot under every default
      // cell for 2, 4 and 8 ranks.
      BOOST_TEST(contains(r.output, "decision 1 residual_rmsnorm: trtllm oneshot fused: ok"),
                 r.output);
    }
  }
}
