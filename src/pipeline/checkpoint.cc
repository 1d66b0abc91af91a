#include "pipeline/checkpoint.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "pipeline/output_log.h"

namespace strata {

std::string settings_fingerprint(const std::string& settings_json) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a 64
  for (unsigned char c : settings_json) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return fmt::format("{:016x}", h);
}

std::string partial_line(const PartialKey& key, int64_t from, std::span<const int32_t> tokens,
                         uint64_t rng_draws, int32_t prompt_tokens, const std::string& settings,
                         const KvMark& kv) {
  nlohmann::json j = {
      {"dataset", key.first}, {"id", key.second},
      {"from", from},         {"tokens", std::vector<int32_t>(tokens.begin(), tokens.end())},
      {"draws", rng_draws},   {"prompt_tokens", prompt_tokens},
      {"settings", settings}};
  if (kv.rows > 0) {
    j["kv_rows"] = kv.rows;
    j["kv_tokens"] = kv.tokens;
    j["kv_draws"] = kv.draws;
  }
  return j.dump();
}

StatusOr<std::map<PartialKey, PartialOutput>> read_partials(const std::string& path,
                                                            const std::string& settings) {
  std::map<PartialKey, PartialOutput> out;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return out;
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("cannot read checkpoint file '{}'", path);
  std::string line;
  while (std::getline(in, line)) {
    if (in.eof()) break;  // torn tail
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || j.value("settings", std::string()) != settings) continue;
    const auto& jd = j["dataset"];
    const auto& jid = j["id"];
    const auto& jt = j["tokens"];
    if (!jd.is_string() || !jid.is_string() || !jt.is_array() || !j["from"].is_number_integer())
      continue;
    const PartialKey key{jd.get<std::string>(), jid.get<std::string>()};
    const int64_t from = j["from"].get<int64_t>();
    auto it = out.find(key);
    if (it == out.end()) {
      if (from != 0) continue;  // its first line was lost: nothing to continue from
      it = out.emplace(key, PartialOutput{}).first;
    }
    PartialOutput& p = it->second;
    if (from > int64_t(p.tokens.size())) {  // a gap: drop this record's partial
      out.erase(it);
      continue;
    }
    p.tokens.resize(size_t(from));
    for (const auto& t : jt) p.tokens.push_back(t.get<int32_t>());
    p.rng_draws = j.value("draws", uint64_t(0));
    p.prompt_tokens = j.value("prompt_tokens", 0);
    // Each line states the mark; a usable one names output tokens this record has.
    p.kv = KvMark{.rows = j.value("kv_rows", int64_t(0)),
                  .tokens = j.value("kv_tokens", int64_t(0)),
                  .draws = j.value("kv_draws", uint64_t(0))};
    if (p.kv.rows <= 0 || p.kv.tokens < 1 || p.kv.tokens > int64_t(p.tokens.size()) ||
        p.kv.rows != p.prompt_tokens + p.kv.tokens - 1)
      p.kv = KvMark{};
  }
  return out;
}

Status rewrite_partials(const std::string& path,
                        const std::map<PartialKey, PartialOutput>& partials,
                        const std::string& settings) {
  if (partials.empty()) {
    std::error_code ec;
    std::filesystem::remove(path, ec);
    return Status();
  }
  std::string text;
  for (const auto& [key, p] : partials)
    text += partial_line(key, 0, p.tokens, p.rng_draws, p.prompt_tokens, settings, p.kv) + "\n";
  return write_file_atomic(path, text);
}

}  // namespace strata
