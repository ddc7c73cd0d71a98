// Small text helpers for messages: did-you-mean suggestions and lists.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace arbiter {

// Edit distance between a and b (insertions, deletions, substitutions,
// transpositions of neighbours).
int edit_distance(std::string_view a, std::string_view b);

// The known name closest to `text`, or empty when none is close enough to
// be a plausible typo.
std::string closest_name(std::string_view text, const std::vector<std::string_view>& known);

// "a, b, c"
std::string join(const std::vector<std::string_view>& names);

// "unknown backend 'trtlm' (did you mean 'trtllm'?); known: trtllm, ..."
std::string unknown_name_message(std::string_view what, std::string_view text,
                                 const std::vector<std::string_view>& known);

}  // namespace arbiter
