// Text helpers shared by the tuning sources: number formatting and escaping
// for YAML, XML and terminals.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace arbiter::tuning::detail {

// The shortest text that reads back as `value`: 118, 16.5, 0.25.
std::string number_text(double value);

// "118 us"
std::string us_text(double latency_us);

// "33.3%": one decimal.
std::string percent_text(double percent);

// format_size(), with the size in MiB to 3 decimals when it is above 1 MiB
// and not a whole number of MiB: "65534 KiB ~ 63.998 MiB".
std::string size_text(std::uint64_t bytes);

// "64MiB": format_size() without the space, for table cells.
std::string size_cell(std::uint64_t bytes);

// `text` with control characters replaced by spaces and invalid UTF-8
// replaced by '?': safe inside one line of YAML, a comment or XML.
std::string printable(std::string_view text);

// A YAML double-quoted scalar holding printable(text).
std::string yaml_quoted(std::string_view text);

// printable(text) with &, <, >, " and ' escaped for XML text and attributes.
std::string xml_escaped(std::string_view text);

}  // namespace arbiter::tuning::detail
