// Test support for the generate e2e tests: a test's own input file holding the first prompts of
// a shared dataset (../shared/data/prompts-NAME.jsonl: ShareGPT conversations with an "id"), and
// the house model.
#pragma once

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace strata::testing_support {

inline std::string house_llama_path() {
  return std::string(STRATA_SHARED_DIR) + "/models/house-llama";
}

// Writes the first `n` records of prompts-`name`.jsonl ("define", "explain") to `path`, as they
// are; returns their ids in order.
inline std::vector<std::string> write_shared_prompts(const std::string& path,
                                                     const std::string& name, int n) {
  std::ifstream in(std::string(STRATA_SHARED_DIR) + "/data/prompts-" + name + ".jsonl");
  std::ofstream out(path);
  std::vector<std::string> ids;
  std::string line;
  for (int i = 0; i < n && std::getline(in, line); ++i) {
    out << line << "\n";
    ids.push_back(nlohmann::json::parse(line)["id"]);
  }
  return ids;
}

}  // namespace strata::testing_support
