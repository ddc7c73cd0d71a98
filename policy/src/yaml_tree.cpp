#include "yaml_tree.h"

#include <optional>
#include <sstream>

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/exceptions.h>
#include <yaml-cpp/parser.h>

namespace arbiter::detail {

YamlNode::YamlNode() = default;

namespace {

struct TreeError {
  std::uint32_t line, column;
  std::string message, hint;
};

std::uint32_t one_based(int v) { return v < 0 ? 0 : static_cast<std::uint32_t>(v) + 1; }

class TreeBuilder : public YAML::EventHandler {
 public:
  TreeBuilder(YamlNode& root, std::string_view text) : root_(root), text_(text) {}

  // A problem found in a document that yaml-cpp itself accepted. Reported
  // only when parsing ends without a syntax error, which says more.
  const std::optional<TreeError>& deferred() const { return deferred_; }

  void OnDocumentStart(const YAML::Mark& mark) override {
    if (++documents_ > 1) {
      throw TreeError{one_based(mark.line), one_based(mark.column),
                      "a table file holds one YAML document; found a second",
                      "remove the '---' separator or split the file"};
    }
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    check_anchor(mark, anchor);
    YamlNode node;
    place(mark, std::move(node));
  }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override {
    throw TreeError{one_based(mark.line), one_based(mark.column),
                    "aliases (*name) are not allowed in tuning tables",
                    "write the value out in full"};
  }
  void OnAnchor(const YAML::Mark& mark, const std::string&) override { check_anchor(mark, 1); }
  void OnScalar(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t anchor,
                const std::string& value) override {
    check_anchor(mark, anchor);
    check_tag(mark, tag);
    YamlNode node;
    node.kind = YamlNode::Kind::kScalar;
    node.value = value;
    node.quoted = tag == "!";
    if (node.quoted) check_closed_quote(mark);
    place(mark, std::move(node));
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t anchor,
                       YAML::EmitterStyle::value style) override {
    open(mark, tag, anchor, YamlNode::Kind::kSeq, style == YAML::EmitterStyle::Flow);
  }
  void OnSequenceEnd() override { stack_.pop_back(); }
  void OnMapStart(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t anchor,
                  YAML::EmitterStyle::value style) override {
    open(mark, tag, anchor, YamlNode::Kind::kMap, style == YAML::EmitterStyle::Flow);
  }

  // The innermost '{' or '[' still open, for "never closed" errors.
  const YamlNode* innermost_open_flow() const {
    for (auto it = stack_.rbegin(); it != stack_.rend(); ++it) {
      if (it->flow) return it->node;
    }
    return nullptr;
  }
  void OnMapEnd() override {
    if (stack_.back().awaiting_value) {
      // yaml-cpp ends a map with a key and no value only on broken input.
      stack_.back().node->entries.back().second = YamlNode{};
    }
    stack_.pop_back();
  }

 private:
  struct Frame {
    YamlNode* node;
    bool awaiting_value = false;
    bool flow = false;  // written as { } or [ ]
  };

  // yaml-cpp 0.7 accepts a quoted scalar left open at the end of the file and
  // swallows the rest of the file into it; find the closing quote ourselves.
  void check_closed_quote(const YAML::Mark& mark) {
    if (mark.pos < 0 || static_cast<std::size_t>(mark.pos) >= text_.size()) return;
    const char quote = text_[mark.pos];
    if (quote != '"' && quote != '\'') return;
    for (std::size_t i = mark.pos + 1; i < text_.size(); ++i) {
      if (quote == '"' && text_[i] == '\\') {
        ++i;  // an escaped character
      } else if (text_[i] == quote) {
        if (quote == '\'' && i + 1 < text_.size() && text_[i + 1] == '\'') {
          ++i;  // '' is a quote inside a single-quoted string
          continue;
        }
        return;
      }
    }
    throw TreeError{one_based(mark.line), one_based(mark.column),
                    "YAML syntax: quoted string is never closed",
                    std::string("add the closing ") + quote};
  }

  void check_anchor(const YAML::Mark& mark, YAML::anchor_t anchor) {
    if (anchor != YAML::NullAnchor) {
      throw TreeError{one_based(mark.line), one_based(mark.column),
                      "anchors (&name) are not allowed in tuning tables",
                      "write each value out in full"};
    }
  }
  void check_tag(const YAML::Mark& mark, const std::string& tag) {
    if (!tag.empty() && tag != "?" && tag != "!") {
      throw TreeError{one_based(mark.line), one_based(mark.column),
                      "YAML tags ('" + tag + "') are not allowed in tuning tables",
                      "remove the tag"};
    }
  }
  void open(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t anchor,
            YamlNode::Kind kind, bool flow) {
    check_anchor(mark, anchor);
    check_tag(mark, tag);
    if (static_cast<int>(stack_.size()) >= kMaxYamlDepth) {
      throw TreeError{one_based(mark.line), one_based(mark.column),
                      "nesting deeper than " + std::to_string(kMaxYamlDepth) + " levels",
                      "a tuning table needs at most 4 levels"};
    }
    YamlNode node;
    node.kind = kind;
    YamlNode* placed = place(mark, std::move(node));
    stack_.push_back(Frame{placed, false, flow});
  }
  // Attaches a finished or opening node to its parent; returns its address,
  // which stays valid while it is the innermost open container.
  YamlNode* place(const YAML::Mark& mark, YamlNode node) {
    node.line = one_based(mark.line);
    node.column = one_based(mark.column);
    if (stack_.empty()) {
      root_ = std::move(node);
      return &root_;
    }
    Frame& parent = stack_.back();
    if (parent.node->is_seq()) {
      parent.node->items.push_back(std::move(node));
      return &parent.node->items.back();
    }
    if (!parent.awaiting_value) {
      if (!node.is_scalar() && !node.is_null() && !deferred_) {
        deferred_ =
            TreeError{node.line, node.column,
                      "mapping keys must be plain names, not " + std::string(node.kind_name()),
                      "is a '{' or '[' on the line above left open?"};
      }
      parent.node->entries.emplace_back(std::move(node), YamlNode{});
      parent.awaiting_value = true;
      return &parent.node->entries.back().first;
    }
    parent.awaiting_value = false;
    parent.node->entries.back().second = std::move(node);
    return &parent.node->entries.back().second;
  }

