// The C API as a framework that is not C++ uses it: load, decide, explain,
// errors as codes plus messages.
#define BOOST_TEST_MODULE runtime_c_api
#include <boost/test/unit_test.hpp>

#include <cstdlib>
#include <string>

#include "arbiter/arbiter.h"

extern "C" int32_t c_decide_nvl72(uint64_t bytes, arbiter_decision* out);

namespace {
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

  arbiter_comm_info info{};
  BOOST_TEST(arbiter_comm_get_info(nullptr, &info) == ARBITER_INVALID_ARGUMENT);
  unsetenv("WORLD_SIZE");
  unsetenv("LOCAL_RANK");
  arbiter_policy_free(p);
}
