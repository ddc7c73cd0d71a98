// The host runner: CPU ranks, host buffers, wall-clock trials.
#include <sys/utsname.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <iterator>

#include "bench_timing.h"

namespace arbiter::cli::bench {
namespace {

using Clock = std::chrono::steady_clock;

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const std::size_t colon = line.find(':');
    if (colon == std::string::npos) break;
    std::string name = line.substr(colon + 1);
    while (!name.empty() && name.front() == ' ') name.erase(name.begin());
    return name;
  }
  return "unknown CPU";
}

std::string os_text() {
  utsname u{};
  if (::uname(&u) != 0) return "unknown OS";
  return std::string(u.sysname) + " " + u.release;
}

// Host memory aligned to 64 bytes (modules need at least element alignment).
class Block {
 public:
  void resize(std::size_t bytes) { storage_.assign((bytes + 63) / 64 + 1, Line{}); }
  void* data() { return storage_.empty() ? nullptr : storage_.data(); }

 private:
  struct alignas(64) Line {
    unsigned char bytes[64];
  };
  std::vector<Line> storage_;
};

class HostRunner final : public Runner {
 public:
  HostRunner() {
    info_.kind = DeviceKind::kCpu;
    info_.capability = Capability::cpu();
    info_.device = -1;
    info_.name = cpu_model();
    info_.driver = "none (CPU ranks; " + os_text() + ")";
  }

  const DeviceInfo& info() const override { return info_; }

  void prepare(const std::vector<Point>& points, int rank) override {
    std::size_t elements = 0;
    std::uint32_t hidden = 0;
    for (const Point& p : points) {
      elements = std::max(elements, std::size_t{p.tokens} * p.hidden);
      hidden = std::max(hidden, p.hidden);
    }
    const Dtype dtype = points.empty() ? Dtype::kBf16 : points.front().dtype;
    const std::size_t elt = static_cast<std::size_t>(element_size(dtype));
    const OutputSizes out = largest_outputs(points);
    input_bytes_ = elements * elt;
    output_bytes_ = out;
    input_.resize(input_bytes_);
    residual_.resize(elements * elt);
    gamma_.resize(std::size_t{hidden} * elt);
    fill_sample(input_.data(), elements, dtype, static_cast<std::uint32_t>(rank));
    fill_sample(residual_.data(), elements, dtype, kResidualStream);
    fill_sample(gamma_.data(), hidden, dtype, kGammaStream);
    allreduce_out_.resize(out.allreduce_out);
    residual_out_.resize(out.residual_out);
    norm_out_.resize(out.norm_out);
    quant_out_.resize(out.quant_out);
    scale_out_.resize(out.scale_out);
    buffers_ = Buffers{input_.data(),    residual_.data(),      gamma_.data(),
                       &scale_,          allreduce_out_.data(), residual_out_.data(),
                       norm_out_.data(), quant_out_.data(),     scale_out_.data()};
  }

  const Buffers& buffers() const override { return buffers_; }

  // One allocation: the input, then each output, each part on its own page
  // (the same offsets on every rank, as a registered call needs).
  std::string prepare_registered(Communicator& comm) override {
    release_registered(comm);
    const OutputSizes& out = output_bytes_;
    const std::size_t sizes[] = {input_bytes_, out.allreduce_out, out.residual_out,
                                 out.norm_out, out.quant_out,     out.scale_out};
    const RegisteredParts parts = registered_parts(sizes, 4096);  // a page each
    void* data = nullptr;
    const Communicator::Result r = comm.alloc_registered(parts.total, &data);
    if (r.status != ARBITER_OK) return r.error;
    std::memcpy(data, input_.data(), sizes[0]);
    adopt_registered(data, parts);
    return "";
  }

  void poison(const Point& point, const Buffers& b) override {
    const OutputSizes s = output_sizes(point);
    std::memset(b.allreduce_out, 0xFF, s.allreduce_out);
    std::memset(b.residual_out, 0xFF, s.residual_out);
    std::memset(b.norm_out, 0xFF, s.norm_out);
    std::memset(b.quant_out, 0xFF, s.quant_out);
    std::memset(b.scale_out, 0xFF, s.scale_out);
  }

  Communicator::Result call(Communicator& comm, const Option& option,
                            const arbiter_allreduce_args& args) override {
    return comm.run_on(option.backend, option.algorithm, args, nullptr);
  }

  Outputs read_outputs(const Point& point, const Buffers& b) override {
    const OutputSizes s = output_sizes(point);
    auto copy = [](void* from, std::size_t bytes) {
      const auto* p = static_cast<const std::uint8_t*>(from);
      return std::vector<std::uint8_t>(p, p + bytes);
    };
    return {copy(b.allreduce_out, s.allreduce_out), copy(b.residual_out, s.residual_out),
            copy(b.norm_out, s.norm_out), copy(b.quant_out, s.quant_out),
            copy(b.scale_out, s.scale_out)};
  }

  Timed time(Communicator& comm, Bootstrap& boot, const Option& option,
             const arbiter_allreduce_args& args, const Timing& timing,
             std::chrono::milliseconds timeout) override {
    Timed timed;
    for (int trial = 0; trial < timing.warmup + timing.trials; ++trial) {
      // Every rank starts the trial together: the slowest rank's time is
      // then the collective's.
      if (const BootstrapStatus b = boot.barrier(timeout); !b.ok()) {
        timed.status = b.code;
        timed.error = "barrier before a trial: " + b.message;
        return timed;
      }
      const Clock::time_point start = Clock::now();
      for (int i = 0; i < timing.iterations; ++i) {
        const Communicator::Result r = comm.run_on(option.backend, option.algorithm, args, nullptr);
        if (r.status != ARBITER_OK) {
          timed.status = r.status;
          timed.error = r.error;
          return timed;
        }
      }
      const double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
      if (trial >= timing.warmup) timed.per_call_us.push_back(us / timing.iterations);
    }
    return timed;
  }

 private:
  DeviceInfo info_;
  Block input_, residual_, gamma_, allreduce_out_, residual_out_, norm_out_, quant_out_, scale_out_;
  float scale_ = kQuantScale;
  Buffers buffers_;
  std::size_t input_bytes_ = 0;  // prepare()'s sizes, for prepare_registered()
  OutputSizes output_bytes_;
};

}  // namespace

std::unique_ptr<Runner> make_host_runner() { return std::make_unique<HostRunner>(); }

}  // namespace arbiter::cli::bench
