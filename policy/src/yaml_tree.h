// A YAML document as a plain tree with a position on every node.
//
// Built from yaml-cpp's event stream rather than YAML::Node so that hostile
// input cannot hurt: anchors and aliases (cycles, exponential fan-out) are
// rejected before any node is shared, nesting is bounded, duplicate keys stay
// visible, and only one document is accepted.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "arbiter/diagnostic.h"

namespace arbiter::detail {

struct YamlNode {
  enum class Kind { kNull, kScalar, kMap, kSeq };
  Kind kind = Kind::kNull;
  std::uint32_t line = 0;                              // 1-based
  std::uint32_t column = 0;                            // 1-based
  std::string value;                                   // scalars
  bool quoted = false;                                 // scalar was written in quotes
  std::vector<std::pair<YamlNode, YamlNode>> entries;  // maps, in file order
  std::vector<YamlNode> items;                         // sequences

  // Defined (= default) in yaml_tree.cpp. An implicit one makes clang with
  // libstdc++ 12 instantiate std::pair<YamlNode, YamlNode> while YamlNode is
  // still incomplete, and reject the file.
  YamlNode();

  bool is_map() const { return kind == Kind::kMap; }
  bool is_seq() const { return kind == Kind::kSeq; }
  bool is_scalar() const { return kind == Kind::kScalar; }
  bool is_null() const { return kind == Kind::kNull; }
  std::string_view kind_name() const;
};

inline constexpr int kMaxYamlDepth = 32;

// Parses `bytes` (the contents of `file`). Returns false and appends an error
// to `diagnostics` when the text is not a single, safe YAML document. An
// empty document yields a kNull root and true.
bool parse_yaml(std::string_view bytes, const std::string& file, YamlNode& root,
                std::vector<Diagnostic>& diagnostics);

}  // namespace arbiter::detail
