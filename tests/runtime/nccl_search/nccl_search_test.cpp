// Where the nccl module's libnccl.so.2 comes from: already loaded, then
// ARBITER_NCCL_LIBRARY (no fallback when it fails), then pip's NCCL wheel,
// then the system; and through the registry, that the module then runs on
// that file, or is unavailable with the reason while the others still load.
//
// The order is checked on copies of a fake NCCL under a soname no real
// install has (libarbiter-test-nccl.so.2), each in a fresh process: this
// machine's own libnccl.so.2 cannot leak into the answer.
#define BOOST_TEST_MODULE runtime_nccl_search
#include <boost/test/unit_test.hpp>

#include <string>

#include "json.h"
#include "run_command.h"

using namespace arbiter::test;

namespace {

const std::string kFakes = ARBITER_FAKE_NCCL_DIR;  // a/ b/ c/ d/ real_a/ real_b/ module/
const std::string kTestSoname = "libarbiter-test-nccl.so.2";
// ASan (scripts/test-hardening.sh) wants to come first and LD_PRELOAD puts a
// fake first: relax that check, keeping the caller's other ASan options.
const std::string kEnv =
    "env -u ARBITER_NCCL_LIBRARY -u LD_PRELOAD -u LD_LIBRARY_PATH "
    "ASAN_OPTIONS=\"${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0\" ";

std::string dir(const std::string& name) { return kFakes + "/" + name; }

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// The probe's one line, run with `env` words before it and `args` after.
std::string search(const std::string& env, const std::string& args = "") {
  const CommandResult r =
      run_command(kEnv + env + " " + ARBITER_NCCL_SEARCH_PROBE + " " + kTestSoname + " " + args);
  BOOST_TEST(r.exit_code == 0, r.output);
  return r.output;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(order)

BOOST_AUTO_TEST_CASE(nothing_found_says_what_was_tried_and_what_to_install) {
  const std::string out = search("", "--wheel " + dir("nowhere"));
  BOOST_TEST(contains(out, "found=0"), out);
  BOOST_TEST(contains(out, "ARBITER_NCCL_LIBRARY not set"), out);
  BOOST_TEST(contains(out, "no " + dir("nowhere") + "/" + kTestSoname), out);
  BOOST_TEST(contains(out, "pip install nvidia-nccl-cu13"), out);
}

BOOST_AUTO_TEST_CASE(the_system_library_path_comes_last) {
  const std::string out = search("LD_LIBRARY_PATH=" + dir("d"));
  BOOST_TEST(contains(out, "found=1 version=22804 source=the system's library path"), out);
}

BOOST_AUTO_TEST_CASE(the_wheel_beats_the_system) {
  const std::string out =
      search("LD_LIBRARY_PATH=" + dir("d"), "--wheel " + dir("nowhere") + " --wheel " + dir("c"));
  BOOST_TEST(contains(out, "found=1 version=22803 source=the nvidia-nccl-cu13 wheel path=" +
                               dir("c") + "/" + kTestSoname),
             out);
}

BOOST_AUTO_TEST_CASE(the_explicit_variable_beats_the_wheel_as_a_folder_or_a_file) {
  std::string out =
      search("LD_LIBRARY_PATH=" + dir("d"), "--explicit " + dir("b") + " --wheel " + dir("c"));
  BOOST_TEST(contains(out, "found=1 version=22802 source=ARBITER_NCCL_LIBRARY"), out);
  out = search("", "--explicit " + dir("b") + "/" + kTestSoname + " --wheel " + dir("c"));
  BOOST_TEST(contains(out, "found=1 version=22802 source=ARBITER_NCCL_LIBRARY"), out);
}

BOOST_AUTO_TEST_CASE(an_explicit_variable_that_fails_never_falls_back) {
  const std::string out = search("LD_LIBRARY_PATH=" + dir("d"),
                                 "--explicit " + dir("nowhere") + " --wheel " + dir("c"));
  BOOST_TEST(contains(out, "found=0 reason=ARBITER_NCCL_LIBRARY=" + dir("nowhere")), out);
  BOOST_TEST(contains(out, "or unset it"), out);
}

BOOST_AUTO_TEST_CASE(a_library_already_loaded_beats_everything) {
  const std::string out =
      search("LD_PRELOAD=" + dir("a") + "/" + kTestSoname + " LD_LIBRARY_PATH=" + dir("d"),
             "--explicit " + dir("b") + " --wheel " + dir("c"));
  BOOST_TEST(contains(out, "found=1 version=22801 source=already loaded by this process path=" +
                               dir("a") + "/" + kTestSoname),
             out);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(registry)

namespace {

// `arbiter plugins --json` with the fake nccl module (it needs libnccl.so.2
// and has no RUNPATH) before the build's modules.
Json plugins(const std::string& env) {
  const CommandResult r = run_command(kEnv + env + " ARBITER_PLUGIN_PATH=" + dir("module") + ":" +
                                      ARBITER_PLUGIN_DIR + " " + ARBITER_BIN + " plugins --json");
  BOOST_TEST(r.exit_code == 0, r.output);
  return JsonReader::parse(r.output);
}

const Json* module(const Json& list, const std::string& name) {
  for (const Json& m : list.array) {
    if (m["name"].string == name) return &m;
  }
  return nullptr;
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_module_runs_on_the_nccl_the_variable_names) {
  const Json j = plugins("ARBITER_NCCL_LIBRARY=" + dir("real_a"));
  const Json* nccl = module(j, "nccl");
  BOOST_REQUIRE(nccl != nullptr);
  BOOST_TEST((*nccl)["available"].boolean, (*nccl)["reason"].string);
  BOOST_TEST(contains((*nccl)["dependency"].string,
                      "2.28.11 (" + dir("real_a") + "/libnccl.so.2; ARBITER_NCCL_LIBRARY)"),
             (*nccl)["dependency"].string);
}

BOOST_AUTO_TEST_CASE(the_module_runs_on_the_nccl_the_process_already_has) {
  const Json j = plugins("LD_PRELOAD=" + dir("real_b") +
                         "/libnccl.so.2 ARBITER_NCCL_LIBRARY=" + dir("real_a"));
  const Json* nccl = module(j, "nccl");
  BOOST_REQUIRE(nccl != nullptr);
  BOOST_TEST((*nccl)["available"].boolean, (*nccl)["reason"].string);
  BOOST_TEST(contains((*nccl)["dependency"].string,
                      "2.28.12 (" + dir("real_b") + "/libnccl.so.2; already loaded"),
             (*nccl)["dependency"].string);
}

BOOST_AUTO_TEST_CASE(without_its_nccl_the_module_is_unavailable_and_the_rest_works) {
  const Json j = plugins("ARBITER_NCCL_LIBRARY=" + dir("nowhere"));
  const Json* nccl = module(j, "nccl");
  BOOST_REQUIRE(nccl != nullptr);
  BOOST_TEST(!(*nccl)["available"].boolean);
  BOOST_TEST(contains((*nccl)["reason"].string, "ARBITER_NCCL_LIBRARY=" + dir("nowhere")),
             (*nccl)["reason"].string);
  const Json* shm = module(j, "shm");
  BOOST_REQUIRE(shm != nullptr);
  BOOST_TEST((*shm)["available"].boolean);
}

BOOST_AUTO_TEST_SUITE_END()
