#include "text_util.h"

#include <algorithm>
#include <numeric>

namespace arbiter {

int edit_distance(std::string_view a, std::string_view b) {
  // Optimal string alignment distance, keeping three rows (i-2, i-1, i) in
  // one allocation.
  const std::size_t n = a.size(), m = b.size();
  std::vector<int> rows(3 * (m + 1));
  int* before = rows.data();        // row i-2
  int* previous = before + m + 1;   // row i-1
  int* current = previous + m + 1;  // row i
  for (std::size_t j = 0; j <= m; ++j) previous[j] = static_cast<int>(j);
  for (std::size_t i = 1; i <= n; ++i) {
    current[0] = static_cast<int>(i);
    for (std::size_t j = 1; j <= m; ++j) {
      const int cost = a[i - 1] == b[j - 1] ? 0 : 1;
      current[j] = std::min({previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        current[j] = std::min(current[j], before[j - 2] + 1);
      }
    }
    int* recycled = before;
    before = previous;
    previous = current;
    current = recycled;
  }
  return previous[m];
}

std::string closest_name(std::string_view text, const std::vector<std::string_view>& known) {
  // No suggestion is ever more than kMaxEdits away, and the distance is at
  // least the difference in length: names far longer or shorter are skipped
  // (a long unknown key would otherwise cost length x name length each).
  constexpr std::size_t kMaxEdits = 3;
  std::string best;
  int best_distance = 0;
  for (std::string_view name : known) {
    const std::size_t gap =
        text.size() > name.size() ? text.size() - name.size() : name.size() - text.size();
    if (gap > kMaxEdits) continue;
    const int d = edit_distance(text, name);
    if (best.empty() || d < best_distance) {
      best = name;
      best_distance = d;
    }
  }
  // A plausible typo: at most a third of the name wrong, and at most 3 edits.
  const int limit = std::min<int>(kMaxEdits, std::max<std::size_t>(1, best.size() / 3));
  return !best.empty() && best_distance <= limit ? best : std::string();
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
