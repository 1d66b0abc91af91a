#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace strata {

namespace {

bool ends_with_replacement(const std::string& s) { return s.ends_with(tok::kReplacementChar); }

}  // namespace

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(&tokenizer), skip_special_(skip_special) {}

// Hugging Face's DecodeStream::step: decode the window [context ids + pending ids]; when it
// grew past the context's text and does not end in U+FFFD (an unfinished character), emit the
// growth and slide the window so that the just-emitted ids become the next context.
std::string StreamDecoder::push(int32_t id) {
  if (prefix_.empty() && !ids_.empty()) {
    std::string p = tokenizer_->decode(ids_, skip_special_);
    if (!ends_with_replacement(p)) {
      prefix_ = std::move(p);
      prefix_index_ = ids_.size();
    }
  }
  ids_.push_back(id);
  std::string text = tokenizer_->decode(ids_, skip_special_);
  if (text.size() <= prefix_.size() || ends_with_replacement(text) || !text.starts_with(prefix_)) {
    return {};
  }
  std::string out = text.substr(prefix_.size());
  const size_t new_prefix_index = ids_.size() - prefix_index_;
  ids_.erase(ids_.begin(), ids_.begin() + std::ptrdiff_t(prefix_index_));
  prefix_ = tokenizer_->decode(ids_, skip_special_);
  prefix_index_ = new_prefix_index;
  return out;
}

std::string StreamDecoder::finish() {
  std::string text = tokenizer_->decode(ids_, skip_special_);
  std::string out;
  if (text.size() > prefix_.size() && text.starts_with(prefix_)) out = text.substr(prefix_.size());
  ids_.clear();
  prefix_.clear();
  prefix_index_ = 0;
  return out;
}

}  // namespace strata
