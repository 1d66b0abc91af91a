// Test support: the chat prompts the committed EAGLE-3 drafter never saw (tools/
// make_house_drafter.sh trained it on the first lines of prompts-define.jsonl and
// prompts-explain.jsonl): the last 100 of prompts-define.jsonl and the last 50 of
// prompts-explain.jsonl, interleaved (define, explain, define, ...; the remaining 50 define
// prompts last), each rendered with house-llama's chat template and tokenized. The GPU check
// (bench/cuda/spec_check.sh STAGE=eagle3) orders them the same way.
#pragma once

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/check.h"
#include "tokenizer/prompt_encoder.h"

namespace strata::testing {

inline std::vector<std::string> last_lines(const std::string& path, size_t n) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(line);
  if (lines.size() > n) lines.erase(lines.begin(), lines.end() - long(n));
  return lines;
}

// Up to `count` of the 150 held-out prompts, in the order above.
inline std::vector<std::vector<int32_t>> eagle3_heldout_prompts(const Tokenizer& tok,
                                                                const std::string& model_dir,
                                                                int count) {
  const std::string data = std::string(STRATA_SHARED_DIR) + "/data/";
  const auto define = last_lines(data + "prompts-define.jsonl", 100);
  const auto explain = last_lines(data + "prompts-explain.jsonl", 50);
  std::vector<std::string> mixed;
  for (size_t i = 0; i < explain.size() && i < define.size(); ++i) {
    mixed.push_back(define[i]);
    mixed.push_back(explain[i]);
  }
  for (size_t i = explain.size(); i < define.size(); ++i) mixed.push_back(define[i]);
  auto encoder = PromptEncoder::load(model_dir, tok);
  CHECK_MSG(encoder.ok(), "{}", encoder.status().to_string());
  std::vector<std::vector<int32_t>> out;
  for (const std::string& line : mixed) {
    if (int(out.size()) >= count) break;
    const auto j = nlohmann::json::parse(line);
    auto ids = encoder->encode_chat(j["conversations"]);
    CHECK_MSG(ids.ok(), "{}", ids.status().to_string());
    out.push_back(std::move(ids).value());
  }
  return out;
}

}  // namespace strata::testing
