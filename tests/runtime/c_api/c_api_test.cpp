// The C API as a framework that is not C++ uses it: load, decide, explain,
// errors as codes plus messages.
#define BOOST_TEST_MODULE runtime_c_api
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "arbiter/arbiter.h"
#include "thread_oob.h"

extern "C" int32_t c_decide_nvl72(uint64_t bytes, arbiter_decision* out);
extern "C" int c_registered_rank(const arbiter_oob* oob, char* why, size_t size);

namespace {

// The oob of a group of one: this process alone.
arbiter_oob single_rank_oob() {
  arbiter_oob oob{};
  oob.rank = 0;
  oob.size = 1;
  oob.allgather = [](void*, const void* send, void* recv, size_t bytes, int64_t) -> int32_t {
    std::memcpy(recv, send, bytes);
    return ARBITER_OK;
  };
  oob.broadcast = [](void*, void*, size_t, int32_t, int64_t) -> int32_t { return ARBITER_OK; };
  oob.barrier = [](void*, int64_t) -> int32_t { return ARBITER_OK; };
  oob.last_error = [](void*) -> const char* { return ""; };
  return oob;
}

arbiter_request nvl72(uint64_t bytes) {
  arbiter_request r{};
  r.capability = 103;
  r.world_size = 16;
  r.nodes = 4;
  r.nvlink_domain = 1;
  r.multicast = 1;
  r.dtype = ARBITER_DTYPE_BF16;
  r.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM;
  r.message_bytes = bytes;
  return r;
}
}  // namespace

BOOST_AUTO_TEST_CASE(c_code_decides_like_the_cli) {
  unsetenv("ARBITER_CONFIG");
  unsetenv("ARBITER_BACKENDS");
  arbiter_decision d{};
  BOOST_TEST(c_decide_nvl72(64ull << 20, &d) == ARBITER_OK);
  BOOST_TEST(std::string(arbiter_backend_name(d.backend)) == "mnnvl");
  BOOST_TEST(d.fused == 1u);
  BOOST_TEST(d.algorithm == ARBITER_ALGORITHM_TWOSHOT);
  BOOST_TEST(d.cap == (64ull << 20));
  BOOST_TEST(c_decide_nvl72((64ull << 20) + 1, &d) == ARBITER_OK);
  BOOST_TEST(std::string(arbiter_backend_name(d.backend)) == "nccl");
  BOOST_TEST(d.reason == 3u);
}

BOOST_AUTO_TEST_CASE(max_fused_bytes_and_explain) {
  arbiter_policy* p = nullptr;
  BOOST_REQUIRE(arbiter_policy_load(nullptr, 0, nullptr, &p) == ARBITER_OK);
  arbiter_request r = nvl72(0);
  uint64_t cap = 0;
  int32_t has = 0;
  BOOST_TEST(arbiter_max_fused_bytes(p, &r, &cap, &has) == ARBITER_OK);
  BOOST_TEST(has == 1);
  BOOST_TEST(cap == (64ull << 20));
  r.capability = 90;
  BOOST_TEST(arbiter_max_fused_bytes(p, &r, &cap, &has) == ARBITER_OK);
  BOOST_TEST(has == 0);
  // Too small a buffer: the size needed comes back.
  size_t needed = 0;
  char tiny[4];
  BOOST_TEST(arbiter_explain(p, &r, 1, tiny, sizeof tiny, &needed) == ARBITER_INVALID_ARGUMENT);
  BOOST_TEST(needed > 100u);
  std::string buf(needed, '\0');
  BOOST_TEST(arbiter_explain(p, &r, 1, buf.data(), buf.size(), &needed) == ARBITER_OK);
  BOOST_TEST(buf.find("no fusion entry for capability 90, world size 16") != std::string::npos);
  BOOST_TEST(arbiter_policy_fingerprint(p) != 0u);
  arbiter_policy_free(p);
}

