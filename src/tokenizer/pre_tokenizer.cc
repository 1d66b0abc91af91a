#include "tokenizer/pre_tokenizer.h"

#include <algorithm>

#include "tokenizer/utf8.h"

namespace strata::tok {

namespace {

// GPT-2's pattern, used by ByteLevel when use_regex is true.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Cuts each word at the pieces computed by `split_one`, keeping at_start for a piece at 0.
template <typename Fn>
void refine(std::vector<Word>* words, Fn split_one) {
  std::vector<Word> out;
  out.reserve(words->size() * 2);
  std::vector<ByteRange> pieces;
  for (Word& w : *words) {
    pieces.clear();
    split_one(w.text, &pieces);
    for (const auto& [b, e] : pieces) {
      out.push_back(Word{w.text.substr(b, e - b), w.at_start && b == 0});
    }
  }
  words->swap(out);
}

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps)
      : steps_(std::move(steps)) {}
  void pre_tokenize(std::vector<Word>* words) const override {
    for (const auto& s : steps_) s->pre_tokenize(words);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(Pattern pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  void pre_tokenize(std::vector<Word>* words) const override {
    std::vector<ByteRange> matches;
    refine(words, [&](const std::string& text, std::vector<ByteRange>* pieces) {
      matches.clear();
      pattern_.find_all(text, &matches);
      split_by_matches(text.size(), matches, invert_, behavior_, pieces);
    });
  }

 private:
  Pattern pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::unique_ptr<SplitPreTokenizer> split)
      : add_prefix_space_(add_prefix_space), split_(std::move(split)) {}
  void pre_tokenize(std::vector<Word>* words) const override {
    if (add_prefix_space_) {
      for (Word& w : *words) {
        if (!w.text.starts_with(' ')) w.text.insert(0, " ");
      }
    }
    if (split_) split_->pre_tokenize(words);
    for (Word& w : *words) w.text = byte_level_encode(w.text);
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<SplitPreTokenizer> split_;
};

enum class PrependScheme { kAlways, kFirst, kNever };

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {}
  void pre_tokenize(std::vector<Word>* words) const override {
    for (Word& w : *words) {
      w.text = replace_spaces(w.text);
      const bool prepend =
          scheme_ == PrependScheme::kAlways || (scheme_ == PrependScheme::kFirst && w.at_start);
      if (prepend && !w.text.starts_with(replacement_)) w.text.insert(0, replacement_);
    }
    if (!split_) return;
    const Pattern rep = Pattern::literal(replacement_);
    std::vector<ByteRange> matches;
    refine(words, [&](const std::string& text, std::vector<ByteRange>* pieces) {
      matches.clear();
      rep.find_all(text, &matches);
      split_by_matches(text.size(), matches, false, SplitBehavior::kMergedWithNext, pieces);
    });
  }

 private:
  std::string replace_spaces(const std::string& text) const {
    std::string out;
    out.reserve(text.size() + 8);
    for (char c : text) {
      if (c == ' ') {
        out += replacement_;
      } else {
        out.push_back(c);
      }
    }
    return out;
  }

  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
};

StatusOr<SplitBehavior> parse_behavior(const std::string& name, std::string_view where) {
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return invalid_argument("{}.behavior '{}' is not a split behavior", where, name);
}

StatusOr<std::unique_ptr<SplitPreTokenizer>> make_regex_split(std::string_view pattern,
                                                              SplitBehavior behavior) {
  STRATA_ASSIGN_OR_RETURN(Pattern p, Pattern::regex(pattern));
  return std::make_unique<SplitPreTokenizer>(std::move(p), behavior, false);
}

StatusOr<std::unique_ptr<PreTokenizer>> make_metaspace(const Json& j, std::string_view where) {
  STRATA_ASSIGN_OR_RETURN(std::string replacement, json_char(j, "replacement", where));
  PrependScheme scheme = PrependScheme::kAlways;
  if (auto it = j.find("prepend_scheme"); it != j.end() && !it->is_null()) {
    STRATA_ASSIGN_OR_RETURN(std::string s, json_string(j, "prepend_scheme", where));
    if (s == "always") {
      scheme = PrependScheme::kAlways;
    } else if (s == "first") {
      scheme = PrependScheme::kFirst;
    } else if (s == "never") {
      scheme = PrependScheme::kNever;
    } else {
      return invalid_argument("{}.prepend_scheme '{}' is not always|first|never", where, s);
    }
  } else {  // older files: add_prefix_space
    STRATA_ASSIGN_OR_RETURN(bool add, json_bool_or(j, "add_prefix_space", true, where));
    scheme = add ? PrependScheme::kAlways : PrependScheme::kNever;
  }
  STRATA_ASSIGN_OR_RETURN(bool split, json_bool_or(j, "split", true, where));
  return std::unique_ptr<PreTokenizer>(new MetaspacePreTokenizer(replacement, scheme, split));
}

}  // namespace

