// A small strict JSON reader for tests: enough to check that the CLI prints
// well-formed JSON and to read values back. Throws std::runtime_error.
#pragma once

#include <cctype>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace arbiter::test {

struct Json {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = Kind::kNull;
  bool boolean = false;
  std::string number;  // the literal text, so integers stay exact
  std::string string;
  std::vector<Json> array;
  std::map<std::string, Json> object;

  bool has(const std::string& key) const { return object.count(key) > 0; }
  const Json& operator[](const std::string& key) const {
    auto it = object.find(key);
    if (it == object.end()) throw std::runtime_error("no key " + key);
    return it->second;
  }
  bool is_integer() const {
    return kind == Kind::kNumber && number.find_first_of(".eE") == std::string::npos;
  }
};

class JsonReader {
 public:
  static Json parse(const std::string& text) {
    JsonReader r(text);
    Json j = r.value();
    r.skip();
    if (r.i_ != text.size()) r.fail("trailing text");
    return j;
  }

 private:
  explicit JsonReader(const std::string& t) : t_(t) {}
  [[noreturn]] void fail(const std::string& why) {
    throw std::runtime_error("bad JSON at " + std::to_string(i_) + ": " + why);
  }
  void skip() {
    while (i_ < t_.size() && std::isspace(static_cast<unsigned char>(t_[i_]))) ++i_;
  }
  bool eat(char c) {
    skip();
    if (i_ < t_.size() && t_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!eat(c)) fail(std::string("expected ") + c);
  }
  bool literal(const char* word) {
    const std::string w(word);
    if (t_.compare(i_, w.size(), w) == 0) {
      i_ += w.size();
      return true;
    }
    return false;
  }
  std::string str() {
    expect('"');
    std::string out;
    while (i_ < t_.size() && t_[i_] != '"') {
      char c = t_[i_++];
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in string");
      if (c == '\\') {
        if (i_ >= t_.size()) fail("bad escape");
        const char e = t_[i_++];
        switch (e) {
          case '"':
          case '\\':
          case '/':
            out += e;
            break;
          case 'n':
            out += '\n';
            break;
          case 't':
            out += '\t';
            break;
          case 'r':
            out += '\r';
            break;
          case 'b':
            out += '\b';
            break;
          case 'f':
            out += '\f';
            break;
          case 'u':
            if (i_ + 4 > t_.size()) fail("bad \\u");
            out += '?';
            i_ += 4;
            break;
          default:
            fail("bad escape");
        }
      } else {
        out += c;
      }
    }
    expect('"');
    return out;
  }
  Json value() {
    skip();
    Json j;
    if (i_ >= t_.size()) fail("unexpected end");
    const char c = t_[i_];
    if (c == '{') {
      ++i_;
      j.kind = Json::Kind::kObject;
      if (eat('}')) return j;
      do {
        skip();
        std::string key = str();
        expect(':');
        if (j.object.count(key)) fail("duplicate key " + key);
        j.object.emplace(key, value());
      } while (eat(','));
      expect('}');
    } else if (c == '[') {
      ++i_;
      j.kind = Json::Kind::kArray;
      if (eat(']')) return j;
      do {
        j.array.push_back(value());
      } while (eat(','));
      expect(']');
    } else if (c == '"') {
      j.kind = Json::Kind::kString;
      j.string = str();
    } else if (literal("true")) {
      j.kind = Json::Kind::kBool;
      j.boolean = true;
    } else if (literal("false")) {
      j.kind = Json::Kind::kBool;
    } else if (literal("null")) {
      j.kind = Json::Kind::kNull;
    } else if (c == '-' || std::isdigit(static_cast<unsigned char>(c))) {
      j.kind = Json::Kind::kNumber;
      const std::size_t start = i_;
      while (i_ < t_.size() && (std::isdigit(static_cast<unsigned char>(t_[i_])) ||
                                std::string("+-.eE").find(t_[i_]) != std::string::npos)) {
        ++i_;
      }
      j.number = t_.substr(start, i_ - start);
    } else {
      fail(std::string("unexpected ") + c);
    }
    return j;
  }
  const std::string& t_;
  std::size_t i_ = 0;
};

}  // namespace arbiter::test