  YamlNode& root_;
  std::string_view text_;
  std::vector<Frame> stack_;
  int documents_ = 0;
  std::optional<TreeError> deferred_;
};

// Length of the valid UTF-8 sequence at bytes[i], or 0 when it is invalid
// (bad lead byte, bad continuation, overlong form, surrogate, > U+10FFFF).
int utf8_length(std::string_view bytes, std::size_t i) {
  const auto at = [&](std::size_t k) -> unsigned {
    return k < bytes.size() ? static_cast<unsigned char>(bytes[k]) : 0u;
  };
  const unsigned c = at(i);
  if (c < 0x80) return 1;
  int n = 0;
  unsigned lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;  // overlong
    if (c == 0xED) hi = 0x9F;  // UTF-16 surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;  // overlong
    if (c == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    return 0;
  }
  if (at(i + 1) < lo || at(i + 1) > hi) return 0;
  for (int k = 2; k < n; ++k) {
    if ((at(i + k) & 0xC0) != 0x80) return 0;
  }
  return n;
}

// Reports NUL bytes, invalid UTF-8 and tabs in indentation (YAML forbids
// them; yaml-cpp's own message for it, "illegal map value", misleads).
bool check_text(std::string_view bytes, const std::string& file,
                std::vector<Diagnostic>& diagnostics) {
  std::uint32_t line = 1, column = 1;
  bool indenting = true;
  for (std::size_t i = 0; i < bytes.size();) {
    const char c = bytes[i];
    if (c == '\0') {
      diagnostics.push_back({Severity::kError, file, line, column, "NUL byte in a table file",
                             "tables are UTF-8 text; is this a binary file?"});
      return false;
    }
    const int n = utf8_length(bytes, i);
    if (n == 0) {
      diagnostics.push_back({Severity::kError, file, line, column, "invalid UTF-8 byte sequence",
                             "save the file as UTF-8 text"});
      return false;
    }
    if (c == '\t' && indenting) {
      diagnostics.push_back({Severity::kError, file, line, column,
                             "tab character in indentation; YAML indents with spaces only",
                             "replace the tabs with spaces"});
      return false;
    }
    if (c != ' ' && c != '\t') indenting = false;
    if (c == '\n') {
      ++line;
      column = 1;
      indenting = true;
    } else {
      ++column;
    }
    i += static_cast<std::size_t>(n);
  }
  return true;
}

}  // namespace

std::string_view YamlNode::kind_name() const {
  switch (kind) {
    case Kind::kNull:
      return "nothing";
    case Kind::kScalar:
      return "a scalar";
    case Kind::kMap:
      return "a mapping";
    case Kind::kSeq:
      return "a list";
  }
  return "?";
}

bool parse_yaml(std::string_view bytes, const std::string& file, YamlNode& root,
                std::vector<Diagnostic>& diagnostics) {
  root = YamlNode{};
  if (bytes.starts_with("\xEF\xBB\xBF")) bytes.remove_prefix(3);  // UTF-8 BOM
  if (!check_text(bytes, file, diagnostics)) return false;
  std::istringstream in{std::string(bytes)};
  TreeBuilder builder(root, bytes);
  try {
    YAML::Parser parser(in);
    while (parser.HandleNextDocument(builder)) {
    }
    if (const auto& e = builder.deferred()) throw *e;
  } catch (const TreeError& e) {
    diagnostics.push_back({Severity::kError, file, e.line, e.column, e.message, e.hint});
    return false;
  } catch (const YAML::Exception& e) {
    std::string msg = e.msg;
    std::string hint;
    if (msg == "bad file" || msg.find("depth") != std::string::npos) {
      msg = "the YAML nesting is too deep to read";
      hint = "a tuning table needs at most 4 levels";
    } else {
      msg = "YAML syntax: " + msg;
      const bool map = msg.find("end of map flow not found") != std::string::npos;
      const bool seq = msg.find("end of sequence flow not found") != std::string::npos;
      if (const YamlNode* open = builder.innermost_open_flow(); open && (map || seq)) {
        // Point at the bracket left open, not where yaml-cpp gave up.
        diagnostics.push_back(
            {Severity::kError, file, open->line, open->column,
             std::string("YAML syntax: this '") + (open->is_map() ? "{" : "[") +
                 "' is never closed",
             std::string("add the closing '") + (open->is_map() ? "}" : "]") + "'"});
        return false;
      }
    }
    diagnostics.push_back(
        {Severity::kError, file, one_based(e.mark.line), one_based(e.mark.column), msg, hint});
    return false;
  }
  return true;
}

}  // namespace arbiter::detail