void split_by_matches(size_t text_size, const std::vector<ByteRange>& matches, bool invert,
                      SplitBehavior behavior, std::vector<ByteRange>* pieces) {
  // Cover the text with (range, is_match) like Hugging Face's Pattern::find_matches.
  std::vector<std::pair<ByteRange, bool>> spans;
  spans.reserve(matches.size() * 2 + 1);
  size_t prev = 0;
  for (const auto& m : matches) {
    if (prev != m.first) spans.push_back({{prev, m.first}, invert});
    spans.push_back({m, !invert});
    prev = m.second;
  }
  if (prev != text_size) spans.push_back({{prev, text_size}, invert});

  std::vector<ByteRange> out;
  out.reserve(spans.size());
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const auto& [r, is_match] : spans) {
        if (!is_match) out.push_back(r);
      }
      break;
    case SplitBehavior::kIsolated:
      for (const auto& [r, is_match] : spans) out.push_back(r);
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const auto& [r, is_match] : spans) {
        if (is_match && !previous_match && !out.empty()) {
          out.back().second = r.second;
        } else {
          out.push_back(r);
        }
        previous_match = is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        const auto& [r, is_match] = *it;
        if (is_match && !previous_match && !out.empty()) {
          out.back().first = r.first;
        } else {
          out.push_back(r);
        }
        previous_match = is_match;
      }
      std::reverse(out.begin(), out.end());
      break;
    case SplitBehavior::kContiguous:
      for (const auto& [r, is_match] : spans) {
        if (is_match == previous_match && !out.empty()) {
          out.back().second = r.second;
        } else {
          out.push_back(r);
        }
        previous_match = is_match;
      }
      break;
  }
  for (const auto& r : out) {
    if (r.second > r.first) pieces->push_back(r);
  }
}

std::string byte_level_encode(std::string_view text) {
  const auto& table = byte_to_unicode();
  std::string out;
  out.reserve(text.size() * 2);
  for (char c : text) out += table[static_cast<unsigned char>(c)];
  return out;
}

StatusOr<std::unique_ptr<PreTokenizer>> make_pre_tokenizer(const Json& j, std::string_view where) {
  using Ptr = std::unique_ptr<PreTokenizer>;
  if (j.is_null()) return Ptr();
  if (!j.is_object()) return invalid_argument("{} must be an object or null", where);
  STRATA_ASSIGN_OR_RETURN(std::string type, json_string(j, "type", where));
  if (type == "Sequence") {
    auto it = j.find("pretokenizers");
    if (it == j.end() || !it->is_array()) {
      return invalid_argument("{}.pretokenizers must be an array", where);
    }
    std::vector<Ptr> steps;
    for (size_t i = 0; i < it->size(); ++i) {
      STRATA_ASSIGN_OR_RETURN(
          Ptr step, make_pre_tokenizer((*it)[i], fmt::format("{}.pretokenizers[{}]", where, i)));
      if (step) steps.push_back(std::move(step));
    }
    return Ptr(new SequencePreTokenizer(std::move(steps)));
  }
  if (type == "Split") {
    STRATA_ASSIGN_OR_RETURN(Pattern pattern, json_pattern(j, where));
    STRATA_ASSIGN_OR_RETURN(std::string behavior_name, json_string(j, "behavior", where));
    STRATA_ASSIGN_OR_RETURN(SplitBehavior behavior, parse_behavior(behavior_name, where));
    STRATA_ASSIGN_OR_RETURN(bool invert, json_bool_or(j, "invert", false, where));
    return Ptr(new SplitPreTokenizer(std::move(pattern), behavior, invert));
  }
  if (type == "ByteLevel") {
    STRATA_ASSIGN_OR_RETURN(bool add_prefix_space,
                            json_bool_or(j, "add_prefix_space", true, where));
    STRATA_ASSIGN_OR_RETURN(bool use_regex, json_bool_or(j, "use_regex", true, where));
    std::unique_ptr<SplitPreTokenizer> split;
    if (use_regex) {
      STRATA_ASSIGN_OR_RETURN(split, make_regex_split(kGpt2Pattern, SplitBehavior::kIsolated));
    }
    return Ptr(new ByteLevelPreTokenizer(add_prefix_space, std::move(split)));
  }
  if (type == "Metaspace") return make_metaspace(j, where);
  if (type == "Digits") {
    STRATA_ASSIGN_OR_RETURN(bool individual, json_bool_or(j, "individual_digits", false, where));
    STRATA_ASSIGN_OR_RETURN(auto split, make_regex_split(individual ? R"(\p{N})" : R"(\p{N}+)",
                                                         SplitBehavior::kIsolated));
    return Ptr(split.release());
  }
  return unimplemented("{}: pre-tokenizer type '{}' is not supported", where, type);
}

}  // namespace strata::tok