BOOST_AUTO_TEST_CASE(errors_come_back_as_codes_with_messages) {
  arbiter_policy* p = nullptr;
  const char* files[] = {"/nonexistent/site.yaml"};
  BOOST_TEST(arbiter_policy_load(files, 1, nullptr, &p) == ARBITER_INVALID_ARGUMENT);
  BOOST_TEST(p == nullptr);
  BOOST_TEST(std::string(arbiter_last_error()).find("/nonexistent/site.yaml: error: cannot open") !=
             std::string::npos);
  BOOST_TEST(arbiter_policy_load(nullptr, 0, "trtllm,bogus", &p) == ARBITER_INVALID_ARGUMENT);
  BOOST_TEST(std::string(arbiter_last_error()).find("unknown backend 'bogus'") !=
             std::string::npos);
  BOOST_REQUIRE(arbiter_policy_load(nullptr, 0, nullptr, &p) == ARBITER_OK);
  arbiter_request r = nvl72(1);
  r.capability = 7;
  arbiter_decision d{};
  BOOST_TEST(arbiter_decide(p, &r, &d) == ARBITER_INVALID_ARGUMENT);
  BOOST_TEST(std::string(arbiter_last_error()).find("capability 7") != std::string::npos);
  BOOST_TEST(arbiter_decide(nullptr, &r, &d) == ARBITER_INVALID_ARGUMENT);
  arbiter_policy_free(p);
}

// Tables that leave settings out (no `enabled:`, no fallback) load over the
// defaults through C like any site file: a verdict, never a crash.
BOOST_AUTO_TEST_CASE(site_files_that_leave_settings_out_load_over_the_defaults) {
  const std::string five_lines =
      std::string(ARBITER_TEST_DATA) + "/fuzz/policy_load/crash-preference-without-enabled.yaml";
  const char* files[] = {five_lines.c_str()};
  arbiter_policy* p = nullptr;
  BOOST_REQUIRE_MESSAGE(arbiter_policy_load(files, 1, nullptr, &p) == ARBITER_OK,
                        arbiter_last_error());
  // preference.single_node: [trtllm] drops mnnvl; trtllm still fuses.
  arbiter_request r = nvl72(256 << 10);
  r.capability = 90;
  r.world_size = 8;
  r.nodes = 1;
  r.multicast = 1;
  arbiter_decision d{};
  BOOST_TEST(arbiter_decide(p, &r, &d) == ARBITER_OK);
  BOOST_TEST(std::string(arbiter_backend_name(d.backend)) == "trtllm");
  BOOST_TEST(d.fused == 1u);
  arbiter_policy_free(p);
}

// A request that says its residual is replicated meets the cells keyed by it
// (tests/data/good/residual_replicated.yaml); the same request without the
// flag does not, and explain says which it was.
BOOST_AUTO_TEST_CASE(the_replicated_residual_reaches_cells_keyed_by_it) {
  const std::string table = std::string(ARBITER_TEST_DATA) + "/good/residual_replicated.yaml";
  const char* files[] = {table.c_str()};
  arbiter_policy* p = nullptr;
  BOOST_REQUIRE_MESSAGE(arbiter_policy_load(files, 1, nullptr, &p) == ARBITER_OK,
                        arbiter_last_error());
  arbiter_request r{};
  r.capability = 90;
  r.world_size = 8;
  r.nodes = 1;
  r.nvlink_domain = 1;
  r.dtype = ARBITER_DTYPE_BF16;
  r.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM;
  r.message_bytes = 2ull << 20;
  arbiter_decision d{};
  BOOST_TEST(arbiter_decide(p, &r, &d) == ARBITER_OK);
  BOOST_TEST(d.fused == 0u);
  BOOST_TEST(d.reason == 3u);  // above the distinct cell's 1 MiB
  BOOST_TEST(d.cap == (1ull << 20));
  r.residual_replicated = 1;
  BOOST_TEST(arbiter_decide(p, &r, &d) == ARBITER_OK);
  BOOST_TEST(d.fused == 1u);
  BOOST_TEST(d.cap == (4ull << 20));
  char json[8192];
  size_t needed = 0;
  BOOST_TEST(arbiter_explain(p, &r, 1, json, sizeof json, &needed) == ARBITER_OK);
  BOOST_TEST(std::string(json).find("\"residual_replicated\":true") != std::string::npos, json);
  // Plain all-reduce has no residual: the flag is ignored, no keyed cell applies.
  r.pattern = ARBITER_PATTERN_ALLREDUCE;
  BOOST_TEST(arbiter_decide(p, &r, &d) == ARBITER_OK);
  BOOST_TEST(d.fused == 0u);
  BOOST_TEST(d.cap == (512ull << 10));  // the default cell
  // cpu, 2 ranks, 4 KiB: the replicated call goes two-shot (the one-shot
  // cell's 2 KiB), the distinct one stays one-shot under shm's threshold.
  r = arbiter_request{};
  r.world_size = 2;
  r.dtype = ARBITER_DTYPE_BF16;
  r.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM;
  r.message_bytes = 4096;
  BOOST_TEST(arbiter_decide(p, &r, &d) == ARBITER_OK);
  BOOST_TEST(std::string(arbiter_backend_name(d.backend)) == "shm");
  BOOST_TEST(d.algorithm == ARBITER_ALGORITHM_ONESHOT);
  r.residual_replicated = 1;
  BOOST_TEST(arbiter_decide(p, &r, &d) == ARBITER_OK);
  BOOST_TEST(d.algorithm == ARBITER_ALGORITHM_TWOSHOT);
  arbiter_policy_free(p);
}

