#include "text_util.h"

#include <algorithm>
#include <numeric>

namespace arbiter {

int edit_distance(std::string_view a, std::string_view b) {
  // Optimal string alignment distance; names are short, so O(n*m) is fine.
  const std::size_t n = a.size(), m = b.size();
  std::vector<std::vector<int>> d(n + 1, std::vector<int>(m + 1));
  for (std::size_t i = 0; i <= n; ++i) d[i][0] = static_cast<int>(i);
  for (std::size_t j = 0; j <= m; ++j) d[0][j] = static_cast<int>(j);
  for (std::size_t i = 1; i <= n; ++i) {
    for (std::size_t j = 1; j <= m; ++j) {
      const int cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[n][m];
}

std::string closest_name(std::string_view text, const std::vector<std::string_view>& known) {
  std::string best;
  int best_distance = 0;
  for (std::string_view name : known) {
    const int d = edit_distance(text, name);
    if (best.empty() || d < best_distance) {
      best = name;
      best_distance = d;
    }
  }
  // A plausible typo: at most a third of the name wrong, and at most 3 edits.
  const int limit = std::min<int>(3, std::max<std::size_t>(1, best.size() / 3));
  return best_distance <= limit ? best : std::string();
}

std::string join(const std::vector<std::string_view>& names) {
  std::string out;
  for (std::string_view n : names) {
    if (!out.empty()) out += ", ";
    out += n;
  }
  return out;
}

std::string unknown_name_message(std::string_view what, std::string_view text,
                                 const std::vector<std::string_view>& known) {
  std::string msg = "unknown " + std::string(what) + " '" + std::string(text) + "'";
  if (std::string near = closest_name(text, known); !near.empty()) {
    msg += " (did you mean '" + near + "'?)";
  }
  msg += "; known: " + join(known);
  return msg;
}

}  // namespace arbiter
