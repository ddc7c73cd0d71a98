#include "text.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "arbiter/size.h"

namespace arbiter::tuning::detail {

std::string number_text(double value) {
  char buffer[64];
  const auto [ptr, ec] = std::to_chars(buffer, buffer + sizeof buffer, value);
  if (ec != std::errc()) return "?";
  return std::string(buffer, ptr);
}

std::string us_text(double latency_us) {
  // Latencies come from text; a median of two may add digits: keep 4
  // significant ones at most.
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.4g", latency_us);
  double rounded = std::strtod(buffer, nullptr);
  return number_text(rounded) + " us";
}

std::string percent_text(double percent) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.1f%%", percent);
  return buffer;
}

std::string size_text(std::uint64_t bytes) {
  std::string s = format_size(bytes);
  if (bytes > kMiB && bytes % kMiB != 0) {
    char buffer[64];
    std::snprintf(buffer, sizeof buffer, " ~ %.3f MiB", static_cast<double>(bytes) / kMiB);
    s += buffer;
  }
  return s;
}

std::string size_cell(std::uint64_t bytes) {
  std::string s = format_size(bytes);
  if (const std::size_t space = s.find(' '); space != std::string::npos) s.erase(space, 1);
  return s;
}

std::string printable(std::string_view text) {
  std::string out;
  std::size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      out += (c < 0x20 || c == 0x7F) ? ' ' : static_cast<char>(c);
      ++i;
      continue;
    }
    // A well-formed UTF-8 sequence: no overlong forms, no surrogates, at
    // most U+10FFFF.
    int length = 0;
    std::uint32_t code = 0;
    if (c >= 0xC2 && c <= 0xDF) {
      length = 2;
      code = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
      length = 3;
      code = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      length = 4;
      code = c & 0x07;
    }
    bool ok = length > 0 && i + length <= text.size();
    for (int k = 1; ok && k < length; ++k) {
      const auto cc = static_cast<unsigned char>(text[i + k]);
      ok = (cc & 0xC0) == 0x80;
      code = (code << 6) | (cc & 0x3F);
    }
    if (ok) {
      const std::uint32_t min = length == 2 ? 0x80 : length == 3 ? 0x800 : 0x10000;
      ok = code >= min && code <= 0x10FFFF && (code < 0xD800 || code > 0xDFFF);
    }
    if (ok) {
      out.append(text.substr(i, length));
      i += length;
    } else {
      out += '?';
      ++i;
    }
  }
  return out;
}

std::string yaml_quoted(std::string_view text) {
  std::string out = "\"";
  for (char c : printable(text)) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string xml_escaped(std::string_view text) {
  std::string out;
  for (char c : printable(text)) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace arbiter::tuning::detail