// arbiter_request_ex says what arbiter_request has no room for: a request
// whose input lies in registered memory meets the cells keyed `buffers:
// registered` (tests/data/good/registered_buffers.yaml) through decide,
// max_fused_bytes and explain; the same request without it does not; a size
// this library does not know is refused with the fix.
BOOST_AUTO_TEST_CASE(the_extended_request_reaches_cells_keyed_by_registered_buffers) {
  const std::string table = std::string(ARBITER_TEST_DATA) + "/good/registered_buffers.yaml";
  const char* files[] = {table.c_str()};
  arbiter_policy* p = nullptr;
  BOOST_REQUIRE_MESSAGE(arbiter_policy_load(files, 1, nullptr, &p) == ARBITER_OK,
                        arbiter_last_error());
  arbiter_request_ex r{};
  r.size = sizeof r;
  r.request.world_size = 2;
  r.request.dtype = ARBITER_DTYPE_BF16;
  r.request.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM;
  r.request.message_bytes = 1ull << 20;
  arbiter_decision d{};
  // Copied: shm's threshold (256 KiB total) sends 1 MiB to two-shot.
  BOOST_TEST(arbiter_decide_ex(p, &r, &d) == ARBITER_OK);
  BOOST_TEST(d.algorithm == ARBITER_ALGORITHM_TWOSHOT);
  arbiter_decision plain{};
  BOOST_TEST(arbiter_decide(p, &r.request, &plain) == ARBITER_OK);
  BOOST_TEST(plain.algorithm == ARBITER_ALGORITHM_TWOSHOT);
  // Registered: the one-shot cell's 512 KiB is below 1 MiB too, but 256 KiB
  // is not.
  r.buffers_registered = 1;
  BOOST_TEST(arbiter_decide_ex(p, &r, &d) == ARBITER_OK);
  BOOST_TEST(d.algorithm == ARBITER_ALGORITHM_TWOSHOT);
  r.request.message_bytes = 256ull << 10;
  BOOST_TEST(arbiter_decide_ex(p, &r, &d) == ARBITER_OK);
  BOOST_TEST(d.algorithm == ARBITER_ALGORITHM_ONESHOT);
  r.buffers_registered = 0;
  BOOST_TEST(arbiter_decide_ex(p, &r, &d) == ARBITER_OK);
  BOOST_TEST(d.algorithm == ARBITER_ALGORITHM_TWOSHOT);
  // The fused cap: 32 MiB registered, the default cell's 64 MiB copied.
  uint64_t cap = 0;
  int32_t has_cap = 0;
  BOOST_TEST(arbiter_max_fused_bytes_ex(p, &r, &cap, &has_cap) == ARBITER_OK);
  BOOST_TEST(has_cap == 1);
  BOOST_TEST(cap == (64ull << 20));
  r.buffers_registered = 1;
  BOOST_TEST(arbiter_max_fused_bytes_ex(p, &r, &cap, &has_cap) == ARBITER_OK);
  BOOST_TEST(cap == (32ull << 20));
  char json[8192];
  size_t needed = 0;
  BOOST_TEST(arbiter_explain_ex(p, &r, 1, json, sizeof json, &needed) == ARBITER_OK);
  BOOST_TEST(std::string(json).find("\"buffers_registered\":true") != std::string::npos, json);
  BOOST_TEST(arbiter_explain_ex(p, &r, 0, json, sizeof json, &needed) == ARBITER_OK);
  BOOST_TEST(std::string(json).find("registered_buffers.yaml:12") != std::string::npos, json);

  // Sizes: too small to hold the flag, or from a newer header.
  for (const uint32_t size :
       {0u, static_cast<uint32_t>(sizeof(arbiter_request)), static_cast<uint32_t>(sizeof r + 8)}) {
    r.size = size;
    BOOST_TEST(arbiter_decide_ex(p, &r, &d) == ARBITER_INVALID_ARGUMENT);
    const std::string error = arbiter_last_error();
    BOOST_TEST(
        error.find("arbiter_request_ex.size is " + std::to_string(size)) != std::string::npos,
        error);
    BOOST_TEST(error.find("sizeof(arbiter_request_ex)") != std::string::npos, error);
  }
  BOOST_TEST(arbiter_decide_ex(p, nullptr, &d) == ARBITER_INVALID_ARGUMENT);
  arbiter_policy_free(p);
}

