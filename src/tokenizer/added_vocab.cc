#include "tokenizer/added_vocab.h"

#include <algorithm>

#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace strata::tok {

namespace {

// Rust regex's \w (Unicode word character), used by single_word.
bool is_word_char(std::string_view ch) {
  static const Regex* re = [] {
    auto r = Regex::compile(R"([\w\p{M}\p{Pc}])");
    return r.ok() ? new Regex(std::move(r).value()) : nullptr;
  }();
  return re != nullptr && re->search(ch);
}

std::string_view last_char(std::string_view text) {
  if (text.empty()) return text;
  size_t start = text.size() - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  return text.substr(start);
}

std::string_view first_char(std::string_view text) {
  if (text.empty()) return text;
  const int n = utf8_scan(text, 0);
  return text.substr(0, size_t(n > 0 ? n : 1));
}

// Start of the run of whitespace that ends text (text.size() when none).
size_t trailing_space_start(std::string_view text) {
  size_t end = text.size();
  while (end > 0) {
    const std::string_view ch = last_char(text.substr(0, end));
    size_t p = 0;
    if (!is_unicode_whitespace(next_code_point(ch, &p))) break;
    end -= ch.size();
  }
  return end;
}

// Length of the run of whitespace that starts text.
size_t leading_space_len(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t p = pos;
    if (!is_unicode_whitespace(next_code_point(text, &p))) break;
    pos = p;
  }
  return pos;
}

}  // namespace

void AddedVocab::build(std::vector<AddedToken> tokens, const Normalizer* normalizer) {
  tokens_ = std::move(tokens);
  raw_ = Matcher();
  normalized_ = Matcher();
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const AddedToken& t = tokens_[i];
    if (t.content.empty()) continue;
    if (t.normalized) {
      std::string content = t.content;
      if (normalizer != nullptr) normalizer->normalize(&content);
      if (!content.empty()) normalized_.patterns.push_back({content, i});
    } else {
      raw_.patterns.push_back({t.content, i});
    }
  }
  index(&raw_);
  index(&normalized_);
}

void AddedVocab::index(Matcher* m) {
  for (uint32_t i = 0; i < m->patterns.size(); ++i) {
    m->by_first_byte[static_cast<unsigned char>(m->patterns[i].text[0])].push_back(i);
  }
  for (auto& list : m->by_first_byte) {
    std::stable_sort(list.begin(), list.end(), [&](uint32_t a, uint32_t b) {
      return m->patterns[a].text.size() > m->patterns[b].text.size();
    });
  }
}

const AddedVocab::Matcher::Entry* AddedVocab::match_at(const Matcher& m, std::string_view text,
                                                       size_t pos, bool allow_special) const {
  for (uint32_t idx : m.by_first_byte[static_cast<unsigned char>(text[pos])]) {
    const Matcher::Entry& e = m.patterns[idx];
    if (!allow_special && tokens_[e.token].special) continue;
    if (text.compare(pos, e.text.size(), e.text) == 0) return &e;
  }
  return nullptr;
}

void AddedVocab::split(std::string_view text, bool normalized_set, bool allow_special,
                       std::vector<TextSpan>* out) const {
  if (text.empty()) return;
  const Matcher& m = normalized_set ? normalized_ : raw_;
  size_t done = 0;  // end of the last emitted span
  size_t pos = 0;
  while (!m.patterns.empty() && pos < text.size()) {
    const Matcher::Entry* e = match_at(m, text, pos, allow_special);
    if (e == nullptr) {
      ++pos;
      continue;
    }
    const AddedToken& t = tokens_[e->token];
    size_t start = pos, stop = pos + e->text.size();
    pos = stop;
    if (t.single_word) {
      const bool space_before = start == 0 || !is_word_char(last_char(text.substr(0, start)));
      const bool space_after = stop == text.size() || !is_word_char(first_char(text.substr(stop)));
      if (!space_before || !space_after) continue;
    }
    if (t.lstrip) start = std::max(trailing_space_start(text.substr(0, start)), done);
    if (t.rstrip) stop += leading_space_len(text.substr(stop));
    if (done < start) out->push_back(TextSpan{done, start, -1});
    out->push_back(TextSpan{start, stop, t.id});
    done = stop;
    pos = stop;
  }
  if (done < text.size()) out->push_back(TextSpan{done, text.size(), -1});
}

const AddedToken* AddedVocab::by_id(int32_t id) const {
  for (const AddedToken& t : tokens_) {
    if (t.id == id) return &t;
  }
  return nullptr;
}

std::optional<int32_t> AddedVocab::id_of(std::string_view content) const {
  for (const AddedToken& t : tokens_) {
    if (t.content == content) return t.id;
  }
  return std::nullopt;
}

}  // namespace strata::tok
