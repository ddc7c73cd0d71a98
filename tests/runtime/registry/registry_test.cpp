// The loader: every module found is recorded as available or with the
// reason it is not; a broken module never takes the process down.
#define BOOST_TEST_MODULE runtime_registry
#include <boost/test/unit_test.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>

#include "arbiter/registry.h"

using namespace arbiter;

namespace {

std::map<std::string, ModuleInfo> discover_fakes() {
  DiscoverOptions o;
  o.search_path = {ARBITER_FAKE_DIR};
  o.default_folder = false;
  Registry r = Registry::discover(o);
  std::map<std::string, ModuleInfo> by_file;
  for (const ModuleInfo& m : r.modules()) {
    by_file[m.path.substr(m.path.rfind('/') + 1)] = m;
  }
  return by_file;
}

bool has(const std::string& text, const std::string& words) {
  return text.find(words) != std::string::npos;
}

}  // namespace

// Entries of the search path that cannot be searched are recorded with the
// reason (a communicator refuses them); the others are searched as before.
// The default folder is not one: a build without modules is no error.
BOOST_AUTO_TEST_CASE(search_path_entries_that_cannot_be_searched_are_named_with_the_reason) {
  const std::string loop = "registry_test_loop";
  std::remove(loop.c_str());
  BOOST_REQUIRE(symlink(loop.c_str(), loop.c_str()) == 0);
  DiscoverOptions o;
  o.search_path = {"registry_test_missing", "/dev/null", loop, ARBITER_FAKE_DIR};
  o.default_folder = false;
  const Registry r = Registry::discover(o);
  std::remove(loop.c_str());
  BOOST_REQUIRE(r.search_errors().size() == 3u);
  BOOST_TEST(r.search_errors()[0].place == "registry_test_missing");
  BOOST_TEST(r.search_errors()[0].reason == "No such file or directory");
  BOOST_TEST(r.search_errors()[1].reason == "is neither a folder nor a module file");
  BOOST_TEST(r.search_errors()[2].reason == "Too many levels of symbolic links");
  BOOST_TEST(has(r.search_error_message(),
                 "DiscoverOptions::search_path entry 'registry_test_missing': No such file"),
             r.search_error_message());
  BOOST_TEST(has(r.search_error_message(), "(fix the entry or remove it"));
  bool good = false;
  for (const ModuleInfo& m : r.modules())
    good = good || (m.path.ends_with("/libarbiter-good.so") && m.available);
  BOOST_TEST(good);

  o.search_path = {ARBITER_FAKE_DIR};
  o.default_folder = true;
  BOOST_TEST(Registry::discover(o).search_errors().empty());
  BOOST_TEST(Registry::discover(o).search_error_message().empty());
}

// A module that crashes in its constructor or probe() ends the process (no
// loader can survive that in-process), but first names its file on stderr,
// then dies of the same signal: it died silently, exit 139, nothing said.
BOOST_AUTO_TEST_CASE(a_module_that_crashes_while_loading_is_named_before_the_process_dies) {
  for (const char* name : {"ctor_crash", "probe_crash"}) {
    BOOST_TEST_CONTEXT(name) {
      const std::string path =
          std::string(ARBITER_CRASHING_FAKE_DIR) + "/libarbiter-" + name + ".so";
      int err[2];
      BOOST_REQUIRE(pipe(err) == 0);
      const pid_t child = fork();
      BOOST_REQUIRE(child >= 0);
      if (child == 0) {
        dup2(err[1], STDERR_FILENO);
        signal(SIGSEGV, SIG_DFL);  // not Boost.Test's, which would resume the suite here
        DiscoverOptions o;
        o.search_path = {path};
        o.default_folder = false;
        Registry::discover(o);
        _exit(0);
      }
      close(err[1]);
      std::string said;
      char buffer[512];
      for (ssize_t n; (n = read(err[0], buffer, sizeof buffer)) > 0;) said.append(buffer, n);
      close(err[0]);
      int status = 0;
      BOOST_REQUIRE(waitpid(child, &status, 0) == child);
      BOOST_TEST(WIFSIGNALED(status));
      BOOST_TEST((WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV));
      BOOST_TEST(has(said, "arbiter: SIGSEGV while loading the backend module " + path +
                               " (in its constructor or probe()"),
                 said);
    }
  }
  // Loading over: the handlers are the ones from before, except one a
  // module installed while it loaded, which is its to keep (the note put
  // back the one from before over it).
  const pid_t child = fork();
  BOOST_REQUIRE(child >= 0);
  if (child == 0) {
    auto handler = [] {
      struct sigaction now {};
      sigaction(SIGSEGV, nullptr, &now);
      return reinterpret_cast<void*>(now.sa_handler);
    };
    signal(SIGSEGV, SIG_IGN);
    discover_fakes();
    if (handler() != reinterpret_cast<void*>(SIG_IGN)) _exit(1);
    DiscoverOptions o;
    o.search_path = {std::string(ARBITER_CRASHING_FAKE_DIR) + "/libarbiter-crash_handler_owner.so"};
    o.default_folder = false;
    Registry::discover(o);
    _exit(handler() == reinterpret_cast<void*>(SIG_IGN) ? 2 : 0);
  }
  int status = 0;
  BOOST_REQUIRE(waitpid(child, &status, 0) == child);
  BOOST_TEST(WIFEXITED(status));
  BOOST_TEST(WEXITSTATUS(status) == 0, "1: a handler from before was lost; 2: the module's was");
}

