#include "tokenizer/tiktoken_model.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "tokenizer/utf8.h"

namespace strata {

const char* const kKimiPatternTiktoken =
    R"([\p{Han}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*)"
    R"([\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+)"
    R"([\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

const char* const kKimiPatternPcre2 =
    R"([\p{Han}]+|[^\r\n\p{L}\p{N}]?(?:(?!\p{Han})[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])*)"
    R"((?:(?!\p{Han})[\p{Ll}\p{Lm}\p{Lo}\p{M}])+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"([^\r\n\p{L}\p{N}]?(?:(?!\p{Han})[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])+)"
    R"((?:(?!\p{Han})[\p{Ll}\p{Lm}\p{Lo}\p{M}])*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kKimiReservedSpecialTokens = 256;  // tokenization_kimi.py

// A family of tiktoken tokenizers: how tokenizer_config.json names it, and its pattern.
struct TiktokenFamily {
  const char* name;
  const char* marker;  // found in tokenizer_config.json's auto_map
  const char* pattern;
  int reserved_special_tokens;
};
const std::array<TiktokenFamily, 1> kFamilies = {{
    {"Kimi (tokenization_kimi.TikTokenTokenizer: Kimi K2, K2.5, Moonlight)", "tokenization_kimi",
     kKimiPatternPcre2, kKimiReservedSpecialTokens},
}};

StatusOr<std::string> read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("cannot read {}", path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Standard base64 (tiktoken's files use it, with padding); nullopt on anything else.
std::optional<std::string> base64_decode(std::string_view s) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  if (s.empty() || s.size() % 4 != 0) return std::nullopt;
  std::string out;
  for (size_t i = 0; i < s.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = s[i + size_t(k)];
      if (c == '=' && i + 4 == s.size() && k >= 2) {
        v[k] = 0;
        ++pad;
      } else if (pad > 0 || (v[k] = value(c)) < 0) {
        return std::nullopt;
      }
    }
    const uint32_t n = uint32_t(v[0]) << 18 | uint32_t(v[1]) << 12 | uint32_t(v[2]) << 6 | v[3];
    out += char(n >> 16);
    if (pad < 2) out += char((n >> 8) & 0xff);
    if (pad < 1) out += char(n & 0xff);
  }
  return out;
}

// The token's bytes in the GPT-2 byte-level alphabet (tokenizer.json's vocabulary strings).
std::string byte_level(std::string_view bytes) {
  std::string out;
  for (unsigned char b : bytes) out += tok::byte_to_unicode()[b];
  return out;
}

std::string json_string(const std::string& s) { return json(s).dump(); }

}  // namespace

bool has_tiktoken_model(const std::string& model_dir) {
  std::error_code ec;
  return fs::exists(fs::path(model_dir) / "tiktoken.model", ec) &&
         !fs::exists(fs::path(model_dir) / "tokenizer.json", ec);
}

