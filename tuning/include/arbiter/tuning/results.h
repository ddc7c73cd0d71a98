// Benchmark results: the CSV that `arbiter bench` (or any other tool, or a
// person) writes, read strictly.
//
// Format: a header line naming at least the columns of kRequiredColumns, in
// any order (extra columns are allowed and ignored), then one row per
// measurement. Fields may be quoted ("a, b" with "" for a quote). Blank lines
// are ignored. Lines whose first non-blank character is '#' are comments;
// `# key: value` comments are provenance (device, driver, nccl, hosts,
// arbiter_version, date, ...).
//
// A row is a measurement unless it says it was skipped: a `skipped` column
// holding anything but empty, 0, false or no; a `status` column holding
// anything but empty or ok; or an empty latency_us. Skipped rows are checked
// only for their number of fields and are reported as notes.
//
// Every other row must hold, in its columns:
//   capability   as in the tables: 90, 103, "10.3", sm_100, cpu
//   world_size   integer >= 2;  nodes: integer 1..world_size
//   dtype        fp16 | bf16 | fp32
//   hidden, num_tokens  positive integers
//   bytes        per-rank message bytes, an integer in 1 .. 1 TiB, equal to
//                num_tokens x hidden x element size
//   pattern      allreduce | residual_rmsnorm | residual_rmsnorm_fp8 |
//                residual_rmsnorm_fp4
//   backend      fused rows: a backend the tables can choose (trtllm, mnnvl,
//                nccl, shm); unfused rows: any name (nccl, "baseline", ...)
//   algorithm    fused rows: oneshot | twoshot | native; unfused: any text
//   fused        1 | 0 | true | false
//   latency_us   a finite number > 0
//   device       optional column; when absent or empty the file's
//                `# device:` provenance applies
//   residual     optional column: replicated (every rank passed the same
//                residual_in, ARBITER_RUN_RESIDUAL_REPLICATED) | distinct;
//                absent or empty means distinct for the residual patterns.
//                Empty (or absent) for pattern allreduce, which has none
//   buffers      optional column: registered (the call's input and outputs
//                lay in registered memory, `arbiter bench --registered`) |
//                copied; absent or empty means copied
// Names are case-sensitive, as in the tables. Errors name the file, the line
// and the column: `results.csv:14: error: column latency_us: "abc" is not a
// number`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "arbiter/diagnostic.h"
#include "arbiter/types.h"

namespace arbiter::tuning {

inline constexpr std::string_view kRequiredColumns[] = {
    "capability", "world_size", "nodes",   "dtype",     "hidden", "num_tokens",
    "bytes",      "pattern",    "backend", "algorithm", "fused",  "latency_us"};

// One measurement.
struct Row {
  std::string file;        // as given to read_results()
  std::uint32_t line = 0;  // 1-based
  Capability capability;
  std::uint32_t world_size = 0;
  std::uint32_t nodes = 1;
  Dtype dtype = Dtype::kBf16;
  std::uint32_t hidden = 0;
  std::uint32_t num_tokens = 0;
  std::uint64_t bytes = 0;
  Pattern pattern = Pattern::kAllreduce;
  std::string backend;
  std::string algorithm;
  bool fused = false;
  double latency_us = 0;
  std::string device;  // empty: unknown
  // The residual as the tables key it (Request::residual()): nullopt for
  // pattern allreduce, else replicated or distinct.
  std::optional<Residual> residual;
  // The call's buffers lay in registered memory (the buffers column).
  bool registered = false;

  std::string where() const { return file + ":" + std::to_string(line); }
};

struct ResultsFile {
  std::string path;
  // `# key: value` comments, in file order; keys lower-cased and trimmed.
  std::vector<std::pair<std::string, std::string>> provenance;
  std::vector<Row> rows;
  // "results.csv:9: note: row skipped: no multicast on this node"
  std::vector<std::string> notes;

  // The value of the first `# key:` comment, or empty.
  std::string provenance_value(std::string_view key) const;
};

struct ReadResult {
  std::optional<ResultsFile> file;      // empty when any error was found
  std::vector<Diagnostic> diagnostics;  // errors, in line order
  bool unreadable = false;              // the file could not be read at all
};

// Parses CSV text; `name` is used as the file name in rows and messages.
ReadResult parse_results(const std::string& name, std::string_view text);

// Reads and parses a file. A file that cannot be read is one error with
// line 0, and `unreadable`.
ReadResult read_results(const std::string& path);

// Every file, read in order; every problem is reported.
struct ResultsSet {
  std::vector<ResultsFile> files;  // those read without error
  std::vector<Diagnostic> errors;
  std::vector<std::string> notes;  // skipped rows, from every file
  bool unreadable = false;         // some file could not be read, or was given twice
};
ResultsSet read_all_results(const std::vector<std::string>& paths);

}  // namespace arbiter::tuning
