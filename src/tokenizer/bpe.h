// The BPE model of tokenizer.json ("model": {"type": "BPE"}): vocabulary, ranked merges,
// byte_fallback, unk handling and a per-word result cache.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/json_util.h"

namespace strata::tok {

// Hash/equality that let unordered_map<std::string, V> be probed with a string_view.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// Immutable after from_json() except for the internal cache (sharded, mutex-guarded), so
// tokenize() may be called from many threads at once.
class BpeModel {
 public:
  // `j` is tokenizer.json's "model" object.
  static StatusOr<std::unique_ptr<BpeModel>> from_json(const Json& j, std::string_view where);

  // Appends the ids of one pre-tokenized word. Cost: O(n log n) in the word's characters on a
  // cache miss, a hash lookup on a hit.
  void tokenize(std::string_view word, std::vector<int32_t>* ids) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  // Empty string for ids outside the model vocabulary.
  const std::string& id_to_token(int32_t id) const;
  // One past the largest id in the model vocabulary.
  int32_t id_limit() const { return int32_t(id_to_token_.size()); }

 private:
  struct MergeInfo {
    int32_t rank;
    int32_t new_id;
  };
  struct CacheShard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> map;
  };
  static constexpr size_t kCacheShards = 16;
  static constexpr size_t kCacheEntriesPerShard = 8192;
  static constexpr size_t kMaxCachedWordBytes = 256;

  StatusOr<int32_t> lookup_merge_part(const std::string& part, std::string_view where) const;
  void merge_word(std::string_view word, std::vector<int32_t>* ids) const;
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
  }

  StringIdMap vocab_;
  std::vector<std::string> id_to_token_;  // [id_limit]; "" for holes
  std::unordered_map<uint64_t, MergeInfo> merges_;
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  std::array<int32_t, 256> byte_token_ids_{};  // id of "<0xNN>", -1 when absent
  mutable std::unique_ptr<CacheShard[]> cache_ = std::make_unique<CacheShard[]>(kCacheShards);
};

}  // namespace strata::tok
