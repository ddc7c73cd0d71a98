// Reading the launcher's environment: what a rank relies on when it starts
// under torchrun or `arbiter launch`, and the errors it gets when a variable
// is missing or wrong. Also a world of one rank, which needs no network.
#define BOOST_TEST_MODULE runtime_bootstrap_env
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "arbiter/bootstrap.h"

using namespace arbiter;

namespace {

const char* const kVariables[] = {"RANK",
                                  "WORLD_SIZE",
                                  "LOCAL_RANK",
                                  "LOCAL_WORLD_SIZE",
                                  "MASTER_ADDR",
                                  "MASTER_PORT",
                                  "ARBITER_JOB_TOKEN",
                                  "ARBITER_BOOTSTRAP_TIMEOUT",
                                  "ARBITER_BOOTSTRAP_PORT"};

// Sets exactly the given variables (the others of kVariables are unset).
struct Environment {
  explicit Environment(const std::vector<std::pair<const char*, const char*>>& values) {
    for (const char* name : kVariables) unsetenv(name);
    for (const auto& [name, value] : values) setenv(name, value, 1);
  }
  ~Environment() {
    for (const char* name : kVariables) unsetenv(name);
  }
};

const std::vector<std::pair<const char*, const char*>> kTorchrun = {{"RANK", "3"},
                                                                    {"WORLD_SIZE", "8"},
                                                                    {"LOCAL_RANK", "1"},
                                                                    {"LOCAL_WORLD_SIZE", "4"},
                                                                    {"MASTER_ADDR", "10.0.0.7"},
                                                                    {"MASTER_PORT", "29500"}};

std::vector<std::pair<const char*, const char*>> with(
    std::vector<std::pair<const char*, const char*>> base, const char* name, const char* value) {
  for (auto& entry : base) {
    if (std::string(entry.first) == name) {
      entry.second = value;
      return base;
    }
  }
  base.emplace_back(name, value);
  return base;
}

std::vector<std::pair<const char*, const char*>> without(
    std::vector<std::pair<const char*, const char*>> base, const char* name) {
  std::erase_if(base, [&](const auto& entry) { return std::string(entry.first) == name; });
  return base;
}

// The message of the error bootstrap_options_from_environment() throws.
std::string error_for(const std::vector<std::pair<const char*, const char*>>& values) {
  Environment env(values);
  try {
    bootstrap_options_from_environment();
  } catch (const BootstrapError& e) {
    BOOST_TEST(e.code() == ARBITER_INVALID_ARGUMENT);
    return e.what();
  }
  return "(no error)";
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

}  // namespace

BOOST_AUTO_TEST_CASE(torchrun_variables_are_read_and_local_rank_is_the_gpu) {
  Environment env(kTorchrun);
  const BootstrapOptions o = bootstrap_options_from_environment();
  BOOST_TEST(o.rank == 3);
  BOOST_TEST(o.world_size == 8);
  BOOST_TEST(o.local_rank == 1);
  BOOST_TEST(o.master_addr == "10.0.0.7");
  BOOST_TEST(o.master_port == 29500);
  BOOST_TEST(o.timeout.count() == 60000);
}

BOOST_AUTO_TEST_CASE(missing_variables_are_named_with_the_fix) {
  for (const char* name : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) {
    const std::string message = error_for(without(kTorchrun, name));
    BOOST_TEST(contains(message, std::string(name) + " is not set"), message);
    BOOST_TEST(contains(message, "arbiter launch"), message);
  }
}

BOOST_AUTO_TEST_CASE(cpu_ranks_started_by_hand_need_no_local_rank) {
  // torchrun and `arbiter launch` set it; a CPU rank started by hand has no
  // device to name. A GPU rank without it is told at creation (c_api_test).
  Environment env(without(kTorchrun, "LOCAL_RANK"));
  const BootstrapOptions o = bootstrap_options_from_environment(std::chrono::seconds(60));
  BOOST_TEST(o.rank == 3);
  BOOST_TEST(o.local_rank == -1);
  // LOCAL_WORLD_SIZE alone constrains nothing.
  Environment lws(with(without(kTorchrun, "LOCAL_RANK"), "LOCAL_WORLD_SIZE", "2"));
  BOOST_TEST(bootstrap_options_from_environment(std::chrono::seconds(60)).local_rank == -1);
  const std::string m = error_for(with(kTorchrun, "LOCAL_RANK", "x"));
  BOOST_TEST(contains(m, "LOCAL_RANK='x' is not a whole number >= 0 (the GPU ordinal)"), m);
}

BOOST_AUTO_TEST_CASE(malformed_variables_are_named_with_their_value) {
  std::string m = error_for(with(kTorchrun, "WORLD_SIZE", "eight"));
  BOOST_TEST(contains(m, "WORLD_SIZE='eight' is not a whole number"), m);
  m = error_for(with(kTorchrun, "RANK", "-1"));
  BOOST_TEST(contains(m, "RANK='-1'"), m);
  m = error_for(with(kTorchrun, "RANK", "8"));
  BOOST_TEST(contains(m, "RANK=8 is not below WORLD_SIZE=8"), m);
  m = error_for(with(kTorchrun, "LOCAL_RANK", "4"));
  BOOST_TEST(contains(m, "LOCAL_RANK=4 is not below LOCAL_WORLD_SIZE=4"), m);
  m = error_for(with(kTorchrun, "MASTER_PORT", "70000"));
  BOOST_TEST(contains(m, "MASTER_PORT='70000' is not a port number"), m);
  m = error_for(with(kTorchrun, "MASTER_PORT", "29500 "));
  BOOST_TEST(contains(m, "MASTER_PORT='29500 '"), m);
  m = error_for(with(kTorchrun, "MASTER_ADDR", ""));
  BOOST_TEST(contains(m, "MASTER_ADDR is empty"), m);
  m = error_for(with(kTorchrun, "ARBITER_BOOTSTRAP_TIMEOUT", "0"));
  BOOST_TEST(contains(m, "ARBITER_BOOTSTRAP_TIMEOUT='0' is not a number of seconds"), m);
  m = error_for(with(kTorchrun, "ARBITER_BOOTSTRAP_TIMEOUT", "ten"));
  BOOST_TEST(contains(m, "ARBITER_BOOTSTRAP_TIMEOUT='ten'"), m);
  m = error_for(with(kTorchrun, "ARBITER_BOOTSTRAP_PORT", "0"));
  BOOST_TEST(contains(m, "ARBITER_BOOTSTRAP_PORT='0'"), m);
}

BOOST_AUTO_TEST_CASE(bootstrap_timeout_is_seconds_and_wins_over_the_argument) {
  Environment env(with(kTorchrun, "ARBITER_BOOTSTRAP_TIMEOUT", "2.5"));
  BOOST_TEST(bootstrap_options_from_environment(std::chrono::seconds(5)).timeout.count() == 2500);
  unsetenv("ARBITER_BOOTSTRAP_TIMEOUT");
  BOOST_TEST(bootstrap_options_from_environment(std::chrono::seconds(5)).timeout.count() == 5000);
}

BOOST_AUTO_TEST_CASE(bootstrap_port_overrides_master_port_for_torchrun_stores) {
  Environment env(with(kTorchrun, "ARBITER_BOOTSTRAP_PORT", "29600"));
  BOOST_TEST(bootstrap_options_from_environment().master_port == 29600);
}

BOOST_AUTO_TEST_CASE(job_token_comes_from_the_environment_or_is_derived_from_the_launch) {
  {
    Environment env(with(kTorchrun, "ARBITER_JOB_TOKEN", "s3cret"));
    BOOST_TEST(bootstrap_options_from_environment().job_token == "s3cret");
  }
  Environment env(kTorchrun);
  const std::string derived = bootstrap_options_from_environment().job_token;
  BOOST_TEST(derived == derive_job_token("10.0.0.7", 29500, 8));
  BOOST_TEST(derived.rfind("derived-", 0) == 0);
  // Jobs that differ in address, port or size get different tokens.
  BOOST_TEST(derived != derive_job_token("10.0.0.7", 29501, 8));
  BOOST_TEST(derived != derive_job_token("10.0.0.8", 29500, 8));
  BOOST_TEST(derived != derive_job_token("10.0.0.7", 29500, 4));
  BOOST_TEST(
      error_for(with(kTorchrun, "ARBITER_JOB_TOKEN", "")).find("ARBITER_JOB_TOKEN is empty") !=
      std::string::npos);
}

BOOST_AUTO_TEST_CASE(a_world_of_one_needs_no_address_and_no_network) {
  Environment env({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"LOCAL_RANK", "0"}});
  Bootstrap bs = Bootstrap::from_environment();
  BOOST_TEST(bs.rank() == 0);
  BOOST_TEST(bs.world_size() == 1);
  const char send[] = "abc";
  char recv[4] = {};
  BOOST_TEST(bs.allgather(send, recv, 4, std::chrono::seconds(1)).ok());
  BOOST_TEST(std::string(recv) == "abc");
  BOOST_TEST(bs.barrier(std::chrono::seconds(1)).ok());
  const arbiter_oob* oob = bs.oob();
  BOOST_TEST(oob->rank == 0);
  BOOST_TEST(oob->size == 1);
  BOOST_TEST(oob->broadcast(oob->ctx, recv, 4, 0, 1000) == ARBITER_OK);
  // Moving the Bootstrap keeps the C view valid.
  Bootstrap moved = std::move(bs);
  BOOST_TEST(moved.oob() == oob);
  BOOST_TEST(oob->barrier(oob->ctx, 1000) == ARBITER_OK);
}