StatusOr<std::string> tiktoken_tokenizer_json(const std::string& model_dir) {
  const fs::path dir(model_dir), model_path = dir / "tiktoken.model";
  const fs::path config_path = dir / "tokenizer_config.json";
  STRATA_ASSIGN_OR_RETURN(std::string config_text, read_text(config_path));
  json config = json::parse(config_text, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object()) return invalid_argument("{}: not a JSON object", config_path.string());
  const std::string auto_map = config.value("auto_map", json()).dump();
  const TiktokenFamily* family = nullptr;
  std::string known;
  for (const TiktokenFamily& f : kFamilies) {
    if (auto_map.find(f.marker) != std::string::npos) family = &f;
    known += (known.empty() ? "" : "; ") + std::string(f.name);
  }
  if (family == nullptr)
    return invalid_argument(
        "{}: a tiktoken vocabulary of a tokenizer whose pre-tokenization strata does not know "
        "(auto_map {}); known: {}",
        model_dir, auto_map, known);

  // The vocabulary: ranks 0..n-1, each once.
  STRATA_ASSIGN_OR_RETURN(std::string text, read_text(model_path));
  std::vector<std::string> by_rank;
  std::unordered_map<std::string, int32_t> rank_of;
  // Ranks run 0..n-1, so none reaches the line count (a huge rank must not size the table).
  const int64_t max_lines = int64_t(std::count(text.begin(), text.end(), '\n')) + 1;
  std::istringstream lines(text);
  std::string line;
  for (int64_t n = 1; std::getline(lines, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    std::optional<std::string> bytes =
        space == std::string::npos ? std::nullopt : base64_decode(line.substr(0, space));
    int64_t rank = -1;
    if (bytes) {
      try {
        size_t used = 0;
        rank = std::stoll(line.substr(space + 1), &used);
        if (used != line.size() - space - 1) rank = -1;
      } catch (const std::exception&) {
        rank = -1;
      }
    }
    if (!bytes || rank < 0)
      return invalid_argument("{} line {}: expected \"BASE64 RANK\"", model_path.string(), n);
    if (rank >= max_lines)
      return invalid_argument("{} line {}: rank {} beyond the file's {} lines", model_path.string(),
                              n, rank, max_lines);
    if (size_t(rank) >= by_rank.size()) by_rank.resize(size_t(rank) + 1);
    if (!by_rank[size_t(rank)].empty() || !rank_of.emplace(*bytes, int32_t(rank)).second)
      return invalid_argument("{} line {}: rank {} or its token given twice", model_path.string(),
                              n, rank);
    by_rank[size_t(rank)] = std::move(*bytes);
  }
  for (size_t r = 0; r < by_rank.size(); ++r)
    if (by_rank[r].empty())
      return invalid_argument("{}: no token has rank {} (ranks must run 0..{})",
                              model_path.string(), r, by_rank.size() - 1);

  // Every split of a token into two tokens, by the token's rank, then the parts' ranks.
  struct Merge {
    int32_t result, left, right;
  };
  std::vector<Merge> merges;
  for (size_t r = 0; r < by_rank.size(); ++r) {
    const std::string& t = by_rank[r];
    for (size_t k = 1; k < t.size(); ++k) {
      auto l = rank_of.find(t.substr(0, k));
      if (l == rank_of.end()) continue;
      auto rr = rank_of.find(t.substr(k));
      if (rr == rank_of.end()) continue;
      merges.push_back({int32_t(r), l->second, rr->second});
    }
  }
  std::sort(merges.begin(), merges.end(), [](const Merge& a, const Merge& b) {
    return std::tie(a.result, a.left, a.right) < std::tie(b.result, b.left, b.right);
  });

  // The special tokens after the vocabulary.
  const int32_t base = int32_t(by_rank.size());
  json names = config.value("added_tokens_decoder", json::object());
  std::string added;
  for (int32_t id = base; id < base + family->reserved_special_tokens; ++id) {
    std::string content = "<|reserved_token_" + std::to_string(id) + "|>";
    if (auto it = names.find(std::to_string(id));
        it != names.end() && it->is_object() && it->value("content", json()).is_string())
      content = (*it)["content"].get<std::string>();
    added += (added.empty() ? "" : ",") + std::string("{\"id\":") + std::to_string(id) +
             ",\"content\":" + json_string(content) +
             ",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,"
             "\"special\":true}";
  }

  // Written as text: the merges of a 160k vocabulary would take hundreds of MB as a json tree.
  std::string out = R"({"version":"1.0","truncation":null,"padding":null,"added_tokens":[)";
  out += added;
  out += R"(],"normalizer":null,"pre_tokenizer":{"type":"Sequence","pretokenizers":[)";
  out += R"({"type":"Split","pattern":{"Regex":)" + json_string(family->pattern) +
         R"(},"behavior":"Isolated","invert":false},)";
  out +=
      R"({"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":false}]},)";
  out += R"("post_processor":null,"decoder":{"type":"ByteLevel","add_prefix_space":true,)";
  out += R"("trim_offsets":true,"use_regex":true},"model":{"type":"BPE","dropout":null,)";
  out += R"("unk_token":null,"continuing_subword_prefix":null,"end_of_word_suffix":null,)";
  out += R"("fuse_unk":false,"byte_fallback":false,"ignore_merges":false,"vocab":{)";
  std::vector<std::string> level(by_rank.size());
  for (size_t r = 0; r < by_rank.size(); ++r) {
    level[r] = json_string(byte_level(by_rank[r]));
    out += (r ? "," : "") + level[r] + ":" + std::to_string(r);
  }
  out += R"(},"merges":[)";
  for (size_t i = 0; i < merges.size(); ++i)
    out += (i ? ",[" : "[") + level[size_t(merges[i].left)] + "," + level[size_t(merges[i].right)] +
           "]";
  out += "]}}";
  return out;
}

}  // namespace strata
