#include "arbiter/tuning/results.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "arbiter/size.h"

namespace arbiter::tuning {
namespace {

// A file with more errors than this is not worth reading further.
constexpr std::size_t kMaxErrors = 25;

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// One CSV record: its fields and the line it starts on.
struct Record {
  std::uint32_t line = 0;
  std::vector<std::string> fields;
};

class Reader {
 public:
  Reader(const std::string& name, std::string_view text) : name_(name), text_(text) {}

  // The next record, skipping blank and comment lines (`# key: value`
  // comments go to `provenance`). False at the end of the text. A malformed
  // record is reported and returned with no fields.
  bool next(Record& record, std::vector<std::pair<std::string, std::string>>& provenance,
            std::vector<Diagnostic>& errors) {
    while (pos_ < text_.size()) {
      const std::size_t end = line_end(pos_);
      const std::string_view line = trim(text_.substr(pos_, end - pos_));
      if (line.empty()) {
        advance_line(end);
        continue;
      }
      if (line.front() == '#') {
        comment(line.substr(1), provenance);
        advance_line(end);
        continue;
      }
      return read_record(record, errors);
    }
    return false;
  }

 private:
  std::size_t line_end(std::size_t from) const {
    const std::size_t nl = text_.find('\n', from);
    return nl == std::string_view::npos ? text_.size() : nl;
  }
  void advance_line(std::size_t end) {
    pos_ = end + 1;
    ++line_;
  }

  static void comment(std::string_view text,
                      std::vector<std::pair<std::string, std::string>>& provenance) {
    text = trim(text);
    const std::size_t colon = text.find(':');
    if (colon == std::string_view::npos || colon == 0 || colon > 40) return;
    const std::string key = lower(trim(text.substr(0, colon)));
    if (key.empty() || !std::isalpha(static_cast<unsigned char>(key.front()))) return;
    for (char c : key) {
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != ' ' && c != '-' &&
          c != '.') {
        return;
      }
    }
    provenance.emplace_back(key, std::string(trim(text.substr(colon + 1))));
  }

  bool read_record(Record& record, std::vector<Diagnostic>& errors) {
    record.line = line_;
    record.fields.clear();
    for (;;) {
      std::string field;
      while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t')) ++pos_;
      if (pos_ < text_.size() && text_[pos_] == '"') {
        ++pos_;
        bool closed = false;
        while (pos_ < text_.size()) {
          const char c = text_[pos_++];
          if (c == '"') {
            if (pos_ < text_.size() && text_[pos_] == '"') {
              field += '"';
              ++pos_;
              continue;
            }
            closed = true;
            break;
          }
          if (c == '\n') ++line_;
          field += c;
        }
        if (!closed) {
          errors.push_back({Severity::kError, name_, record.line, 0,
                            "a quoted field is not closed before the end of the file", ""});
          pos_ = text_.size();
          return false;
        }
        while (pos_ < text_.size() &&
               (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\r')) {
          ++pos_;
        }
        if (pos_ < text_.size() && text_[pos_] != ',' && text_[pos_] != '\n') {
          return fail_line(record, errors, "unexpected text after a quoted field");
        }
      } else {
        const std::size_t start = pos_;
        while (pos_ < text_.size() && text_[pos_] != ',' && text_[pos_] != '\n') {
          if (text_[pos_] == '"') {
            return fail_line(record, errors,
                             "a quote inside an unquoted field (hint: quote the whole field and "
                             "double the quotes inside it)");
          }
          ++pos_;
        }
        field = std::string(trim(text_.substr(start, pos_ - start)));
      }
      record.fields.push_back(std::move(field));
      if (pos_ >= text_.size()) return true;
      if (text_[pos_] == '\n') {
        advance_line(pos_);
        return true;
      }
      ++pos_;  // ','
    }
  }

  // Reports an error for the record and skips to the end of its line.
  bool fail_line(Record& record, std::vector<Diagnostic>& errors, std::string message) {
    errors.push_back({Severity::kError, name_, line_, 0, std::move(message), ""});
    advance_line(line_end(pos_));
    record.fields.clear();
    return true;  // the caller sees an empty record and skips it
  }

  const std::string& name_;
  std::string_view text_;
  std::size_t pos_ = 0;
  std::uint32_t line_ = 1;
};

std::string quoted(std::string_view s) { return "\"" + std::string(s) + "\""; }

constexpr double kMaxLatencyUs = 1e9;
// No all-reduce takes under a nanosecond; a denormal latency made the cap
// "off" (fused lost against 5e-324 us) and the regrets inf%.
constexpr double kMinLatencyUs = 1e-3;
// Far above any sweep; a device or a stray file would be read to the end.
constexpr std::size_t kMaxResultsBytes = std::size_t{256} << 20;

bool parse_u64(std::string_view s, std::uint64_t& out) {
  if (s.empty() || !std::isdigit(static_cast<unsigned char>(s.front()))) return false;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && ptr == s.data() + s.size();
}

// Converts the fields of one measured row; appends errors naming the column.
class RowParser {
 public:
  RowParser(const std::string& file, const Record& record, const std::map<std::string, int>& cols,
            std::vector<Diagnostic>& errors)
      : file_(file), record_(record), cols_(cols), errors_(errors) {}

