// house-llama taught to say given texts: the last tokens of its vocabulary (ones no BPE merge
// builds on) are renamed to the texts, so a request that biases one of them (logit_bias +100)
// makes the real model, through the real engine and decoder, write that text once per token.
// This is how the e2e tests get tool calls out of a model that was never trained to make any;
// the weights are house-llama's own (linked, not copied).
#pragma once

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "server_process.h"

namespace strata::e2e {

struct ScriptedModel {
  std::string dir;
  std::vector<int32_t> ids;  // the token id saying texts[i]
};

// `texts`: printable ASCII without spaces (byte-level BPE writes those characters as themselves).
inline ScriptedModel make_scripted_model(const std::filesystem::path& dir,
                                         const std::vector<std::string>& texts) {
  namespace fs = std::filesystem;
  const fs::path src = house_llama();
  fs::create_directories(dir);
  std::stringstream ss;
  ss << std::ifstream(src / "tokenizer.json").rdbuf();
  nlohmann::ordered_json tok = nlohmann::ordered_json::parse(ss.str());
  auto& vocab = tok["model"]["vocab"];
  auto& merges = tok["model"]["merges"];
  std::set<std::string> merge_inputs;
  for (const auto& m : merges) {
    merge_inputs.insert(m[0].get<std::string>());
    merge_inputs.insert(m[1].get<std::string>());
  }
  std::vector<std::string> by_id(vocab.size());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) by_id[it.value().get<size_t>()] = it.key();
  ScriptedModel out;
  out.dir = dir.string();
  int32_t id = int32_t(by_id.size());
  for (const std::string& text : texts) {
    for (char c : text)
      if (c <= ' ' || c > '~') throw std::runtime_error("scripted text must be printable ASCII");
    do --id;
    while (merge_inputs.count(by_id[size_t(id)]));
    const std::string old = by_id[size_t(id)];
    vocab.erase(old);
    vocab[text] = id;
    // The merge that built the old token would now build a token the vocabulary lacks.
    nlohmann::ordered_json kept = nlohmann::ordered_json::array();
    for (const auto& m : merges)
      if (m[0].get<std::string>() + m[1].get<std::string>() != old) kept.push_back(m);
    merges = std::move(kept);
    out.ids.push_back(id);
  }
  std::ofstream(dir / "tokenizer.json") << tok.dump();
  for (const char* f :
       {"config.json", "generation_config.json", "tokenizer_config.json", "chat_template.jinja"})
    fs::copy_file(src / f, dir / f, fs::copy_options::overwrite_existing);
  fs::remove(dir / "model.safetensors");
  fs::create_symlink(src / "model.safetensors", dir / "model.safetensors");
  return out;
}

}  // namespace strata::e2e
