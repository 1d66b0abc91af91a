#include "tokenizer/jinja/lexer.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "tokenizer/jinja/value.h"

namespace strata::jinja {
namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Python "unicode-escape" decoding, which Jinja applies to string literals. Unknown escapes keep
// their backslash, as Python does.
std::string unescape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out += s[i];
      continue;
    }
    char e = s[++i];
    switch (e) {
      case 'n':
        out += '\n';
        continue;
      case 't':
        out += '\t';
        continue;
      case 'r':
        out += '\r';
        continue;
      case '\\':
        out += '\\';
        continue;
      case '\'':
        out += '\'';
        continue;
      case '"':
        out += '"';
        continue;
      case 'a':
        out += '\a';
        continue;
      case 'b':
        out += '\b';
        continue;
      case 'f':
        out += '\f';
        continue;
      case 'v':
        out += '\v';
        continue;
      case '\n':
        continue;  // line continuation
      default:
        break;
    }
    if (e >= '0' && e <= '7') {
      uint32_t cp = 0;
      size_t k = 0;
      for (; k < 3 && i + k < s.size() && s[i + k] >= '0' && s[i + k] <= '7'; ++k) {
        cp = cp * 8 + (s[i + k] - '0');
      }
      i += k - 1;
      utf8_append(out, cp);
      continue;
    }
    size_t width = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
    bool ok = width > 0 && i + width < s.size();
    uint32_t cp = 0;
    for (size_t k = 1; ok && k <= width; ++k) {
      int h = i + k < s.size() ? hex_value(s[i + k]) : -1;
      if (h < 0) ok = false;
      cp = cp * 16 + (h < 0 ? 0 : h);
    }
    if (ok && cp <= 0x10ffff) {
      utf8_append(out, cp);
      i += width;
    } else {
      out += '\\';
      out += e;
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string source) : src_(std::move(source)) {}

  StatusOr<std::vector<Token>> run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      size_t start = find_tag(pos_);
      if (start == std::string::npos) {
        push_text(src_.substr(pos_));
        break;
      }
      std::string text = src_.substr(pos_, start - pos_);
      char kind = src_[start + 1];
      char sign = start + 2 < src_.size() && (src_[start + 2] == '-' || src_[start + 2] == '+')
                      ? src_[start + 2]
                      : 0;
      if (sign == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: drop blanks between the start of the line and a block/comment tag.
        size_t l_pos = text.rfind('\n');
        l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
        if ((l_pos > 0 || line_starting) &&
            std::all_of(text.begin() + l_pos, text.end(), is_space)) {
          text.resize(l_pos);
        }
      }
      push_text(std::move(text));
      pos_ = start + 2 + (sign ? 1 : 0);
      if (kind == '#') {
        STRATA_RETURN_IF_ERROR(skip_comment(start, line_starting));
      } else if (kind == '%' && try_raw(start, line_starting)) {
        continue;
      } else {
        STRATA_RETURN_IF_ERROR(lex_tag(kind == '{', start, line_starting));
      }
    }
    tokens_.push_back(Token{.type = TokenType::kEof, .line = line_at(src_.size())});
    return std::move(tokens_);
  }

 private:
  size_t find_tag(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        return i;
      }
    }
    return std::string::npos;
  }

  // Positions are asked for in increasing order, so counting resumes from the last answer.
  int line_at(size_t pos) {
    if (pos < line_pos_) {
      line_pos_ = 0;
      line_ = 1;
    }
    line_ += static_cast<int>(std::count(src_.begin() + line_pos_, src_.begin() + pos, '\n'));
    line_pos_ = pos;
    return line_;
  }

  void push_text(std::string text) {
    if (!text.empty()) tokens_.push_back(Token{.type = TokenType::kText, .text = std::move(text)});
  }

  // After a closing delimiter: "-" strips all following whitespace; trim_blocks drops one newline
  // after block and comment tags.
  void after_close(char sign, bool trim_newline, bool& line_starting) {
    size_t end = pos_;
    if (sign == '-') {
      while (pos_ < src_.size() && is_space(src_[pos_])) ++pos_;
    } else if (sign != '+' && trim_newline && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
    }
    line_starting = pos_ > end ? src_[pos_ - 1] == '\n' : false;
  }

  Status skip_comment(size_t start, bool& line_starting) {
    size_t body = pos_;
    size_t close = src_.find("#}", body);
    if (close == std::string::npos) {
      return invalid_argument("line {}: missing end of comment tag", line_at(start));
    }
    char sign =
        close > body && (src_[close - 1] == '-' || src_[close - 1] == '+') ? src_[close - 1] : 0;
    pos_ = close + 2;
    after_close(sign, /*trim_newline=*/true, line_starting);
    return Status();
  }

  // Matches "\s*NAME\s*[-+]?%}" at pos; returns the position after it, or npos.
  size_t match_simple_tag(size_t pos, std::string_view name, char* close_sign) const {
    while (pos < src_.size() && is_space(src_[pos])) ++pos;
    if (src_.compare(pos, name.size(), name) != 0) return std::string::npos;
    pos += name.size();
    while (pos < src_.size() && is_space(src_[pos])) ++pos;
    *close_sign = 0;
    if (pos < src_.size() && (src_[pos] == '-' || src_[pos] == '+')) *close_sign = src_[pos++];
    if (src_.compare(pos, 2, "%}") != 0) return std::string::npos;
    return pos + 2;
  }

  // {% raw %}...{% endraw %}: the body is text, tags inside it are not interpreted.
  bool try_raw(size_t start, bool& line_starting) {
    char sign = 0;
    size_t after = match_simple_tag(pos_, "raw", &sign);
    if (after == std::string::npos) return false;
    size_t body = after;
    if (sign == '-') {
      while (body < src_.size() && is_space(src_[body])) ++body;
    }
    for (size_t i = src_.find("{%", body); i != std::string::npos; i = src_.find("{%", i + 1)) {
      size_t p = i + 2;
      char open_sign = 0;
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) open_sign = src_[p++];
      char close_sign = 0;
      size_t end = match_simple_tag(p, "endraw", &close_sign);
      if (end == std::string::npos) continue;
      std::string text = src_.substr(body, i - body);
      if (open_sign == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      }
      push_text(std::move(text));
      pos_ = end;
      after_close(close_sign, /*trim_newline=*/true, line_starting);
      return true;
    }
    return false;  // no endraw: lexed as an ordinary tag, and the parser reports "raw"
  }

  Status lex_tag(bool is_var, size_t start, bool& line_starting) {
    int line = line_at(start);
    tokens_.push_back(
        Token{.type = is_var ? TokenType::kVarBegin : TokenType::kBlockBegin, .line = line});
    std::vector<char> braces;
    while (true) {
      while (pos_ < src_.size() && is_space(src_[pos_])) {
        if (src_[pos_] == '\n') ++line;
        ++pos_;
      }
      if (pos_ >= src_.size()) {
        return invalid_argument("line {}: unclosed '{}' tag (expected '{}')", line_at(start),
                                is_var ? "{{" : "{%", is_var ? "}}" : "%}");
      }
      if (braces.empty() && close_tag(is_var, line, line_starting)) return Status();
      STRATA_RETURN_IF_ERROR(lex_token(line, braces));
    }
  }

  bool close_tag(bool is_var, int line, bool& line_starting) {
    std::string_view end = is_var ? "}}" : "%}";
    char sign = 0;
    size_t p = pos_;
    if (src_[p] == '-' || (!is_var && src_[p] == '+')) sign = src_[p++];
    if (src_.compare(p, 2, end) != 0) return false;
    pos_ = p + 2;
    tokens_.push_back(
        Token{.type = is_var ? TokenType::kVarEnd : TokenType::kBlockEnd, .line = line});
    after_close(sign, /*trim_newline=*/!is_var, line_starting);
    return true;
  }

  Status lex_token(int& line, std::vector<char>& braces) {
    char c = src_[pos_];
    if (c == '\'' || c == '"') return lex_string(line);
    if (is_digit(c)) return lex_number(line);
    if (is_name_start(c)) {
      size_t b = pos_;
      while (pos_ < src_.size() && is_name_char(src_[pos_])) ++pos_;
      tokens_.push_back(
          Token{.type = TokenType::kName, .text = src_.substr(b, pos_ - b), .line = line});
      return Status();
    }
    static const char* kOps2[] = {"//", "**", "==", "!=", "<=", ">="};
    for (const char* op : kOps2) {
      if (src_.compare(pos_, 2, op) == 0) {
        tokens_.push_back(Token{.type = TokenType::kOp, .text = op, .line = line});
        pos_ += 2;
        return Status();
      }
    }
    if (std::string_view("+-*/%~<>=.,:|()[]{};").find(c) == std::string_view::npos) {
      return invalid_argument("line {}: unexpected character '{}' in tag", line, c);
    }
    if (c == '(' || c == '[' || c == '{') {
      braces.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    } else if (c == ')' || c == ']' || c == '}') {
      if (braces.empty() || braces.back() != c) {
        return invalid_argument("line {}: unexpected '{}'", line, c);
      }
      braces.pop_back();
    }
    tokens_.push_back(Token{.type = TokenType::kOp, .text = std::string(1, c), .line = line});
    ++pos_;
    return Status();
  }

  Status lex_string(int& line) {
    char quote = src_[pos_];
    size_t b = pos_ + 1;
    size_t i = b;
    int start_line = line;
    for (; i < src_.size() && src_[i] != quote; ++i) {
      if (src_[i] == '\n') ++line;
      if (src_[i] == '\\' && i + 1 < src_.size()) {
        if (src_[i + 1] == '\n') ++line;
        ++i;
      }
    }
    if (i >= src_.size()) return invalid_argument("line {}: unterminated string", start_line);
    tokens_.push_back(Token{.type = TokenType::kString,
                            .text = unescape(std::string_view(src_).substr(b, i - b)),
                            .line = start_line});
    pos_ = i + 1;
    return Status();
  }

  Status lex_number(int line) {
    size_t b = pos_;
    auto digits = [&](auto pred) {
      while (pos_ < src_.size() && (pred(src_[pos_]) || src_[pos_] == '_')) ++pos_;
    };
    auto is_hex = [](char c) { return hex_value(c) >= 0; };
    if (src_[pos_] == '0' && pos_ + 1 < src_.size() &&
        std::string_view("xXoObB").find(src_[pos_ + 1]) != std::string_view::npos) {
      char base_char = static_cast<char>(src_[pos_ + 1] | 0x20);
      int base = base_char == 'x' ? 16 : base_char == 'o' ? 8 : 2;
      pos_ += 2;
      size_t digits_begin = pos_;
      digits(is_hex);
      return push_int(src_.substr(digits_begin, pos_ - digits_begin), base, line);
    }
    digits(is_digit);
    bool is_float = false;
    bool after_dot = b > 0 && src_[b - 1] == '.';  // "x.0.1" is item 0 then item 1, as in Jinja
    if (!after_dot && pos_ + 1 < src_.size() && src_[pos_] == '.' && is_digit(src_[pos_ + 1])) {
      is_float = true;
      ++pos_;
      digits(is_digit);
    }
    if (!after_dot && pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
      size_t p = pos_ + 1;
      if (p < src_.size() && (src_[p] == '+' || src_[p] == '-')) ++p;
      if (p < src_.size() && is_digit(src_[p])) {
        is_float = true;
        pos_ = p;
        digits(is_digit);
      }
    }
    std::string text = src_.substr(b, pos_ - b);
    if (!is_float) return push_int(text, 10, line);
    text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
    tokens_.push_back(Token{.type = TokenType::kFloat,
                            .float_value = std::strtod(text.c_str(), nullptr),
                            .line = line});
    return Status();
  }

  Status push_int(std::string text, int base, int line) {
    text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
    errno = 0;
    char* end = nullptr;
    long long v = std::strtoll(text.c_str(), &end, base);
    if (text.empty() || errno == ERANGE || *end != '\0') {
      return invalid_argument("line {}: bad or too large integer literal '{}'", line, text);
    }
    tokens_.push_back(Token{.type = TokenType::kInt, .int_value = v, .line = line});
    return Status();
  }

  std::string src_;
  size_t pos_ = 0;
  std::vector<Token> tokens_;
  size_t line_pos_ = 0;
  int line_ = 1;
};

// Jinja's newline handling: "\r\n" and "\r" become "\n", and one trailing newline is dropped.
std::string normalize_newlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

}  // namespace

StatusOr<std::vector<Token>> tokenize(std::string_view source) {
  Lexer lexer(normalize_newlines(source));
  return lexer.run();
}

}  // namespace strata::jinja
