#include "tokenizer/normalizer.h"

#include <vector>

#include "core/log.h"
#include "tokenizer/utf8.h"

namespace strata::tok {

std::string replace_all(const Pattern& pattern, std::string_view text, std::string_view content) {
  std::vector<ByteRange> matches;
  pattern.find_all(text, &matches);
  if (matches.empty()) return std::string(text);
  std::string out;
  out.reserve(text.size() + matches.size() * content.size());
  size_t prev = 0;
  for (const auto& [b, e] : matches) {
    out.append(text.substr(prev, b - prev));
    out.append(content);
    prev = e;
  }
  out.append(text.substr(prev));
  return out;
}

namespace {

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
      : steps_(std::move(steps)) {}
  void normalize(std::string* text) const override {
    for (const auto& s : steps_) s->normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void normalize(std::string* text) const override {
    *text = replace_all(pattern_, *text, content_);
  }

 private:
  Pattern pattern_;
  std::string content_;
};

// SentencePiece-style "▁" prefix; like Hugging Face, empty text stays empty.
class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string* text) const override {
    if (!text->empty()) text->insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string* text) const override {
    size_t begin = 0, end = text->size();
    if (left_) {
      while (begin < end) {
        size_t p = begin;
        if (!is_unicode_whitespace(next_code_point(*text, &p))) break;
        begin = p;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<unsigned char>((*text)[start]) & 0xC0) == 0x80)
          --start;
        size_t p = start;
        if (!is_unicode_whitespace(next_code_point(*text, &p))) break;
        end = start;
      }
    }
    *text = text->substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

// Text that is already NFC (nearly all real input) is unchanged by NFC, so this is exact for it;
// decomposed input would need the Unicode composition tables, which we do not carry.
class IdentityNormalizer final : public Normalizer {
 public:
  void normalize(std::string*) const override {}
};

}  // namespace

StatusOr<std::unique_ptr<Normalizer>> make_normalizer(const Json& j, std::string_view where) {
  if (j.is_null()) return std::unique_ptr<Normalizer>();
  if (!j.is_object()) return invalid_argument("{} must be an object or null", where);
  STRATA_ASSIGN_OR_RETURN(std::string type, json_string(j, "type", where));
  if (type == "Sequence") {
    auto it = j.find("normalizers");
    if (it == j.end() || !it->is_array()) {
      return invalid_argument("{}.normalizers must be an array", where);
    }
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (size_t i = 0; i < it->size(); ++i) {
      STRATA_ASSIGN_OR_RETURN(
          auto step, make_normalizer((*it)[i], fmt::format("{}.normalizers[{}]", where, i)));
      if (step) steps.push_back(std::move(step));
    }
    return std::unique_ptr<Normalizer>(new SequenceNormalizer(std::move(steps)));
  }
  if (type == "Replace") {
    STRATA_ASSIGN_OR_RETURN(Pattern pattern, json_pattern(j, where));
    STRATA_ASSIGN_OR_RETURN(std::string content, json_string(j, "content", where));
    return std::unique_ptr<Normalizer>(new ReplaceNormalizer(std::move(pattern), content));
  }
  if (type == "Prepend") {
    STRATA_ASSIGN_OR_RETURN(std::string prefix, json_string(j, "prepend", where));
    return std::unique_ptr<Normalizer>(new PrependNormalizer(prefix));
  }
  if (type == "Strip") {
    STRATA_ASSIGN_OR_RETURN(bool left, json_bool_or(j, "strip_left", true, where));
    STRATA_ASSIGN_OR_RETURN(bool right, json_bool_or(j, "strip_right", true, where));
    return std::unique_ptr<Normalizer>(new StripNormalizer(left, right));
  }
  if (type == "NFC") {
    LOG_WARN("{}: NFC normalizer treated as identity (exact for text already in NFC)", where);
    return std::unique_ptr<Normalizer>(new IdentityNormalizer());
  }
  return unimplemented("{}: normalizer type '{}' is not supported", where, type);
}

}  // namespace strata::tok
