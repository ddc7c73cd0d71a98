// One CUDA graph per rank stream: each virtual rank's calls captured on its
// own stream (relaxed mode: the ranks' streams are captured at once, and a
// module may query the device while capturing), instantiated, replayed
// together. Owns the graphs.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <string>
#include <vector>

namespace arbiter::test {

class RankGraphs {
 public:
  RankGraphs() = default;
  ~RankGraphs() { reset(); }
  RankGraphs(const RankGraphs&) = delete;
  RankGraphs& operator=(const RankGraphs&) = delete;

  // Begins capturing every stream, calls `enqueue` (only when every capture
  // began; it puts each rank's work on that rank's stream and returns false
  // when it failed, saying why itself), ends every capture that began, and
  // instantiates one graph per stream. Returns "" when every graph is ready,
  // otherwise the CUDA step that failed.
  std::string capture(const std::vector<cudaStream_t>& streams,
                      const std::function<bool()>& enqueue) {
    reset();
    streams_ = streams;
    graphs_.assign(streams.size(), nullptr);
    execs_.assign(streams.size(), nullptr);
    std::string error;
    std::size_t capturing = 0;
    for (; capturing < streams.size(); ++capturing) {
      const cudaError_t e =
          cudaStreamBeginCapture(streams[capturing], cudaStreamCaptureModeRelaxed);
      if (e != cudaSuccess) {
        error = "cudaStreamBeginCapture, rank " + std::to_string(capturing) + ": " +
                cudaGetErrorString(e);
        break;
      }
    }
    bool enqueued = false;
    if (error.empty()) enqueued = enqueue();
    for (std::size_t r = 0; r < capturing; ++r) {
      const cudaError_t e = cudaStreamEndCapture(streams[r], &graphs_[r]);
      if (e != cudaSuccess && error.empty()) {
        error = "cudaStreamEndCapture, rank " + std::to_string(r) + ": " + cudaGetErrorString(e);
      }
    }
    if (!error.empty() || !enqueued) {
      cudaGetLastError();
      return error;
    }
    for (std::size_t r = 0; r < streams.size(); ++r) {
      const cudaError_t e = cudaGraphInstantiate(&execs_[r], graphs_[r], 0);
      if (e != cudaSuccess) {
        cudaGetLastError();
        execs_[r] = nullptr;
        return "cudaGraphInstantiate, rank " + std::to_string(r) + ": " + cudaGetErrorString(e);
      }
    }
    ready_ = true;
    return "";
  }

  bool ready() const { return ready_; }

  // Launches every rank's graph on its stream.
  // REQUIRES: ready().
  cudaError_t launch() const {
    for (std::size_t r = 0; r < execs_.size(); ++r) {
      if (const cudaError_t e = cudaGraphLaunch(execs_[r], streams_[r]); e != cudaSuccess) return e;
    }
    return cudaSuccess;
  }

  void reset() {
    for (cudaGraphExec_t x : execs_) {
      if (x != nullptr) cudaGraphExecDestroy(x);
    }
    for (cudaGraph_t g : graphs_) {
      if (g != nullptr) cudaGraphDestroy(g);
    }
    execs_.clear();
    graphs_.clear();
    streams_.clear();
    ready_ = false;
  }

 private:
  std::vector<cudaStream_t> streams_;
  std::vector<cudaGraph_t> graphs_;
  std::vector<cudaGraphExec_t> execs_;
  bool ready_ = false;
};

}  // namespace arbiter::test
