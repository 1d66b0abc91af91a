// Test support: writing a tiktoken vocabulary file (tiktoken.model: "base64(token bytes) rank"
// lines, ranks in order), as Kimi K2 / Moonlight checkpoints ship theirs.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace strata::testing {

// Standard base64 with padding, as tiktoken's files write tokens.
inline std::string base64(const std::string& bytes) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t n = uint32_t(uint8_t(bytes[i])) << 16;
    if (i + 1 < bytes.size()) n |= uint32_t(uint8_t(bytes[i + 1])) << 8;
    if (i + 2 < bytes.size()) n |= uint8_t(bytes[i + 2]);
    out += kAlphabet[n >> 18];
    out += kAlphabet[(n >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(n >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? kAlphabet[n & 63] : '=';
  }
  return out;
}

// Writes `tokens` (raw bytes each) to `path` with ranks 0, 1, ... in order, then `extra` as is.
inline void write_tiktoken_model(const std::string& path, const std::vector<std::string>& tokens,
                                 const std::string& extra = "") {
  std::ofstream out(path, std::ios::binary);
  for (size_t rank = 0; rank < tokens.size(); ++rank)
    out << base64(tokens[rank]) << " " << rank << "\n";
  out << extra;
}

}  // namespace strata::testing
