// Flag-value helpers shared by the CUDA benchmark programs.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

namespace strata {

// "16,32,64" -> {16, 32, 64} (std::stoi throws on a non-number, ending the benchmark).
inline std::vector<int> parse_int_list(const std::string& v) {
  std::vector<int> out;
  for (size_t at = 0; at < v.size();) {
    const size_t comma = std::min(v.find(',', at), v.size());
    out.push_back(std::stoi(v.substr(at, comma - at)));
    at = comma + 1;
  }
  return out;
}

}  // namespace strata
