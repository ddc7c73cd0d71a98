// For arbiter-bench-shm-mpi (bench_shm.cpp built with ARBITER_BENCH_MPI):
// `MPI_Allreduce` of the same bytes (fp32, MPI_SUM) timed in the same run
// as the shm methods, so that ratios to MPI come from one machine state.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "arbiter/bootstrap.h"

namespace arbiter_bench {

// Under `mpirun -np N`, gives the arbiter bootstrap its torchrun-style
// variables from Open MPI's (OMPI_COMM_WORLD_*), with a port rank 0 found
// free (arbiter::free_bootstrap_port) and broadcast over MPI; variables
// already set are kept (a run under `arbiter launch` needs none of this).
// Call after MPI_Init.
inline void rendezvous_from_mpi() {
  if (std::getenv("RANK") != nullptr) return;
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int port = 0;
  if (rank == 0) {
    try {
      port = arbiter::free_bootstrap_port();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "arbiter-bench-shm-mpi: %s\n", e.what());
      port = 0;  // every rank aborts below
    }
  }
  MPI_Bcast(&port, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (port == 0) {
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  setenv("RANK", std::to_string(rank).c_str(), 1);
  setenv("WORLD_SIZE", std::to_string(size).c_str(), 1);
  setenv("LOCAL_RANK", local != nullptr ? local : std::to_string(rank).c_str(), 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
}

// MPI_Allreduce over `bytes` / 4 floats, input and output apart (as the
// shm calls have them).
class MpiAllreduce {
 public:
  explicit MpiAllreduce(std::uint64_t max_bytes)
      : input_(max_bytes / sizeof(float), 1.0f), output_(max_bytes / sizeof(float)) {}
  bool operator()(std::uint64_t bytes) {
    return MPI_Allreduce(input_.data(), output_.data(), static_cast<int>(bytes / sizeof(float)),
                         MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD) == MPI_SUCCESS;
  }

 private:
  std::vector<float> input_, output_;
};

}  // namespace arbiter_bench