  std::string_view field(std::string_view column) const {
    const auto it = cols_.find(std::string(column));
    return it == cols_.end() ? std::string_view() : record_.fields[it->second];
  }

  void error(std::string_view column, std::string message) {
    ok_ = false;
    errors_.push_back({Severity::kError, file_, record_.line, 0,
                       "column " + std::string(column) + ": " + std::move(message), ""});
  }

  std::uint64_t integer(std::string_view column, std::uint64_t min, std::uint64_t max) {
    const std::string_view s = field(column);
    std::uint64_t v = 0;
    if (s.empty()) {
      error(column, "empty; a whole number is needed");
    } else if (!parse_u64(s, v)) {
      const bool digits = s.find_first_not_of("0123456789") == std::string_view::npos;
      error(column, quoted(s) + (digits ? " is too large (at most " + std::to_string(max) + ")"
                                        : std::string(" is not a whole number")));
    } else if (v < min || v > max) {
      error(column, quoted(s) + " is outside " + std::to_string(min) + ".." + std::to_string(max));
    } else {
      return v;
    }
    return 0;
  }

  double latency(std::string_view column) {
    const std::string_view s = field(column);
    double v = 0;
    const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || ptr != s.data() + s.size() || !std::isfinite(v)) {
      error(column, quoted(s) + " is not a number");
      return 0;
    }
    if (v <= 0) {
      error(column, quoted(s) + " is not positive; a latency in microseconds is needed");
      return 0;
    }
    // Regrets divide by latencies: a value near the double's limit would
    // print as inf%. No all-reduce takes 1000 s.
    if (v > kMaxLatencyUs) {
      error(column, quoted(s) + " is over 1e9 us (1000 s): not a measured latency");
      return 0;
    }
    if (v < kMinLatencyUs) {
      error(column, quoted(s) + " is under 0.001 us (1 ns): not a measured latency");
      return 0;
    }
    return v;
  }

  bool boolean(std::string_view column) {
    const std::string s = lower(field(column));
    if (s == "1" || s == "true") return true;
    if (s == "0" || s == "false") return false;
    error(column, quoted(field(column)) + " is not 1, 0, true or false");
    return false;
  }

  template <class T>
  T name(std::string_view column, Parsed<T> parsed) {
    if (!parsed) {
      error(column, field(column).empty() ? std::string("empty") : parsed.error);
      return T{};
    }
    return *parsed.value;
  }

  bool ok() const { return ok_; }