// The communicator from the launcher's environment: a bad environment or bad
// options fail with a code and a message that names the fix, and nothing is
// created. (The joined path runs under `arbiter launch` in the Python tests.)
BOOST_AUTO_TEST_CASE(comm_from_environment_refuses_what_it_cannot_use) {
  arbiter_policy* p = nullptr;
  BOOST_REQUIRE(arbiter_policy_load(nullptr, 0, nullptr, &p) == ARBITER_OK);
  arbiter_comm_options o{};
  o.hidden = 64;
  o.dtype = ARBITER_DTYPE_FP32;
  arbiter_comm* comm = nullptr;

  unsetenv("RANK");
  setenv("WORLD_SIZE", "2", 1);
  setenv("LOCAL_RANK", "0", 1);
  BOOST_TEST(arbiter_comm_create_from_environment(p, &o, &comm) == ARBITER_INVALID_ARGUMENT);
  BOOST_TEST(std::string(arbiter_last_error()).find("RANK") != std::string::npos);
  BOOST_TEST(comm == nullptr);

  o.dtype = static_cast<arbiter_dtype>(7);
  BOOST_TEST(arbiter_comm_create_from_environment(p, &o, &comm) == ARBITER_INVALID_ARGUMENT);
  BOOST_TEST(std::string(arbiter_last_error()) == "options: unknown dtype 7");
  o.dtype = ARBITER_DTYPE_FP32;
  o.capability = 7;
  BOOST_TEST(arbiter_comm_create_from_environment(p, &o, &comm) == ARBITER_INVALID_ARGUMENT);
  BOOST_TEST(std::string(arbiter_last_error()).find("capability 7") != std::string::npos);
  BOOST_TEST(arbiter_comm_create_from_environment(nullptr, &o, &comm) == ARBITER_INVALID_ARGUMENT);
  BOOST_TEST(comm == nullptr);

  // Started by hand without LOCAL_RANK (CPU ranks need none): a GPU rank
  // that names no device is told which variable is missing.
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "1", 1);
  unsetenv("LOCAL_RANK");
  o.capability = 90;
  o.device = -1;
  BOOST_TEST(arbiter_comm_create_from_environment(p, &o, &comm) == ARBITER_INVALID_ARGUMENT);
  BOOST_TEST(
      std::string(arbiter_last_error()).find("needs its CUDA device: LOCAL_RANK is not set") !=
          std::string::npos,
      arbiter_last_error());
  BOOST_TEST(comm == nullptr);

  arbiter_comm_info info{};
  BOOST_TEST(arbiter_comm_get_info(nullptr, &info) == ARBITER_INVALID_ARGUMENT);
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
  unsetenv("LOCAL_RANK");
  arbiter_policy_free(p);
}

