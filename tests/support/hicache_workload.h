// Test support: a prefix-heavy workload for the host KV tier on the house models.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace strata::testing {

// Three shared prefixes of 48 held-out tokens; each request appends a short suffix of its own.
// Each prefix is asked three times in a row (write_through_selective backs up on the second
// hit), and the whole sequence twice: the second round finds its prefixes only on host.
inline std::vector<std::vector<int32_t>> hicache_workload(const Tokenizer& tok) {
  std::ifstream in(std::string(STRATA_SHARED_DIR) + "/data/heldout.jsonl");
  std::vector<std::vector<int32_t>> texts;
  std::string line;
  while (texts.size() < 6 && std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (!j.contains("text")) continue;
    auto ids = tok.encode(j["text"].get<std::string>());
    if (ids.size() >= 120) texts.push_back(std::move(ids));
  }
  EXPECT_EQ(texts.size(), 6u);
  std::vector<std::vector<int32_t>> prompts;
  for (int round = 0; round < 2; ++round)
    for (int k = 0; k < 3; ++k)
      for (int rep = 0; rep < 3; ++rep) {
        std::vector<int32_t> p(texts[size_t(k)].begin(), texts[size_t(k)].begin() + 48);
        const auto& tail = texts[size_t(3 + k)];
        const size_t from = size_t(10 * (round * 3 + rep)), len = 3 + size_t((round + rep + k) % 7);
        p.insert(p.end(), tail.begin() + std::ptrdiff_t(from),
                 tail.begin() + std::ptrdiff_t(from + len));
        prompts.push_back(std::move(p));
      }
  return prompts;
}

}  // namespace strata::testing
