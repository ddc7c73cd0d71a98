// The sweep of arbiter-bench-fused: for each world size and hidden size, the
// fused modules' workspaces (one loopback group per backend) and every
// rank's buffers; for each token count, the unfused baseline (a plain sum
// kernel, then the nccl backend's residual + RMSNorm kernel) and a
// device-to-device copy, then each backend's one-shot and two-shot where its
// workspace takes the message, each checked against the baseline before it
// is timed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "arbiter_backend.h"
#include "bench_fused_options.h"
#include "bench_fused_points.h"
#include "bench_fused_report.h"
#include "bench_fused_timing.h"
#include "loopback_group.h"
#include "module.h"

namespace arbiter::bench {

class Bench {
 public:
  Bench(const Options& o, const Device& d, Report& report) : o_(o), device_(d), report_(report) {}

  // Loads and probes every --backend module; writes what it found as '#'
  // lines. A module that does not load or probe is a failure; the others
  // and the baseline still run.
  void load_modules();

  // The whole sweep; throws Failure on a CUDA error in the baseline or a
  // fused run (nothing after it is trustworthy).
  void run();

  int exit_code() const { return failures_.empty() ? 0 : 1; }
  bool stopped() const { return stopped_; }
  const std::vector<Point>& points() const { return points_; }
  const std::vector<std::string>& failures() const { return failures_; }

 private:
  struct Module {
    std::string name;
    std::unique_ptr<test::BackendModule> module;
    arbiter_backend_caps caps{};
    bool probed = false;
  };
  // One backend's workspaces for the current (ws, hidden).
  struct Group {
    const Module* module = nullptr;
    std::unique_ptr<test::LoopbackGroup> group;
    // Each rank's input copied into the module's registered memory (ABI
    // v2), or empty: the "<backend>-reg" rows read it in place.
    std::vector<void*> registered;
  };

  bool fused_supported(const Module& m, int ws, std::string* why) const;
  void fail(const std::string& text);
  void run_shape(int ws, std::uint32_t hidden);
  std::unique_ptr<test::LoopbackGroup> create_group(const Module& m, int ws, std::uint32_t hidden,
                                                    std::uint32_t max_tokens);
  void run_point(Timer& timer, std::vector<Group>& groups, int ws, std::uint32_t hidden,
                 std::uint32_t tokens);
  bool admits(const Group& g, arbiter_algorithm algorithm, const Point& p, std::string* why) const;
  void run_fused(Timer& timer, const Group& g, Point& p, arbiter_algorithm algorithm,
                 const std::string& where, bool registered);
  void register_inputs(Group& g, std::uint32_t hidden, std::uint32_t capacity);
  std::string compare(const Point& p, const std::string& what);

  const Options& o_;
  const Device& device_;
  Report& report_;
  std::vector<Module> modules_;
  Clock::time_point start_;
  bool stopped_ = false;
  ShapeBuffers buffers_;
  std::vector<Point> points_;
  std::vector<std::string> failures_;
  Watchdog watchdog_;
};

}  // namespace arbiter::bench
