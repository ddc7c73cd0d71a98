// The CUDA runner: GPU ranks, device buffers, CUDA-graph trials timed with
// events. Built only with ARBITER_BENCH_CUDA (CMake: ARBITER_CUDA_ENABLED),
// linked with the static CUDA runtime; it calls no driver API, so the
// program still starts (and benches CPU ranks) on a machine without one.
//
// Per (point, option): the `iterations` calls are captured once into a
// graph (thread-local capture mode: the modules' run() enqueues only,
// allocates nothing), every rank agrees that its capture succeeded before
// any rank launches (a rank launching alone would wait on its peers), then
// each trial is a barrier, an event, one graph launch, an event.
#include <cuda_runtime_api.h>

#include <cstring>
#include <stdexcept>

#include "bench_timing.h"

namespace arbiter::cli::bench {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(e) + " (" +
                             cudaGetErrorString(e) + ")");
  }
}

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { release(); }

  // 256-byte aligned (cudaMalloc), at least one byte.
  void resize(std::size_t bytes, const char* what) {
    release();
    check(cudaMalloc(&pointer_, bytes == 0 ? 1 : bytes), what);
    bytes_ = bytes;
  }
  void* data() const { return pointer_; }
  std::size_t size() const { return bytes_; }

 private:
  void release() {
    if (pointer_) cudaFree(pointer_);
    pointer_ = nullptr;
    bytes_ = 0;
  }
  void* pointer_ = nullptr;
  std::size_t bytes_ = 0;
};

