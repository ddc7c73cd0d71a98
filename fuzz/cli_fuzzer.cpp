// libFuzzer target: the `arbiter` command line, in process. The input is
// the argument list, one argument a line; the first line picks what runs:
// `decide` or `sweep` run the whole subcommand (tables loaded, decision
// printed to a discarded stream), anything else parses the request flags
// with the helpers every subcommand shares (read_request, size_flag).
//
// Bad flags must end in UsageError (exit 2 in main); any other exception
// escaping is a finding. An accepted request must make sense: at least 2
// ranks, nodes in 1..world size, and a message size that is exactly
// tokens x hidden x element size (no wrap-around) within 1 B .. 1 TiB.
//
// Arguments naming a file (--config) are dropped: the target reads no files.
#include <cstddef>
#include <cstdint>
#include <iostream>
#include <streambuf>
#include <string>
#include <vector>

#include "arbiter/size.h"
#include "cli.h"
#include "fuzz_check.h"

namespace {

using namespace arbiter;
using namespace arbiter::cli;

class NullBuffer : public std::streambuf {
 protected:
  int overflow(int c) override { return c == EOF ? 0 : c; }
  std::streamsize xsputn(const char*, std::streamsize n) override { return n; }
};

// Sends std::cout and std::cerr nowhere while alive.
class Silence {
 public:
  Silence() : out_(std::cout.rdbuf(&null_)), err_(std::cerr.rdbuf(&null_)) {}
  ~Silence() {
    std::cout.rdbuf(out_);
    std::cerr.rdbuf(err_);
  }

 private:
  NullBuffer null_;
  std::streambuf* out_;
  std::streambuf* err_;
};

void check_request(const Request& r, bool with_size) {
  ARBITER_FUZZ_CHECK(r.world_size >= 1, "a request of no rank");
  ARBITER_FUZZ_CHECK(r.nodes >= 1 && r.nodes <= r.world_size, "nodes outside 1..world size");
  if (!with_size) return;
  ARBITER_FUZZ_CHECK(r.message_bytes >= 1 && r.message_bytes <= kMaxSizeBytes,
                     "a message size outside 1 B .. 1 TiB");
  if (r.tokens != 0) {
    const unsigned __int128 exact = static_cast<unsigned __int128>(r.tokens) * r.hidden *
                                    static_cast<unsigned>(element_size(r.dtype));
    ARBITER_FUZZ_CHECK(exact == r.message_bytes, "tokens x hidden x element size wrapped around");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size > 2048) return 0;
  Args args;
  std::string current;
  for (std::size_t i = 0; i <= size; ++i) {
    if (i == size || data[i] == '\n') {
      if (current.find("config") == std::string::npos) args.push_back(current);
      current.clear();
      if (args.size() > 32) break;
    } else {
      current.push_back(static_cast<char>(data[i]));
    }
  }
  if (args.empty()) return 0;
  const std::string command = args.front();
  args.erase(args.begin());

  Silence silence;
  try {
    if (command == "decide") {
      (void)cmd_decide(args);
    } else if (command == "sweep") {
      (void)cmd_sweep(args);
    } else if (command == "workspaces") {  // footprint's flags, without loading modules
      po::options_description desc("fuzz");
      add_request_options(desc, RequestKind::kWorkspaces);
      const po::variables_map vm = parse(args, desc);
      (void)read_request(vm, RequestKind::kWorkspaces);
      const std::uint32_t mask = read_pattern_set(vm);
      ARBITER_FUZZ_CHECK(mask != 0 && mask < (1u << kPatternCount), "a pattern set out of range");
    } else {
      const bool with_size = command != "nosize";
      const RequestKind kind = with_size ? RequestKind::kCall : RequestKind::kCallWithoutSize;
      po::options_description desc("fuzz");
      add_request_options(desc, kind);
      const po::variables_map vm = parse(args, desc);
      check_request(read_request(vm, kind), with_size);
      for (const std::string& a : args) {
        try {
          const std::uint64_t bytes = size_flag("bytes", a);
          ARBITER_FUZZ_CHECK(bytes >= 1 && bytes <= kMaxSizeBytes, "size_flag() out of range");
        } catch (const UsageError& e) {
          ARBITER_FUZZ_CHECK(!e.message.empty(), "a UsageError without a message");
        }
      }
    }
  } catch (const UsageError& e) {
    ARBITER_FUZZ_CHECK(!e.message.empty(), "a UsageError without a message");
  }
  return 0;
}