BOOST_AUTO_TEST_CASE(bad_arguments_fail_with_a_message_in_last_error) {
  BootstrapOptions o;
  o.job_token = "t";
  Bootstrap bs = Bootstrap::connect(o);
  const arbiter_oob* oob = bs.oob();
  char buf[4] = {};
  BOOST_TEST(oob->broadcast(oob->ctx, buf, 4, 1, 1000) == ARBITER_INVALID_ARGUMENT);
  BOOST_TEST(contains(oob->last_error(oob->ctx), "root 1 is not a rank of this group"));
  BOOST_TEST(oob->allgather(oob->ctx, nullptr, buf, 4, 1000) == ARBITER_INVALID_ARGUMENT);
  BOOST_TEST(contains(oob->last_error(oob->ctx), "NULL"));
  BOOST_TEST(oob->barrier(oob->ctx, -1) == ARBITER_INVALID_ARGUMENT);
  BOOST_TEST(contains(oob->last_error(oob->ctx), "negative"));
}

BOOST_AUTO_TEST_CASE(invalid_options_are_refused_before_any_network) {
  BootstrapOptions o;
  o.job_token = "t";
  o.world_size = 2;
  o.rank = 2;
  BOOST_CHECK_EXCEPTION(Bootstrap::connect(o), BootstrapError, [](const BootstrapError& e) {
    return e.code() == ARBITER_INVALID_ARGUMENT && contains(e.what(), "rank 2 is not in 0..1");
  });
  o.rank = 1;
  o.master_port = 0;
  BOOST_CHECK_EXCEPTION(Bootstrap::connect(o), BootstrapError, [](const BootstrapError& e) {
    return contains(e.what(), "MASTER_PORT must be set");
  });
  o.master_port = 29500;
  o.master_addr = "no-such-host.invalid";
  BOOST_CHECK_EXCEPTION(Bootstrap::connect(o), BootstrapError, [](const BootstrapError& e) {
    return e.code() == ARBITER_UNAVAILABLE &&
           contains(e.what(), "MASTER_ADDR='no-such-host.invalid' does not resolve");
  });
}

// A launcher's MASTER_PORT lies below the kernel's ephemeral range, where no
// outgoing connection or bind to port 0 can take it before rank 0 listens
// (a port the kernel picked was taken so in the fault suite), and it is free.
BOOST_AUTO_TEST_CASE(a_launchers_port_is_free_and_below_the_ephemeral_range) {
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  unsigned low = 32768, high = 60999;
  range >> low >> high;
  for (int k = 0; k < 20; ++k) {
    const std::uint16_t port = arbiter::free_bootstrap_port();
    if (low > 10001) {
      BOOST_TEST(port >= 10000u);
      BOOST_TEST(port < low);
    }
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(port);
    BOOST_TEST(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0,
               "port " << port);
    ::close(fd);
  }
}