class CudaRunner final : public Runner {
 public:
  CudaRunner(int device, const cudaDeviceProp& prop) {
    info_.kind = DeviceKind::kGpu;
    info_.capability = Capability::sm(static_cast<std::uint16_t>(prop.major * 10 + prop.minor));
    info_.device = device;
    info_.name = prop.name;
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    info_.driver = "CUDA driver " + std::to_string(driver) + ", runtime " + std::to_string(runtime);
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaEventCreate(&start_), "cudaEventCreate");
    check(cudaEventCreate(&stop_), "cudaEventCreate");
  }
  ~CudaRunner() override {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
    cudaStreamDestroy(stream_);
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
    input_.resize(elements * elt, "cudaMalloc input");
    residual_.resize(elements * elt, "cudaMalloc residual_in");
    gamma_.resize(std::size_t{hidden} * elt, "cudaMalloc gamma");
    scale_.resize(sizeof(float), "cudaMalloc scale");
    allreduce_out_.resize(out.allreduce_out, "cudaMalloc allreduce_out");
    residual_out_.resize(out.residual_out, "cudaMalloc residual_out");
    norm_out_.resize(out.norm_out, "cudaMalloc norm_out");
    quant_out_.resize(out.quant_out, "cudaMalloc quant_out");
    scale_out_.resize(out.scale_out, "cudaMalloc scale_out");
    std::vector<std::uint8_t> host(elements * elt);
    fill_sample(host.data(), elements, dtype, static_cast<std::uint32_t>(rank));
    check(cudaMemcpy(input_.data(), host.data(), host.size(), cudaMemcpyHostToDevice), "input");
    fill_sample(host.data(), elements, dtype, kResidualStream);
    check(cudaMemcpy(residual_.data(), host.data(), host.size(), cudaMemcpyHostToDevice),
          "residual_in");
    fill_sample(host.data(), hidden, dtype, kGammaStream);
    check(cudaMemcpy(gamma_.data(), host.data(), std::size_t{hidden} * elt, cudaMemcpyHostToDevice),
          "gamma");
    const float scale = kQuantScale;
    check(cudaMemcpy(scale_.data(), &scale, sizeof scale, cudaMemcpyHostToDevice), "scale");
    buffers_ = Buffers{input_.data(),         residual_.data(),
                       gamma_.data(),         static_cast<const float*>(scale_.data()),
                       allreduce_out_.data(), residual_out_.data(),
                       norm_out_.data(),      quant_out_.data(),
                       scale_out_.data()};
  }

  const Buffers& buffers() const override { return buffers_; }

  // Device memory the communicator's GPU module registers (trtllm): the
  // input (same values) and every output, in one allocation.
  std::string prepare_registered(Communicator& comm) override {
    release_registered(comm);
    const std::size_t sizes[] = {input_.size(),    allreduce_out_.size(), residual_out_.size(),
                                 norm_out_.size(), quant_out_.size(),     scale_out_.size()};
    const RegisteredParts parts = registered_parts(sizes, 256);  // cudaMalloc's alignment
    void* data = nullptr;
    const Communicator::Result r = comm.alloc_registered(parts.total, &data);
    if (r.status != ARBITER_OK) return r.error;
    adopt_registered(data, parts);  // freed by release_registered() should the copy throw
    check(cudaMemcpy(data, input_.data(), sizes[0], cudaMemcpyDeviceToDevice),
          "copying the input into registered memory");
    // A device-to-device cudaMemcpy may return before it lands, on a stream
    // the runner's non-blocking stream does not wait for.
    check(cudaDeviceSynchronize(), "copying the input into registered memory");
    return "";
  }

  void poison(const Point& point, const Buffers& b) override {
    const OutputSizes s = output_sizes(point);
    const std::pair<void*, std::size_t> outputs[] = {{b.allreduce_out, s.allreduce_out},
                                                     {b.residual_out, s.residual_out},
                                                     {b.norm_out, s.norm_out},
                                                     {b.quant_out, s.quant_out},
                                                     {b.scale_out, s.scale_out}};
    for (const auto& [pointer, bytes] : outputs) {
      if (bytes) check(cudaMemsetAsync(pointer, 0xFF, bytes, stream_), "cudaMemsetAsync");
    }
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

  Communicator::Result call(Communicator& comm, const Option& option,
                            const arbiter_allreduce_args& args) override {
    Communicator::Result r = comm.run_on(option.backend, option.algorithm, args, stream_);
    if (r.status != ARBITER_OK) return r;
    if (const cudaError_t e = cudaStreamSynchronize(stream_); e != cudaSuccess) {
      r.status = ARBITER_INTERNAL;
      r.error = std::string("the call failed on the GPU: ") + cudaGetErrorName(e) + " (" +
                cudaGetErrorString(e) + ")";
    }
    return r;
  }

  Outputs read_outputs(const Point& point, const Buffers& b) override {
    const OutputSizes s = output_sizes(point);
    auto copy = [](const void* from, std::size_t bytes) {
      std::vector<std::uint8_t> v(bytes);
      if (bytes) check(cudaMemcpy(v.data(), from, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
      return v;
    };
    return {copy(b.allreduce_out, s.allreduce_out), copy(b.residual_out, s.residual_out),
            copy(b.norm_out, s.norm_out), copy(b.quant_out, s.quant_out),
            copy(b.scale_out, s.scale_out)};
  }

  Timed time(Communicator& comm, Bootstrap& boot, const Option& option,
             const arbiter_allreduce_args& args, const Timing& timing,
             std::chrono::milliseconds timeout) override {
    Timed timed;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    capture(comm, option, args, timing.iterations, graph, exec, timed);
    // Launch only when every rank holds a graph.
    std::int32_t mine = timed.status;
    std::vector<std::int32_t> all(static_cast<std::size_t>(boot.world_size()));
    if (const BootstrapStatus b = boot.allgather(&mine, all.data(), sizeof mine, timeout);
        !b.ok()) {
      timed.status = b.code;
      timed.error = "agreeing on the captured graphs: " + b.message;
    } else if (timed.status == ARBITER_OK) {
      for (std::size_t r = 0; r < all.size(); ++r) {
        if (all[r] != ARBITER_OK) {
          timed.status = static_cast<arbiter_status>(all[r]);
          timed.error = "rank " + std::to_string(r) + " could not capture its CUDA graph";
          break;
        }
      }
    }
    for (int trial = 0; timed.status == ARBITER_OK && trial < timing.warmup + timing.trials;
         ++trial) {
      if (const BootstrapStatus b = boot.barrier(timeout); !b.ok()) {
        timed.status = b.code;
        timed.error = "barrier before a trial: " + b.message;
        break;
      }
      cudaError_t e = cudaEventRecord(start_, stream_);
      if (e == cudaSuccess) e = cudaGraphLaunch(exec, stream_);
      if (e == cudaSuccess) e = cudaEventRecord(stop_, stream_);
      if (e == cudaSuccess) e = cudaEventSynchronize(stop_);
      float ms = 0;
      if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, start_, stop_);
      if (e != cudaSuccess) {
        timed.status = ARBITER_INTERNAL;
        timed.error = std::string("a trial failed on the GPU: ") + cudaGetErrorName(e) + " (" +
                      cudaGetErrorString(e) + ")";
        break;
      }
      if (trial >= timing.warmup) timed.per_call_us.push_back(ms * 1000.0 / timing.iterations);
    }
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    return timed;
  }

 private:
  // Captures `iterations` calls into `graph` and instantiates `exec`; on
  // failure both stay null (or are destroyed by the caller) and `timed`
  // says why. The stream always leaves capture mode.
  void capture(Communicator& comm, const Option& option, const arbiter_allreduce_args& args,
               int iterations, cudaGraph_t& graph, cudaGraphExec_t& exec, Timed& timed) {
    cudaError_t e = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
      timed.status = ARBITER_INTERNAL;
      timed.error = std::string("cudaStreamBeginCapture: ") + cudaGetErrorString(e);
      return;
    }
    for (int i = 0; i < iterations; ++i) {
      const Communicator::Result r = comm.run_on(option.backend, option.algorithm, args, stream_);
      if (r.status != ARBITER_OK) {
        timed.status = r.status;
        timed.error = "while capturing a CUDA graph: " + r.error;
        break;
      }
    }
    e = cudaStreamEndCapture(stream_, &graph);
    if (timed.status == ARBITER_OK && e != cudaSuccess) {
      timed.status = ARBITER_INTERNAL;
      timed.error = std::string("cudaStreamEndCapture: ") + cudaGetErrorString(e) +
                    " (a module's run() is not capturable)";
    }
    if (timed.status == ARBITER_OK) {
      e = cudaGraphInstantiate(&exec, graph, 0);
      if (e != cudaSuccess) {
        exec = nullptr;
        timed.status = ARBITER_INTERNAL;
        timed.error = std::string("cudaGraphInstantiate: ") + cudaGetErrorString(e);
      }
    }
    if (timed.status != ARBITER_OK) cudaGetLastError();  // clear a non-sticky error
  }

  DeviceInfo info_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  DeviceBuffer input_, residual_, gamma_, scale_, allreduce_out_, residual_out_, norm_out_,
      quant_out_, scale_out_;
  Buffers buffers_;
};

}  // namespace

std::unique_ptr<Runner> make_cuda_runner(int device, std::string& why) {
  int count = 0;
  // Without a driver this is cudaErrorInsufficientDriver and `count` is left
  // alone: no device.
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    why = std::string("no usable CUDA device: ") + cudaGetErrorString(e);
    return nullptr;
  }
  if (device < 0) {
    why = "LOCAL_RANK is not set (a GPU rank's device; torchrun and `arbiter launch` set it)";
    return nullptr;
  }
  if (device >= count) {
    why = "LOCAL_RANK " + std::to_string(device) + " names no GPU (this host has " +
          std::to_string(count) + ")";
    return nullptr;
  }
  try {
    check(cudaSetDevice(device), "cudaSetDevice");
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    return std::make_unique<CudaRunner>(device, prop);
  } catch (const std::exception& error) {
    why = error.what();
    return nullptr;
  }
}

}  // namespace arbiter::cli::bench