 private:
  const std::string& file_;
  const Record& record_;
  const std::map<std::string, int>& cols_;
  std::vector<Diagnostic>& errors_;
  bool ok_ = true;
};

// The reason a row is not a measurement, or nullopt when it is one.
std::optional<std::string> skip_reason(const RowParser& p, const std::map<std::string, int>& cols) {
  if (cols.count("skipped")) {
    const std::string v = lower(p.field("skipped"));
    if (!v.empty() && v != "0" && v != "false" && v != "no") {
      std::string reason(p.field("skipped"));
      if ((v == "1" || v == "true" || v == "yes") && cols.count("reason") &&
          !p.field("reason").empty()) {
        reason = std::string(p.field("reason"));
      }
      return "skipped: " + reason;
    }
  }
  if (cols.count("status")) {
    const std::string v = lower(p.field("status"));
    if (!v.empty() && v != "ok") return "status " + std::string(p.field("status"));
  }
  if (p.field("latency_us").empty()) return std::string("no latency_us");
  return std::nullopt;
}

Row parse_row(RowParser& p, const std::string& file, std::uint32_t line) {
  Row r;
  r.file = file;
  r.line = line;
  r.capability = p.name("capability", parse_capability(p.field("capability")));
  r.world_size = static_cast<std::uint32_t>(p.integer("world_size", 2, 1024));
  r.nodes = static_cast<std::uint32_t>(p.integer("nodes", 1, 1024));
  if (r.world_size >= 2 && r.nodes > r.world_size) {
    p.error("nodes", quoted(p.field("nodes")) + " is more than the world size " +
                         std::to_string(r.world_size));
  }
  r.dtype = p.name("dtype", parse_dtype(p.field("dtype")));
  r.hidden = static_cast<std::uint32_t>(p.integer("hidden", 1, 0xFFFFFFFFu));
  r.num_tokens = static_cast<std::uint32_t>(p.integer("num_tokens", 1, 0xFFFFFFFFu));
  r.bytes = p.integer("bytes", 1, kMaxSizeBytes);
  r.pattern = p.name("pattern", parse_pattern(p.field("pattern")));
  r.backend = std::string(p.field("backend"));
  r.algorithm = std::string(p.field("algorithm"));
  r.fused = p.boolean("fused");
  r.latency_us = p.latency("latency_us");
  r.device = std::string(p.field("device"));

  // The residual: only once the pattern is known (a refused one says nothing).
  const std::string_view residual = p.field("residual");
  if (parse_pattern(p.field("pattern"))) {
    if (r.pattern == Pattern::kAllreduce) {
      if (!residual.empty()) {
        p.error("residual", quoted(residual) +
                                " given for pattern allreduce, which has no residual; leave it "
                                "empty");
      }
    } else {
      r.residual =
          residual.empty() ? Residual::kDistinct : p.name("residual", parse_residual(residual));
    }
  }

  const std::string_view buffers = p.field("buffers");
  if (const Parsed<BufferKind> kind = parse_buffer_kind(buffers); kind) {
    r.registered = *kind.value == BufferKind::kRegistered;
  } else if (!buffers.empty()) {
    p.error("buffers", quoted(buffers) +
                           " is not registered or copied (empty means copied: the call's "
                           "buffers were ordinary memory)");
  }

  if (r.backend.empty()) p.error("backend", "empty; name the backend measured");
  if (r.algorithm.empty()) p.error("algorithm", "empty; name the algorithm measured");
  if (r.fused && !r.backend.empty()) {
    // A fused row must be something the tables can choose.
    if (Parsed<Backend> b = parse_backend(r.backend); !b) {
      p.error("backend", "a fused row must name a backend the tables can choose: " + b.error);
    }
    if (Parsed<Algorithm> a = parse_algorithm(r.algorithm); !a && !r.algorithm.empty()) {
      p.error("algorithm", "a fused row must name oneshot, twoshot or native: " + a.error);
    }
  }
  if (p.ok()) {
    const unsigned __int128 product = static_cast<unsigned __int128>(r.num_tokens) * r.hidden *
                                      static_cast<unsigned>(element_size(r.dtype));
    if (product != r.bytes) {
      p.error("bytes", quoted(p.field("bytes")) + " is not num_tokens x hidden x element size (" +
                           std::to_string(r.num_tokens) + " x " + std::to_string(r.hidden) + " x " +
                           std::to_string(element_size(r.dtype)) + " for " +
                           std::string(dtype_name(r.dtype)) + ")");
    }
  }
  return r;
}

}  // namespace

std::string ResultsFile::provenance_value(std::string_view key) const {
  for (const auto& [k, v] : provenance) {
    if (k == key) return v;
  }
  return {};
}

