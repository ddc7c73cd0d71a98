// Sorted numbers as runs: "3, 5-7, 9-1024" (or "0-3,8" for a CPU list).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace arbiter::cli {

template <class Int>
std::string ranges_text(const std::vector<Int>& sorted, std::string_view separator = ", ") {
  std::string text;
  for (std::size_t i = 0; i < sorted.size();) {
    std::size_t j = i;
    while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) ++j;
    if (!text.empty()) text += separator;
    text += std::to_string(sorted[i]);
    if (j > i) text += "-" + std::to_string(sorted[j]);
    i = j + 1;
  }
  return text;
}

}  // namespace arbiter::cli
