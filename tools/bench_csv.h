// `arbiter bench`: the results CSV, as `arbiter tune` and `arbiter plot`
// read it (tuning/include/arbiter/tuning/results.h is the authority).
//
// `# key: value` provenance lines, then the header, then one row per
// (point, option), written as measured:
//   capability,world_size,nodes,dtype,hidden,num_tokens,bytes,pattern,
//   residual,backend,algorithm,fused,buffers,latency_us,p10_us,p90_us,
//   trials,iterations,device,status,skipped,reason
// residual is replicated (--residual-replicated: the calls carried
// ARBITER_RUN_RESIDUAL_REPLICATED) or distinct, empty for allreduce;
// buffers is registered (--registered: the call's input and outputs lay in
// registered memory) or copied;
// latency_us is the median over trials of the slowest rank's time per call,
// p10_us/p90_us the 10th/90th percentiles of the same; status is ok,
// skipped (the option cannot take this point: skipped = 1 and the reason)
// or error (a failure or a wrong result: the reason; no latency). Skipped
// and error rows carry no latency, so tune and plot pass over them.
#pragma once

#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "bench_sweep.h"

namespace arbiter::cli::bench {

// What every row of a run shares.
struct RunContext {
  Capability capability;
  int world_size = 0;
  std::uint32_t nodes = 1;
  std::string device;  // the device name (rank 0's)
};

struct Row {
  enum class Status { kOk, kSkipped, kError };
  Point point;
  Option option;
  Status status = Status::kOk;
  std::string reason;  // skipped and error rows
  double latency_us = 0, p10_us = 0, p90_us = 0;
  int trials = 0, iterations = 0;
};

// `text` as one CSV field: quoted (with "" for a quote) when it holds a
// comma, a quote, a newline or leading/trailing blanks.
std::string csv_field(std::string_view text);

class CsvWriter {
 public:
  explicit CsvWriter(std::ostream& out) : out_(out) {}
  // `# key: value` lines (newlines in a value become spaces).
  void provenance(const std::vector<std::pair<std::string, std::string>>& entries);
  void header();
  void row(const RunContext& context, const Row& row);
  void comment(const std::string& text);  // "# text"

 private:
  std::ostream& out_;
};

}  // namespace arbiter::cli::bench
