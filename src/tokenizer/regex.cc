#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/log.h"
#include "tokenizer/utf8.h"

namespace strata::tok {

struct Regex::Code {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Code() { pcre2_code_free(code); }
};

namespace {

// Per-thread scratch: match data and a JIT stack big enough for long whitespace runs
// (the default 32 KiB machine stack overflows on `\s+(?!\S)` over a few thousand spaces).
struct MatchScratch {
  pcre2_match_data* data = pcre2_match_data_create(16, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* jit_stack = pcre2_jit_stack_create(64 * 1024, 16 * 1024 * 1024, nullptr);
  MatchScratch() { pcre2_jit_stack_assign(context, nullptr, jit_stack); }
  ~MatchScratch() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

MatchScratch& scratch() {
  thread_local MatchScratch s;
  return s;
}

// Runs one match from `offset`; returns false on no match (or on a resource error, logged).
bool match_from(pcre2_code* code, std::string_view text, size_t offset, ByteRange* range) {
  MatchScratch& s = scratch();
  const int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), offset,
                             PCRE2_NO_UTF_CHECK, s.data, s.context);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(rc, buf, sizeof(buf));
    LOG_WARN("tokenizer regex match failed at byte {} of {}: {}", offset, text.size(),
             reinterpret_cast<const char*>(buf));
    return false;
  }
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(s.data);
  *range = {ov[0], ov[1]};
  return true;
}

}  // namespace

StatusOr<Regex> Regex::compile(std::string_view pattern) {
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &err, &err_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(err, buf, sizeof(buf));
    return invalid_argument("regex '{}' does not compile at offset {}: {}", pattern, err_offset,
                            reinterpret_cast<const char*>(buf));
  }
  auto c = std::make_shared<Code>();
  c->code = code;
  c->jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  Regex r;
  r.code_ = std::move(c);
  r.pattern_ = std::string(pattern);
  return r;
}

void Regex::find_all(std::string_view text, std::vector<ByteRange>* out) const {
  size_t offset = 0;
  ByteRange m;
  while (offset <= text.size() && match_from(code_->code, text, offset, &m)) {
    if (m.second > m.first) {
      out->push_back(m);
      offset = m.second;
    } else {  // empty match: step over one character
      if (m.first >= text.size()) break;
      const int n = utf8_scan(text, m.first);
      offset = m.first + size_t(n > 0 ? n : 1);
    }
  }
}

bool Regex::search(std::string_view text) const {
  ByteRange m;
  return match_from(code_->code, text, 0, &m);
}

}  // namespace strata::tok

namespace strata::tok {

Pattern Pattern::literal(std::string text) {
  Pattern p;
  p.literal_ = std::move(text);
  return p;
}

StatusOr<Pattern> Pattern::regex(std::string_view pattern) {
  STRATA_ASSIGN_OR_RETURN(Regex re, Regex::compile(pattern));
  Pattern p;
  p.is_regex_ = true;
  p.regex_ = std::move(re);
  return p;
}

void Pattern::find_all(std::string_view text, std::vector<ByteRange>* out) const {
  if (is_regex_) {
    regex_.find_all(text, out);
    return;
  }
  if (literal_.empty()) return;
  for (size_t pos = text.find(literal_); pos != std::string_view::npos;
       pos = text.find(literal_, pos + literal_.size())) {
    out->push_back({pos, pos + literal_.size()});
  }
}

}  // namespace strata::tok
