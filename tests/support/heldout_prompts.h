// Test support: token-id prompts of mixed lengths (4 to 103 tokens) cut from the held-out corpus
// (../shared/data/heldout.jsonl), the same ones for every engine test that uses them.
#pragma once

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace strata::testing {

inline std::vector<std::vector<int32_t>> heldout_token_prompts(const Tokenizer& tok, int count) {
  std::ifstream in(std::string(STRATA_SHARED_DIR) + "/data/heldout.jsonl");
  std::vector<std::vector<int32_t>> out;
  std::string line;
  int i = 0;
  while (int(out.size()) < count && std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (!j.contains("text")) continue;
    auto ids = tok.encode(j["text"].get<std::string>());
    const size_t len = 4 + size_t(i++ * 37 % 100);
    if (ids.size() < len) continue;
    ids.resize(len);
    out.push_back(std::move(ids));
  }
  return out;
}

}  // namespace strata::testing