BOOST_AUTO_TEST_CASE(a_good_module_is_available_with_its_caps) {
  auto m = discover_fakes();
  const ModuleInfo& good = m.at("libarbiter-good.so");
  BOOST_TEST(good.available);
  BOOST_TEST(good.reason.empty());
  BOOST_TEST(good.abi_version == 1u);
  BOOST_TEST(good.name == "trtllm");
  BOOST_TEST((good.caps.world_size_mask & (1ull << 8)) != 0u);
}

BOOST_AUTO_TEST_CASE(broken_modules_are_recorded_with_the_reason) {
  auto m = discover_fakes();
  BOOST_TEST(!m.at("libarbiter-wrong_version.so").available);
  BOOST_TEST(has(m.at("libarbiter-wrong_version.so").reason, "wrong ABI version"));
  BOOST_TEST(has(m.at("libarbiter-wrong_version.so").reason, "abi_version 7"));
  BOOST_TEST(has(m.at("libarbiter-no_symbol.so").reason, "missing symbol arbiter_backend_v1"));
  const ModuleInfo& future = m.at("libarbiter-future_version.so");
  BOOST_TEST(!future.available);
  BOOST_TEST(future.abi_version == 2u);
  BOOST_TEST(has(future.reason, "ABI v2; this arbiter knows v1"), future.reason);
  BOOST_TEST(has(m.at("libarbiter-probe_fails.so").reason, "probe failed: the fake probe says no"));
  BOOST_TEST(has(m.at("libarbiter-unknown_name.so").reason, "'frobnicator' is not a backend"));
  BOOST_TEST(has(m.at("libarbiter-null_entry.so").reason, "required entry"));
  BOOST_TEST(has(m.at("libarbiter-cpu_answer.so").reason,
                 "probe answered for a CPU when asked about a GPU rank"),
             m.at("libarbiter-cpu_answer.so").reason);
  // A device kind that names none was reported as "answered for a GPU when
  // asked about a GPU".
  BOOST_TEST(has(m.at("libarbiter-odd_kind.so").reason,
                 "probe answered caps.device_kind 77, which names no device kind"),
             m.at("libarbiter-odd_kind.so").reason);
  // A probe that throws costs its module only: the others were loaded.
  BOOST_TEST(has(m.at("libarbiter-probe_throws.so").reason, "probe threw a C++ exception"),
             m.at("libarbiter-probe_throws.so").reason);
  BOOST_TEST(m.at("libarbiter-good.so").available);
}

BOOST_AUTO_TEST_CASE(a_file_not_named_like_a_module_is_recorded_not_fatal) {
  // ARBITER_PLUGIN_PATH may name module files; one named otherwise says how
  // modules are named, and the rest of discovery goes on.
  const std::string copy = "/tmp/arbiter-registry-test-" + std::to_string(::getpid()) + ".so";
  BOOST_TEST_REQUIRE(
      std::system(
          ("cp " + std::string(ARBITER_FAKE_DIR) + "/libarbiter-good.so " + copy).c_str()) == 0);
  DiscoverOptions o;
  o.search_path = {copy, std::string(ARBITER_FAKE_DIR) + "/libarbiter-good.so"};
  o.default_folder = false;
  Registry r = Registry::discover(o);
  std::remove(copy.c_str());
  BOOST_TEST_REQUIRE(r.modules().size() == 2u);
  BOOST_TEST(!r.modules()[0].available);
  BOOST_TEST(has(r.modules()[0].reason, "modules are named libarbiter-<backend>.so"),
             r.modules()[0].reason);
  BOOST_TEST(r.backend(Backend::kTrtllm) != nullptr);
}

BOOST_AUTO_TEST_CASE(each_module_is_loaded_once) {
  // The good fake named twice and through its folder: listed once, serving
  // trtllm.
  DiscoverOptions o;
  o.search_path = {std::string(ARBITER_FAKE_DIR) + "/libarbiter-good.so",
                   std::string(ARBITER_FAKE_DIR) + "/libarbiter-good.so", ARBITER_FAKE_DIR};
  o.default_folder = false;
  Registry r = Registry::discover(o);
  BOOST_TEST(r.backend(Backend::kTrtllm) != nullptr);
  BOOST_TEST(r.available_mask() == (1u << static_cast<int>(Backend::kTrtllm)));
  int goods = 0;
  for (const ModuleInfo& info : r.modules()) {
    goods += info.path.find("libarbiter-good.so") != std::string::npos;
  }
  BOOST_TEST(goods == 1);
}

BOOST_AUTO_TEST_CASE(missing_folders_and_files_are_ignored) {
  DiscoverOptions o;
  o.search_path = {"/nonexistent/folder", "/nonexistent/libarbiter-x.so"};
  o.default_folder = false;
  Registry r = Registry::discover(o);
  BOOST_TEST(r.modules().empty());
  BOOST_TEST(r.available_mask() == 0u);
}
