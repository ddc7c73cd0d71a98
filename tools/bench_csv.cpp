#include "bench_csv.h"

#include <cstdio>

namespace arbiter::cli::bench {
namespace {

std::string one_line(std::string text) {
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return text;
}

std::string number(double v) {
  char text[32];
  if (v >= 0.001) {
    std::snprintf(text, sizeof text, "%.3f", v);
  } else {
    std::snprintf(text, sizeof text, "%.6g", v);  // never "0.000"
  }
  return text;
}

const char* status_name(Row::Status s) {
  switch (s) {
    case Row::Status::kOk:
      return "ok";
    case Row::Status::kSkipped:
      return "skipped";
    case Row::Status::kError:
      return "error";
  }
  return "error";
}

}  // namespace

std::string csv_field(std::string_view text) {
  const bool quote = text.find_first_of(",\"\n\r") != std::string_view::npos ||
                     (!text.empty() && (text.front() == ' ' || text.back() == ' ' ||
                                        text.front() == '\t' || text.back() == '\t'));
  if (!quote) return std::string(text);
  std::string out = "\"";
  for (char c : text) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

void CsvWriter::provenance(const std::vector<std::pair<std::string, std::string>>& entries) {
  for (const auto& [key, value] : entries) out_ << "# " << key << ": " << one_line(value) << "\n";
  out_.flush();
}

void CsvWriter::header() {
  out_ << "capability,world_size,nodes,dtype,hidden,num_tokens,bytes,pattern,residual,backend,"
          "algorithm,fused,buffers,latency_us,p10_us,p90_us,trials,iterations,device,status,"
          "skipped,reason\n";
  out_.flush();
}

void CsvWriter::row(const RunContext& c, const Row& r) {
  const bool ok = r.status == Row::Status::kOk;
  const Point& p = r.point;
  out_ << capability_name(c.capability) << ',' << c.world_size << ',' << c.nodes << ','
       << dtype_name(p.dtype) << ',' << p.hidden << ',' << p.tokens << ',' << p.bytes << ','
       << pattern_name(p.pattern) << ','
       << (p.residual() ? residual_name(*p.residual()) : std::string_view()) << ','
       << backend_name(r.option.backend) << ',' << algorithm_name(r.option.algorithm) << ','
       << (r.option.fused ? 1 : 0) << ','
       << buffer_kind_name(r.option.registered ? BufferKind::kRegistered : BufferKind::kCopied)
       << ',' << (ok ? number(r.latency_us) : "") << ',' << (ok ? number(r.p10_us) : "") << ','
       << (ok ? number(r.p90_us) : "") << ',' << (ok ? std::to_string(r.trials) : "") << ','
       << (ok ? std::to_string(r.iterations) : "") << ',' << csv_field(c.device) << ','
       << status_name(r.status) << ',' << (r.status == Row::Status::kSkipped ? 1 : 0) << ','
       << csv_field(one_line(r.reason)) << "\n";
  out_.flush();
}

void CsvWriter::comment(const std::string& text) {
  out_ << "# " << one_line(text) << "\n";
  out_.flush();
}

}  // namespace arbiter::cli::bench
