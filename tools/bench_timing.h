// `arbiter bench`: where a rank's buffers live and how its calls are timed.
//
//   host (CPU ranks, bench_timing_host.cpp): host buffers; a trial is a
//        barrier, then the wall clock around `iterations` back-to-back calls.
//   CUDA (GPU ranks, bench_timing_cuda.cpp, built only with
//        ARBITER_BENCH_CUDA): device buffers on the GPU LOCAL_RANK; the
//        `iterations` calls are captured once into a CUDA graph, and a trial
//        is a barrier, then one graph launch between two CUDA events.
//
// Either way a trial's time / iterations is the latency per call on this
// rank; the caller all-gathers the trials and takes the slowest rank's.
//
// Thread-safety: one thread (the rank's) per runner.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "arbiter/bootstrap.h"
#include "arbiter/communicator.h"
#include "bench_check.h"
#include "bench_sweep.h"

namespace arbiter::cli::bench {

struct DeviceInfo {
  DeviceKind kind = DeviceKind::kCpu;
  Capability capability = Capability::cpu();
  int device = -1;     // CUDA ordinal (LOCAL_RANK); -1 for CPU ranks
  std::string name;    // "NVIDIA H200", or the CPU model
  std::string driver;  // "CUDA driver 12080, runtime 12080", or the OS for CPU ranks
};

struct Timing {
  int warmup = 0;  // untimed trials first
  int trials = 1;
  int iterations = 1;  // calls per trial
};

// One option timed at one point on this rank.
struct Timed {
  arbiter_status status = ARBITER_OK;
  std::string error;
  std::vector<double> per_call_us;  // one per timed trial
};

// `arbiter bench --registered`: one allocation holding the input, then each
// output (allreduce_out, residual_out, norm_out, quant_out, scale_out), each
// part at a multiple of `align`, so the offsets are the same on every rank.
struct RegisteredParts {
  std::size_t offsets[6] = {};
  std::size_t total = 0;  // at least `align`
};
inline RegisteredParts registered_parts(const std::size_t (&sizes)[6], std::size_t align) {
  RegisteredParts parts;
  for (std::size_t i = 0; i < 6; ++i) {
    parts.offsets[i] = parts.total;
    parts.total += (sizes[i] + align - 1) / align * align;
  }
  if (parts.total < align) parts.total = align;
  return parts;
}
// `buffers` with the input and every output moved into `base` (laid out as
// `parts` says); the other inputs stay where they are.
inline Buffers in_registered_parts(const Buffers& buffers, void* base,
                                   const RegisteredParts& parts) {
  auto* b = static_cast<std::byte*>(base);
  Buffers moved = buffers;
  moved.input = b;
  moved.allreduce_out = b + parts.offsets[1];
  moved.residual_out = b + parts.offsets[2];
  moved.norm_out = b + parts.offsets[3];
  moved.quant_out = b + parts.offsets[4];
  moved.scale_out = b + parts.offsets[5];
  return moved;
}

class Runner {
 public:
  virtual ~Runner() = default;
  virtual const DeviceInfo& info() const = 0;

  // Buffers for every point of `points` (one dtype), with this rank's sample
  // input, the shared residual and gamma, and the quantisation scale.
  // Replaces earlier buffers. Throws std::runtime_error when it cannot.
  virtual void prepare(const std::vector<Point>& points, int rank) = 0;
  virtual const Buffers& buffers() const = 0;

  // `arbiter bench --registered`: after prepare(), the same buffers (sized
  // for prepare()'s points) with the input (same values) and every output in
  // memory `comm` registers (Communicator::alloc_registered, collective:
  // every rank calls it). Returns "" when they are ready, else why not;
  // nothing is then allocated. Replaces earlier registered buffers.
  virtual std::string prepare_registered(Communicator& comm) = 0;
  // REQUIRES: prepare_registered() returned "".
  const Buffers& registered_buffers() const { return registered_buffers_; }
  // Frees them (local); call before `comm` ends.
  void release_registered(Communicator& comm) {
    if (registered_ != nullptr) (void)comm.free_registered(registered_);
    registered_ = nullptr;
    registered_buffers_ = Buffers{};
  }

  // Fills every output `point` writes in `buffers` (buffers() or
  // registered_buffers()) with 0xFF bytes (NaN in every dtype, and in e4m3),
  // so that an output a call does not write fails the check.
  virtual void poison(const Point& point, const Buffers& buffers) = 0;
  // One call, complete on return.
  virtual Communicator::Result call(Communicator& comm, const Option& option,
                                    const arbiter_allreduce_args& args) = 0;
  // The outputs of `point` in `buffers`, copied to the host.
  virtual Outputs read_outputs(const Point& point, const Buffers& buffers) = 0;

  // `timing.warmup` untimed trials, then `timing.trials` timed ones, each
  // after a barrier. Collective. REQUIRES: call() with the same option and
  // arguments succeeded on every rank.
  virtual Timed time(Communicator& comm, Bootstrap& boot, const Option& option,
                     const arbiter_allreduce_args& args, const Timing& timing,
                     std::chrono::milliseconds timeout) = 0;

 protected:
  // prepare_registered(): keeps `data` (from comm.alloc_registered, laid out
  // as `parts` says) and moves buffers() into it.
  void adopt_registered(void* data, const RegisteredParts& parts) {
    registered_ = data;
    registered_buffers_ = in_registered_parts(buffers(), data, parts);
  }

 private:
  void* registered_ = nullptr;  // the registered allocation, or nullptr
  Buffers registered_buffers_;
};

std::unique_ptr<Runner> make_host_runner();

#ifdef ARBITER_BENCH_CUDA
// The GPU `device` (LOCAL_RANK); nullptr with the reason in `why` when it
// cannot be used (no driver, no such device).
std::unique_ptr<Runner> make_cuda_runner(int device, std::string& why);
#endif

}  // namespace arbiter::cli::bench