// What a C caller gets with every option at zero but the shape: creation
// works (every pattern asked for, one rank, CPU), the norm is right, and
// NVFP4, which no CPU backend runs, is refused with the reason.
BOOST_AUTO_TEST_CASE(a_communicator_with_default_options_works_for_one_cpu_rank) {
  unsetenv("ARBITER_CONFIG");
  unsetenv("ARBITER_BACKENDS");
  setenv("ARBITER_PLUGIN_PATH", ARBITER_PLUGIN_DIR, 1);
  arbiter_policy* p = nullptr;
  BOOST_REQUIRE(arbiter_policy_from_environment(&p) == ARBITER_OK);
  arbiter_comm_options o{};
  o.hidden = 8;
  o.dtype = ARBITER_DTYPE_FP32;
  o.device = 5;  // means nothing on a CPU rank: get_info says -1, as the header does
  // A negative timeout was read as the default (60 s); C code means "never" by it.
  o.timeout_ms = -1;
  arbiter_comm* comm = nullptr;
  const arbiter_oob solo = single_rank_oob();
  BOOST_TEST(arbiter_comm_create(&solo, p, &o, &comm) == ARBITER_INVALID_ARGUMENT);
  BOOST_TEST(
      std::string(arbiter_last_error()).find("timeout_ms -1 is negative") != std::string::npos,
      arbiter_last_error());
  o.timeout_ms = 0;
  // The oob struct may die with the function that built it: the
  // communicator kept a reference to it (garbage rank, then a crash).
  auto* oob = new arbiter_oob(single_rank_oob());
  BOOST_REQUIRE_MESSAGE(arbiter_comm_create(oob, p, &o, &comm) == ARBITER_OK, arbiter_last_error());
  std::memset(static_cast<void*>(oob), 0xA5, sizeof *oob);
  delete oob;
  arbiter_policy_free(p);
  arbiter_comm_info info{};
  BOOST_TEST(arbiter_comm_get_info(comm, &info) == ARBITER_OK);
  BOOST_TEST(info.world_size == 1);
  BOOST_TEST(info.rank == 0);
  BOOST_TEST(info.device == -1);
  BOOST_TEST(std::string(arbiter_backend_name(3)) == "shm");
  BOOST_TEST(info.backend_mask == (1u << 3));
  // One rank shares nothing: shm's workspace is private host memory, and it
  // streams any message. A backend without a workspace is refused by name.
  arbiter_comm_footprint figure{};
  BOOST_REQUIRE_MESSAGE(arbiter_comm_get_footprint(comm, 3, &figure) == ARBITER_OK,
                        arbiter_last_error());
  BOOST_TEST(figure.backend == 3);
  BOOST_TEST(figure.known == 1);
  BOOST_TEST(figure.device_bytes == 0u);
  BOOST_TEST(figure.shared_bytes == 0u);
  BOOST_TEST(figure.host_bytes > 0u);
  BOOST_TEST(figure.host_bytes % 4096 == 0u);
  BOOST_TEST(figure.max_message_bytes[ARBITER_ALGORITHM_NATIVE] == UINT64_MAX);
  BOOST_TEST(std::string(figure.note).empty());
  arbiter_comm_footprint untouched{};
  untouched.host_bytes = 7;
  BOOST_TEST(arbiter_comm_get_footprint(comm, 2, &untouched) == ARBITER_UNSUPPORTED);
  BOOST_TEST(
      std::string(arbiter_last_error()).find("backend 2 has no workspace") != std::string::npos,
      arbiter_last_error());
  BOOST_TEST(untouched.host_bytes == 7u);
  BOOST_TEST(arbiter_comm_get_footprint(nullptr, 3, &figure) == ARBITER_INVALID_ARGUMENT);

  std::vector<float> x = {1, -2, 3, -4, 5, -6, 7, -8}, residual(8, 1.0f), gamma(8, 2.0f);
  std::vector<float> residual_out(8), norm_out(8);
  arbiter_allreduce_args a{};
  a.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM;
  a.dtype = ARBITER_DTYPE_FP32;
  a.tokens = 1;
  a.hidden = 8;
  a.input = x.data();
  a.residual_in = residual.data();
  a.residual_out = residual_out.data();
  a.gamma = gamma.data();
  a.norm_out = norm_out.data();
  a.eps = 0.0f;
  arbiter_decision used{};
  BOOST_REQUIRE_MESSAGE(arbiter_comm_allreduce_fusion(comm, &a, nullptr, &used) == ARBITER_OK,
                        arbiter_last_error());
  BOOST_TEST(std::string(arbiter_backend_name(used.backend)) == "shm");
  BOOST_TEST(used.fused == 0u);
  // No norm_out: the GPU modules refuse it; shm ran the collective, wrote no
  // norm and returned success.
  a.norm_out = nullptr;
  BOOST_TEST(arbiter_comm_allreduce_fusion(comm, &a, nullptr, &used) == ARBITER_INVALID_ARGUMENT);
  BOOST_TEST(std::string(arbiter_last_error()).find("norm_out") != std::string::npos,
             arbiter_last_error());
  a.norm_out = norm_out.data();
  BOOST_REQUIRE_MESSAGE(arbiter_comm_allreduce_fusion(comm, &a, nullptr, &used) == ARBITER_OK,
                        arbiter_last_error());
  double squares = 0;
  for (int i = 0; i < 8; ++i) squares += double(x[i] + 1) * double(x[i] + 1);
  const double inv_rms = 1.0 / std::sqrt(squares / 8);
  for (int i = 0; i < 8; ++i) {
    BOOST_TEST(residual_out[i] == x[i] + 1.0f);
    BOOST_TEST(std::abs(norm_out[i] - (x[i] + 1) * inv_rms * 2) < 1e-5, i << ": " << norm_out[i]);
  }

  // The first block: no residual_in, so x is the sum alone; residual_out
  // gets the sum, here in place over the input.
  std::vector<float> sum = x;
  a.residual_in = nullptr;
  a.input = sum.data();
  a.residual_out = sum.data();
  BOOST_REQUIRE_MESSAGE(arbiter_comm_allreduce_fusion(comm, &a, nullptr, &used) == ARBITER_OK,
                        arbiter_last_error());
  double plain_squares = 0;
  for (int i = 0; i < 8; ++i) plain_squares += double(x[i]) * double(x[i]);
  const double plain_inv_rms = 1.0 / std::sqrt(plain_squares / 8);
  for (int i = 0; i < 8; ++i) {
    BOOST_TEST(sum[i] == x[i]);
    BOOST_TEST(std::abs(norm_out[i] - x[i] * plain_inv_rms * 2) < 1e-5, i << ": " << norm_out[i]);
  }
  a.input = x.data();
  a.residual_in = residual.data();
  a.residual_out = residual_out.data();

  std::vector<std::uint8_t> quant(4), scales(512);
  const float scale = 1.0f;
  a.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4;
  a.quant_out = quant.data();
  a.scale_out = scales.data();
  a.scale = &scale;
  BOOST_TEST(arbiter_comm_allreduce_fusion(comm, &a, nullptr, &used) == ARBITER_UNSUPPORTED);
  const std::string e = arbiter_last_error();
  BOOST_TEST(
      e.find("no backend can run this residual_rmsnorm_fp4 (NVFP4) call") != std::string::npos, e);
  BOOST_TEST(e.find("shm: does not run residual_rmsnorm_fp4") != std::string::npos, e);
  // A value that names no pattern is the caller's bug, as an unknown dtype.
  a.pattern = static_cast<arbiter_pattern>(9);
  BOOST_TEST(arbiter_comm_allreduce_fusion(comm, &a, nullptr, &used) == ARBITER_INVALID_ARGUMENT);
  BOOST_TEST(std::string(arbiter_last_error()).find("unknown pattern 9") != std::string::npos,
             arbiter_last_error());
  a.pattern = ARBITER_PATTERN_RESIDUAL_RMSNORM;
  a.dtype = static_cast<arbiter_dtype>(9);
  BOOST_TEST(arbiter_comm_allreduce_fusion(comm, &a, nullptr, &used) == ARBITER_INVALID_ARGUMENT);
  BOOST_TEST(std::string(arbiter_last_error()) == "unknown dtype 9 (0 fp16, 1 bf16, 2 fp32)");
  a.dtype = ARBITER_DTYPE_FP32;

  // A mask bit that names no pattern is the caller's bug.
  arbiter_comm_destroy(comm);
  o.pattern_mask = 1u << 7;
  BOOST_REQUIRE(arbiter_policy_from_environment(&p) == ARBITER_OK);
  comm = nullptr;
  BOOST_TEST(arbiter_comm_create(&solo, p, &o, &comm) == ARBITER_INVALID_ARGUMENT);
  BOOST_TEST(std::string(arbiter_last_error()).find("pattern_mask 128") != std::string::npos);
  BOOST_TEST(comm == nullptr);
  // So is a communicator without a hidden size: the fused workspaces are
  // sized from it (on a GPU, trtllm would make none and every call would go
  // unfused without a word).
  o.pattern_mask = 0;
  o.hidden = 0;
  BOOST_TEST(arbiter_comm_create(&solo, p, &o, &comm) == ARBITER_INVALID_ARGUMENT);
  BOOST_TEST(std::string(arbiter_last_error()).find("hidden is 0: pass the model's hidden size") !=
                 std::string::npos,
             arbiter_last_error());
  BOOST_TEST(comm == nullptr);
  o.hidden = 8;
  // So is an oob without a function, or a rank outside its group.
  arbiter_oob broken = solo;
  broken.barrier = nullptr;
  BOOST_TEST(arbiter_comm_create(&broken, p, &o, &comm) == ARBITER_INVALID_ARGUMENT);
  BOOST_TEST(std::string(arbiter_last_error()).find("a NULL function") != std::string::npos,
             arbiter_last_error());
  broken = solo;
  broken.rank = 5;
  BOOST_TEST(arbiter_comm_create(&broken, p, &o, &comm) == ARBITER_INVALID_ARGUMENT);
  BOOST_TEST(std::string(arbiter_last_error()).find("oob: rank 5 of 1") != std::string::npos,
             arbiter_last_error());
  BOOST_TEST(comm == nullptr);
  arbiter_policy_free(p);
  unsetenv("ARBITER_PLUGIN_PATH");
}

