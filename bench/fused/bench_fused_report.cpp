// CSV and summary of arbiter-bench-fused; see bench_fused_report.h.
#include "bench_fused_report.h"

#include <algorithm>
#include <cinttypes>
#include <ctime>
#include <optional>
#include <string>
#include <vector>

#ifndef ARBITER_VERSION
#define ARBITER_VERSION "unknown"
#endif

namespace arbiter::bench {
namespace {

std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\n") == std::string::npos) return text;
  std::string quoted = "\"";
  for (char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

std::string cell(std::optional<double> v) {
  char text[32];
  if (v) {
    std::snprintf(text, sizeof text, "%9.1f", *v);
  } else {
    std::snprintf(text, sizeof text, "%9s", "-");
  }
  return text;
}

const char* short_algorithm(const std::string& algorithm) {
  return algorithm == "oneshot" ? "1s" : "2s";
}

}  // namespace

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

std::string cuda_version(int v) {
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

void Report::provenance(const Options& o, const std::string& device_line) {
  std::fprintf(csv_, "# arbiter-bench-fused, arbiter %s\n", ARBITER_VERSION);
  std::fprintf(csv_, "# date: %s\n", utc_now().c_str());
  std::fprintf(csv_, "# command: %s\n", o.command_line.c_str());
  std::fprintf(csv_, "# %s\n", device_line.c_str());
  std::fprintf(csv_,
               "# loopback: ws virtual ranks on this one GPU, one stream each; bytes = "
               "tokens x hidden x 2 per rank; latency = one call on every rank, median of "
               "trials (us)\n");
  if (std::find(o.backends.begin(), o.backends.end(), "mnnvl") != o.backends.end()) {
    std::fprintf(csv_,
                 "# mnnvl in loopback has no multicast mapping: its kernels store to each peer "
                 "in turn (unicast), so its rows are not multicast (NVLink SHARP) figures\n");
  }
  std::fflush(csv_);
}

void Report::comment(const std::string& text) {
  std::fprintf(csv_, "# %s\n", text.c_str());
  std::fflush(csv_);
}

void Report::columns() {
  std::fprintf(csv_,
               "capability,world_size,nodes,dtype,hidden,num_tokens,bytes,pattern,backend,"
               "algorithm,fused,latency_us,p10_us,p90_us,trials,device,iterations,timing,"
               "check,buffers\n");
  std::fflush(csv_);
}

void Report::note(const std::string& text) {
  comment(text);
  std::fprintf(stderr, "  %s\n", text.c_str());
}

void Report::row(const Point& p, const std::string& backend, const std::string& algorithm,
                 bool fused, const Timing& t, const std::string& check, const char* buffers) {
  std::fprintf(
      csv_,
      "%u,%d,1,bf16,%u,%u,%" PRIu64 ",residual_rmsnorm,%s,%s,%d,%.3f,%.3f,%.3f,%zu,%s,%d,%s,%s,%s\n",
      device_.capability, p.ws, p.hidden, p.tokens, p.bytes, backend.c_str(), algorithm.c_str(),
      fused ? 1 : 0, percentile(t.per_call_us, 0.5), percentile(t.per_call_us, 0.1),
      percentile(t.per_call_us, 0.9), t.per_call_us.size(), csv_field(device_.name).c_str(),
      t.iterations, t.graphs ? "graph" : "launch", check.c_str(), buffers);
  std::fflush(csv_);
}

void Report::copy_reference(const Point& p, const Timing& t) {
  std::fprintf(csv_, "# copy,%d,%u,%u,%" PRIu64 ",memcpy d2d,%.3f,%.3f,%.3f\n", p.ws, p.hidden,
               p.tokens, p.bytes, percentile(t.per_call_us, 0.5), percentile(t.per_call_us, 0.1),
               percentile(t.per_call_us, 0.9));
  std::fflush(csv_);
}

void print_summary(const std::vector<Point>& points, const std::vector<std::string>& backends,
                   bool stopped, const std::vector<std::string>& failures) {
  double peak = 0;  // bytes/us of the best copy
  for (const Point& p : points) {
    if (const auto copy = p.median("copy"); copy && *copy > 0) {
      peak = std::max(peak, static_cast<double>(p.ws) * p.bytes / *copy);
    }
  }
  std::vector<std::string> options;  // option_key()s, in column order
  for (const std::string& b : backends) {
    for (const char* a : {"oneshot", "twoshot"}) options.push_back(option_key(b, a));
  }
  std::fprintf(stderr,
               "\nsummary (median us; 1s/2s = one-shot/two-shot; speedup = baseline / best fused; "
               "GB/s = ws x bytes / time; %%copy = copy time / fused time; %%peak = vs the "
               "fastest copy, %.0f GB/s)\n",
               peak / 1e3);
  std::fprintf(stderr, "%3s %6s %6s %10s", "ws", "hidden", "tokens", "bytes");
  for (const std::string& b : backends) {
    for (const char* a : {"oneshot", "twoshot"}) {
      std::fprintf(stderr, " %9s", (b + "/" + short_algorithm(a)).c_str());
    }
  }
  std::fprintf(stderr, " %9s %9s  %-9s %7s %8s %6s %6s\n", "baseline", "copy", "best", "speedup",
               "GB/s", "%copy", "%peak");
  for (const Point& p : points) {
    std::optional<double> best;
    std::string best_name = "-";
    std::fprintf(stderr, "%3d %6u %6u %10s", p.ws, p.hidden, p.tokens,
                 format_bytes(p.bytes).c_str());
    for (const std::string& key : options) {
      const std::optional<double> v = p.median(key);
      std::fprintf(stderr, " %s", cell(v).c_str());
      if (v && (!best || *v < *best)) {
        best = v;
        const std::size_t space = key.find(' ');
        best_name = key.substr(0, space) + "/" + short_algorithm(key.substr(space + 1));
      }
    }
    const auto base = p.median("baseline");
    const auto copy = p.median("copy");
    std::fprintf(stderr, " %s %s  %-9s", cell(base).c_str(), cell(copy).c_str(), best_name.c_str());
    if (best && base && copy) {
      const double moved = static_cast<double>(p.ws) * p.bytes;
      std::fprintf(stderr, " %6.2fx %8.1f %5.0f%% %5.0f%%\n", *base / *best, moved / *best / 1e3,
                   100.0 * *copy / *best, peak > 0 ? 100.0 * moved / *best / peak : 0.0);
    } else {
      std::fprintf(stderr, " %7s %8s %6s %6s\n", "-", "-", "-", "-");
    }
  }
  if (stopped) std::fprintf(stderr, "(stopped early: --budget reached)\n");
  for (const std::string& f : failures) std::fprintf(stderr, "FAILED: %s\n", f.c_str());
}

}  // namespace arbiter::bench
