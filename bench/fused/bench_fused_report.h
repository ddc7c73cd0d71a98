// What arbiter-bench-fused writes: the CSV (provenance and notes as '#'
// lines, one row per measurement, readable by `arbiter tune`) and the
// summary table on stderr. bench/FUSED.md describes both.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_fused_options.h"
#include "bench_fused_points.h"
#include "bench_fused_timing.h"

namespace arbiter::bench {

struct Device {
  int ordinal = 0;
  std::string name;
  std::uint32_t capability = 0;
  int sm_count = 0;
};

// The CSV stream (stdout or --csv) and the progress notes on stderr.
class Report {
 public:
  Report(std::FILE* csv, const Device& device) : csv_(csv), device_(device) {}

  // "# ..." lines before the column names: benchmark and arbiter version,
  // date, command line, device, what loopback means for each backend.
  void provenance(const Options& o, const std::string& device_line);
  // A "# ..." line of its own (flushed).
  void comment(const std::string& text);
  // The column names.
  void columns();
  // A "# ..." line in the CSV and the same text on stderr.
  void note(const std::string& text);
  // One measurement row.
  // `buffers`: "copied", or "registered" (the input read in place from the
  // module's registered memory).
  void row(const Point& p, const std::string& backend, const std::string& algorithm, bool fused,
           const Timing& t, const std::string& check, const char* buffers = "copied");
  // The copy reference: a comment line that `arbiter tune` skips, "# copy,
  // ws,hidden,tokens,bytes,memcpy d2d,median_us,p10_us,p90_us".
  void copy_reference(const Point& p, const Timing& t);

 private:
  std::FILE* csv_;
  const Device& device_;
};

// Per point: each option's median, the best fused option (over every
// backend and algorithm), its speed-up over the baseline, and the share of
// copy bandwidth it reaches. "Bytes moved" is the group's message, ws x
// bytes, counted alike for the fused call, the baseline and the copy (ws
// concurrent cudaMemcpyAsync of `bytes` each), so "%copy" = copy time /
// fused time at the same size, and "%peak" compares with the fastest copy
// of the whole run. Then the failures.
void print_summary(const std::vector<Point>& points, const std::vector<std::string>& backends,
                   bool stopped, const std::vector<std::string>& failures);

// "YYYY-MM-DDTHH:MM:SSZ".
std::string utc_now();

// 12080 -> "12.8".
std::string cuda_version(int v);

}  // namespace arbiter::bench