namespace {
int arbiter_shm_files() {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    n += e.path().filename().string().rfind("arbiter-shm-", 0) == 0;
  }
  return n;
}
}  // namespace

// arbiter_comm_alloc/_free from C at 2 ranks (threads of this process, an
// in-process oob): registered inputs give the bits of ordinary ones, a bad
// free is refused with a message, and destroy frees what is left, so
// nothing stays in /dev/shm.
BOOST_AUTO_TEST_CASE(registered_memory_from_c_gives_the_same_bits_and_refuses_a_bad_free) {
  unsetenv("ARBITER_CONFIG");
  unsetenv("ARBITER_BACKENDS");
  setenv("ARBITER_PLUGIN_PATH", ARBITER_PLUGIN_DIR, 1);
  const int before = arbiter_shm_files();
  arbiter::test::ThreadGroup group(2);
  std::vector<std::string> why(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      const arbiter_oob oob = group.oob(r);
      char buf[512] = "";
      if (c_registered_rank(&oob, buf, sizeof buf) != 0) why[r] = buf;
    });
  }
  for (auto& t : ranks) t.join();
  BOOST_TEST(why[0] == "");
  BOOST_TEST(why[1] == "");
  BOOST_TEST(arbiter_shm_files() == before);
  unsetenv("ARBITER_PLUGIN_PATH");
}
