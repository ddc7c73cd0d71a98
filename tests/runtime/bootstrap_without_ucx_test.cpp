// Without UCX the runtime still loads and a world of one rank still joins;
// only a join of several ranks fails, at that call, saying what is missing
// and what to install (the UCX side lives in libarbiter_bootstrap_ucx.so,
// which the runtime dlopens on first use).
#define BOOST_TEST_MODULE runtime_bootstrap_without_ucx
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <filesystem>
#include <string>

#include "run_command.h"

using namespace arbiter::test;
namespace fs = std::filesystem;

namespace {

const std::string kRank = ARBITER_BOOTSTRAP_RANK_BIN;
// A machine without UCX has none preloaded either (scripts/test-hardening.sh
// preloads it for its ASan run).
constexpr const char* kNoUcxPreloaded =
    "env -u LD_PRELOAD -u ARBITER_BOOTSTRAP_PORT -u ARBITER_JOB_TOKEN ";

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

std::string launch_two(const std::string& library_path, int* exit_code) {
  const CommandResult r = run_command(std::string(kNoUcxPreloaded) + ARBITER_BIN +
                                      " launch --nproc 2 --timeout 60 -- env LD_LIBRARY_PATH=" +
                                      shell_quote(library_path) + " " + kRank + " --iterations 1");
  *exit_code = r.exit_code;
  return r.output;
}

}  // namespace

BOOST_AUTO_TEST_CASE(an_unusable_ucx_fails_the_join_of_two_ranks_with_what_to_install) {
  int code = 0;
  const std::string out = launch_two(ARBITER_FAKE_UCP_DIR, &code);
  BOOST_TEST(code != 0, out);
  BOOST_TEST(contains(out, "UCX is not available to join a group of several ranks"), out);
  BOOST_TEST(contains(out, "libucp"), out);
  BOOST_TEST(contains(out, "apt-get install libucx0"), out);
}

BOOST_AUTO_TEST_CASE(a_world_of_one_needs_no_ucx) {
  const CommandResult r = run_command(
      std::string(kNoUcxPreloaded) + "RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LD_LIBRARY_PATH=" +
      shell_quote(ARBITER_FAKE_UCP_DIR) + " " + kRank + " --iterations 1");
  BOOST_TEST(r.exit_code == 0, r.output);
  BOOST_TEST(contains(r.output, "rank 0 OK"), r.output);
}

BOOST_AUTO_TEST_CASE(a_runtime_without_its_bootstrap_library_says_the_install_is_incomplete) {
  // The runtime and the policy alone, found first through LD_LIBRARY_PATH.
  const fs::path dir = fs::temp_directory_path() / ("arbiter-no-ucx-" + std::to_string(getpid()));
  fs::create_directories(dir);
  for (const fs::path& file :
       {fs::path(ARBITER_RUNTIME_SONAME_FILE), fs::path(ARBITER_POLICY_SONAME_FILE)}) {
    fs::copy_file(file, dir / file.filename(), fs::copy_options::overwrite_existing);
  }
  int code = 0;
  const std::string out = launch_two(dir.string(), &code);
  fs::remove_all(dir);
  BOOST_TEST(code != 0, out);
  BOOST_TEST(contains(out, "libarbiter_bootstrap_ucx.so is missing"), out);
  BOOST_TEST(contains(out, "install is incomplete"), out);
}