ReadResult parse_results(const std::string& name, std::string_view text) {
  ReadResult result;
  ResultsFile file;
  file.path = name;
  std::vector<Diagnostic>& errors = result.diagnostics;
  // A UTF-8 byte-order mark (spreadsheets save one) is not part of the
  // first column's name.
  if (text.substr(0, 3) == "\xEF\xBB\xBF") text.remove_prefix(3);
  Reader reader(name, text);
  Record record;

  // The header: the first record.
  std::map<std::string, int> cols;
  std::uint32_t header_line = 0;
  std::size_t header_fields = 0;  // unnamed and repeated columns too
  while (reader.next(record, file.provenance, errors)) {
    if (record.fields.empty()) continue;  // a malformed line, already reported
    header_line = record.line;
    header_fields = record.fields.size();
    for (std::size_t i = 0; i < record.fields.size(); ++i) {
      const std::string& column = record.fields[i];
      if (column.empty()) {
        errors.push_back({Severity::kError, name, record.line, 0,
                          "header: column " + std::to_string(i + 1) + " has no name", ""});
      } else if (!cols.emplace(column, static_cast<int>(i)).second) {
        errors.push_back({Severity::kError, name, record.line, 0,
                          "header: column " + column + " appears twice", ""});
      }
    }
    break;
  }
  if (header_line == 0) {
    if (errors.empty()) {
      errors.push_back({Severity::kError, name, 0, 0,
                        "no header line (hint: the first line that is not a comment names the "
                        "columns: capability,world_size,nodes,...)",
                        ""});
    }
    return result;
  }
  std::string missing;
  for (std::string_view column : kRequiredColumns) {
    if (!cols.count(std::string(column))) {
      missing += (missing.empty() ? "" : ", ") + std::string(column);
    }
  }
  if (!missing.empty()) {
    errors.push_back({Severity::kError, name, header_line, 0,
                      "header: missing column" +
                          std::string(missing.find(',') == std::string::npos ? " " : "s ") +
                          missing,
                      "a results file needs the columns capability, world_size, nodes, dtype, "
                      "hidden, num_tokens, bytes, pattern, backend, algorithm, fused, latency_us"});
    return result;
  }

  // Comments may follow the header too (a bench notes as it goes).
  while (errors.size() < kMaxErrors && reader.next(record, file.provenance, errors)) {
    if (record.fields.empty()) continue;
    if (record.fields.size() != header_fields) {
      errors.push_back({Severity::kError, name, record.line, 0,
                        "the row has " + std::to_string(record.fields.size()) +
                            " fields; the header has " + std::to_string(header_fields),
                        ""});
      continue;
    }
    RowParser p(name, record, cols, errors);
    if (const std::optional<std::string> why = skip_reason(p, cols)) {
      file.notes.push_back(name + ":" + std::to_string(record.line) + ": note: row skipped (" +
                           *why + ")");
      continue;
    }
    Row row = parse_row(p, name, record.line);
    if (p.ok()) file.rows.push_back(std::move(row));
  }
  // `# device:` names the device of every row that has no device column.
  const std::string device = file.provenance_value("device");
  for (Row& row : file.rows) {
    if (row.device.empty()) row.device = device;
  }
  if (errors.size() >= kMaxErrors) {
    errors.push_back({Severity::kError, name, 0, 0, "too many errors; stopped reading", ""});
  }
  if (errors.empty()) result.file = std::move(file);
  return result;
}

ReadResult read_results(const std::string& path) {
  std::error_code ec;
  std::ifstream in(path, std::ios::binary);
  if (!in || std::filesystem::is_directory(path, ec)) {
    ReadResult result;
    result.diagnostics.push_back(
        {Severity::kError, path, 0, 0, "cannot read the file", "give the path of a results CSV"});
    result.unreadable = true;
    return result;
  }
  std::string text;
  char chunk[1 << 16];
  while (in.read(chunk, sizeof chunk) || in.gcount() > 0) {
    text.append(chunk, static_cast<std::size_t>(in.gcount()));
    if (text.size() > kMaxResultsBytes) {
      ReadResult result;
      result.diagnostics.push_back({Severity::kError, path, 0, 0,
                                    "the file is larger than 256 MiB: not a results CSV",
                                    "give the CSV that arbiter bench wrote"});
      result.unreadable = true;
      return result;
    }
  }
  return parse_results(path, text);
}

ResultsSet read_all_results(const std::vector<std::string>& paths) {
  ResultsSet set;
  for (std::size_t i = 0; i < paths.size(); ++i) {
    if (std::find(paths.begin(), paths.begin() + i, paths[i]) != paths.begin() + i) {
      set.errors.push_back({Severity::kError, paths[i], 0, 0,
                            "given more than once; its rows would count twice", ""});
      set.unreadable = true;
      continue;
    }
    ReadResult r = read_results(paths[i]);
    set.unreadable = set.unreadable || r.unreadable;
    set.errors.insert(set.errors.end(), r.diagnostics.begin(), r.diagnostics.end());
    if (r.file) {
      set.notes.insert(set.notes.end(), r.file->notes.begin(), r.file->notes.end());
      set.files.push_back(std::move(*r.file));
    }
  }
  return set;
}

}  // namespace arbiter::tuning
