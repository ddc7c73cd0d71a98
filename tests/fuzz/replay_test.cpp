// Replays a fuzz target's seeds and every input that once crashed it
// (tests/data/fuzz/<target>/) through the target's entry point, in the
// normal build: a fixed crash stays fixed without clang or libFuzzer. A
// crash here aborts the suite; the last checkpoint names the input.
#define BOOST_TEST_MODULE fuzz_replay
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace fs = std::filesystem;

namespace {

// FUZZ_REPLAY_DIRS: ':'-separated folders; a missing one holds no inputs.
std::vector<fs::path> inputs() {
  std::vector<fs::path> files;
  std::stringstream dirs(FUZZ_REPLAY_DIRS);
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    std::error_code ec;
    if (dir.empty() || !fs::is_directory(dir, ec)) continue;
    for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
      if (e.is_regular_file()) files.push_back(e.path());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_seed_and_past_crash_runs_cleanly) {
  const std::vector<fs::path> files = inputs();
  BOOST_TEST(
      files.size() >= static_cast<std::size_t>(FUZZ_REPLAY_MIN_INPUTS),
      FUZZ_TARGET_NAME << ": only " << files.size() << " inputs found in " << FUZZ_REPLAY_DIRS);
  for (const fs::path& file : files) {
    std::ifstream in(file, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    BOOST_TEST_CHECKPOINT(FUZZ_TARGET_NAME << " " << file.string());
    BOOST_TEST(LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()),
                                      bytes.size()) == 0,
               file.string());
  }
  BOOST_TEST_MESSAGE(FUZZ_TARGET_NAME << ": " << files.size() << " inputs replayed");
}
