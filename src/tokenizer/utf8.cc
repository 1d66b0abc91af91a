#include "tokenizer/utf8.h"

#include <vector>

namespace strata::tok {

int utf8_scan(std::string_view text, size_t pos) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data()) + pos;
  const size_t avail = text.size() - pos;
  const unsigned char b0 = p[0];
  if (b0 < 0x80) return 1;
  int need = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 == 0xE0) {
    need = 2, lo = 0xA0;
  } else if ((b0 >= 0xE1 && b0 <= 0xEC) || b0 == 0xEE || b0 == 0xEF) {
    need = 2;
  } else if (b0 == 0xED) {
    need = 2, hi = 0x9F;  // no surrogates
  } else if (b0 == 0xF0) {
    need = 3, lo = 0x90;
  } else if (b0 >= 0xF1 && b0 <= 0xF3) {
    need = 3;
  } else if (b0 == 0xF4) {
    need = 3, hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return -1;
  }
  for (int k = 1; k <= need; ++k) {
    if (size_t(k) >= avail) return -k;
    const unsigned char c = p[k];
    const bool ok = k == 1 ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xBF);
    if (!ok) return -k;
  }
  return need + 1;
}

bool is_valid_utf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    if (static_cast<unsigned char>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    const int n = utf8_scan(text, i);
    if (n < 0) return false;
    i += size_t(n);
  }
  return true;
}

std::string to_valid_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const int n = utf8_scan(text, i);
    if (n > 0) {
      out.append(text.substr(i, size_t(n)));
      i += size_t(n);
    } else {
      out.append(kReplacementChar);
      i += size_t(-n);
    }
  }
  return out;
}

size_t utf8_complete_prefix_len(std::string_view text) {
  // A sequence can only be incomplete within its last 3 bytes.
  const size_t start = text.size() > 3 ? text.size() - 3 : 0;
  for (size_t i = start; i < text.size(); ++i) {
    const auto b = static_cast<unsigned char>(text[i]);
    if (b < 0x80 || b > 0xBF) {  // a lead byte (or ASCII)
      const int n = utf8_scan(text, i);
      if (n < 0 && i + size_t(-n) == text.size()) return i;  // truncated at the end
    }
  }
  return text.size();
}

char32_t next_code_point(std::string_view text, size_t* pos) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data()) + *pos;
  char32_t cp;
  if (p[0] < 0x80) {
    cp = p[0];
    *pos += 1;
  } else if (p[0] < 0xE0) {
    cp = (char32_t(p[0] & 0x1F) << 6) | (p[1] & 0x3F);
    *pos += 2;
  } else if (p[0] < 0xF0) {
    cp = (char32_t(p[0] & 0x0F) << 12) | (char32_t(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
    *pos += 3;
  } else {
    cp = (char32_t(p[0] & 0x07) << 18) | (char32_t(p[1] & 0x3F) << 12) |
         (char32_t(p[2] & 0x3F) << 6) | (p[3] & 0x3F);
    *pos += 4;
  }
  return cp;
}

void append_utf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(char(cp));
  } else if (cp < 0x800) {
    out->push_back(char(0xC0 | (cp >> 6)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(char(0xE0 | (cp >> 12)));
    out->push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(char(0xF0 | (cp >> 18)));
    out->push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  }
}

bool is_unicode_whitespace(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

namespace {

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes map to themselves, the other 68 bytes to
// U+0100.. in byte order.
struct ByteAlphabet {
  std::array<std::string, 256> to_unicode;
  std::vector<int> to_byte;  // indexed by code point, -1 when unused
  ByteAlphabet() : to_byte(0x144, -1) {
    auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const char32_t cp = printable(b) ? char32_t(b) : next++;
      append_utf8(cp, &to_unicode[size_t(b)]);
      to_byte[cp] = b;
    }
  }
};

const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}

}  // namespace

const std::array<std::string, 256>& byte_to_unicode() { return alphabet().to_unicode; }

int unicode_to_byte(char32_t cp) {
  const auto& t = alphabet().to_byte;
  return cp < t.size() ? t[cp] : -1;
}

}  // namespace strata::tok
