// Fuzzes the house tokenizer (../shared/models/house-llama) on arbitrary bytes: encode with and
// without special tokens, decode of the result (valid UTF-8 text must round-trip), and decode
// plus streaming decode of the input read as arbitrary token ids.
#include <cstdint>
#include <cstring>
#include <string>

#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"

namespace {

const strata::Tokenizer& house() {
  static const strata::Tokenizer* tok = [] {
    auto r = strata::Tokenizer::load(strata::fuzz::shared_dir() + "/models/house-llama");
    if (!r.ok()) {
      fprintf(stderr, "tokenizer_encode_fuzz: %s\n", r.status().to_string().c_str());
      std::abort();
    }
    return new strata::Tokenizer(std::move(r).value());
  }();
  return *tok;
}

bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = s[i];
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : c & (0x7f >> n);
    for (size_t k = 1; k < n; ++k) {
      if ((uint8_t(s[i + k]) & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (uint8_t(s[i + k]) & 0x3f);
    }
    static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += n;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const strata::Tokenizer& tok = house();
  std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<int32_t> plain = tok.encode(text, /*allow_special=*/false);
  std::string back = tok.decode(plain);
  if (!valid_utf8(back)) __builtin_trap();  // decode() promises valid UTF-8
  // Byte-level BPE without a normalizer: valid UTF-8 comes back byte for byte.
  if (valid_utf8(text) && back != text) __builtin_trap();
  std::vector<int32_t> special = tok.encode(text, /*allow_special=*/true);
  if (tok.decode(special) != back && valid_utf8(text)) __builtin_trap();

  // The same bytes as token ids (any value, valid or not).
  std::vector<int32_t> ids(size / 4);
  if (!ids.empty()) std::memcpy(ids.data(), data, ids.size() * 4);
  for (bool skip : {false, true}) {
    std::string whole = tok.decode(ids, skip);
    if (!valid_utf8(whole)) __builtin_trap();
    strata::StreamDecoder stream(tok, skip);
    std::string streamed;
    for (int32_t id : ids) streamed += stream.push(id);
    streamed += stream.finish();
    if (streamed != whole) __builtin_trap();  // documented: pieces concatenate to decode()
  }
  return 0;
}
