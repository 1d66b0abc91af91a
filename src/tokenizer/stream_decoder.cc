#include <algorithm>

#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace strata {

namespace {

bool ends_with_replacement(const std::string& s) { return s.ends_with(tok::kReplacementChar); }

}  // namespace

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special,
                             std::vector<int32_t> keep_special)
    : tokenizer_(&tokenizer), skip_special_(skip_special), keep_special_(std::move(keep_special)) {}

// Hugging Face's DecodeStream::step, with an anchor: decode the window [anchor ids + context ids +
// pending ids]; when it grew past the decode of [anchor + context] and does not end in U+FFFD (an
// unfinished character), emit the growth and slide the window so that the just-emitted ids become
// the next context.
//
// The anchor is the shortest prefix of the stream whose text is non-empty and complete; it stays
// at the front of every window. Decoders that treat the start of the text specially (a Strip of
// up to N leading spaces after Fuse, Metaspace's first-token space) then see the same start in
// every window as in the full decode; without it a window starting with a lone "▁" lost spaces
// that decode() keeps (found by fuzz/tokenizer_load_fuzz). A non-empty anchor text confines such
// a strip to the anchor, since a strip that removed all of it would have left it empty.
std::string StreamDecoder::push(int32_t id) {
  ids_.push_back(id);
  // ByteFallback turns a whole invalid run into U+FFFDs, so a byte can change the text of the
  // bytes before it (" " then " \xF0" decodes to two U+FFFD): wait for the run to end.
  // A skipped special or unknown id adds no token, so a run around it stays open.
  if (tokenizer_->is_byte_fallback_piece(id) || id < 0 || id >= tokenizer_->vocab_size() ||
      (skip_special_ && tokenizer_->is_special(id) &&
       std::find(keep_special_.begin(), keep_special_.end(), id) == keep_special_.end())) {
    return {};
  }
  std::string text = tokenizer_->decode(ids_, skip_special_, keep_special_);
  if (text.size() <= prefix_.size() || ends_with_replacement(text) || !text.starts_with(prefix_)) {
    return {};
  }
  std::string out = text.substr(prefix_.size());
  if (anchor_len_ == 0) {  // the first text of the stream: its ids become the anchor
    anchor_len_ = ids_.size();
    context_end_ = ids_.size();
    prefix_ = std::move(text);
    return out;
  }
  ids_.erase(ids_.begin() + std::ptrdiff_t(anchor_len_),
             ids_.begin() + std::ptrdiff_t(context_end_));
  context_end_ = ids_.size();
  prefix_ = tokenizer_->decode(ids_, skip_special_, keep_special_);
  return out;
}

std::string StreamDecoder::finish() {
  std::string text = tokenizer_->decode(ids_, skip_special_, keep_special_);
  std::string out;
  if (text.size() > prefix_.size() && text.starts_with(prefix_)) out = text.substr(prefix_.size());
  ids_.clear();
  prefix_.clear();
  anchor_len_ = 0;
  context_end_ = 0;
  return out;
}

}  // namespace strata
