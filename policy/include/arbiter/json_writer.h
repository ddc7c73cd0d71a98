// Minimal JSON output for decisions, traces and tool reports; no dependency.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace arbiter {

inline void json_string(std::string& out, std::string_view s) {
  static const char* kHex = "0123456789abcdef";
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += kHex[c >> 4];
          out += kHex[c & 15];
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

// "key": for the next value; handles the comma before every key but the first.
class JsonObject {
 public:
  explicit JsonObject(std::string& out) : out_(out) { out_ += '{'; }
  std::string& key(std::string_view k) {
    if (!first_) out_ += ',';
    first_ = false;
    json_string(out_, k);
    out_ += ':';
    return out_;
  }
  void str(std::string_view k, std::string_view v) { json_string(key(k), v); }
  void num(std::string_view k, std::uint64_t v) { key(k) += std::to_string(v); }
  void boolean(std::string_view k, bool v) { key(k) += v ? "true" : "false"; }
  void null(std::string_view k) { key(k) += "null"; }
  void close() { out_ += '}'; }

 private:
  std::string& out_;
  bool first_ = true;
};

}  // namespace arbiter
