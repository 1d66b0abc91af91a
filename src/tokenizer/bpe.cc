#include "tokenizer/bpe.h"

#include <fmt/format.h>

#include <queue>

#include "tokenizer/utf8.h"

namespace strata::tok {

namespace {

// "a b" (older files) or ["a", "b"].
StatusOr<std::pair<std::string, std::string>> parse_merge(const Json& m, size_t index,
                                                          std::string_view where) {
  if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
    return std::make_pair(m[0].get<std::string>(), m[1].get<std::string>());
  }
  if (m.is_string()) {
    const std::string& s = m.get_ref<const std::string&>();
    const size_t space = s.find(' ');
    if (space != std::string::npos && s.find(' ', space + 1) == std::string::npos) {
      return std::make_pair(s.substr(0, space), s.substr(space + 1));
    }
  }
  return invalid_argument("{}.merges[{}] must be \"a b\" or [\"a\", \"b\"], got {}", where, index,
                          m.dump());
}

}  // namespace

StatusOr<std::unique_ptr<BpeModel>> BpeModel::from_json(const Json& j, std::string_view where) {
  auto model = std::make_unique<BpeModel>();
  auto vocab_it = j.find("vocab");
  if (vocab_it == j.end() || !vocab_it->is_object()) {
    return invalid_argument("{}.vocab must be an object of token -> id", where);
  }
  int32_t max_id = -1;
  for (auto it = vocab_it->begin(); it != vocab_it->end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() > INT32_MAX) {
      return invalid_argument("{}.vocab['{}'] must be a non-negative integer id", where, it.key());
    }
    const auto id = int32_t(it.value().get<int64_t>());
    model->vocab_[it.key()] = id;
    max_id = std::max(max_id, id);
  }
  model->id_to_token_.assign(size_t(max_id + 1), std::string());
  for (const auto& [tok, id] : model->vocab_) model->id_to_token_[size_t(id)] = tok;

  STRATA_ASSIGN_OR_RETURN(model->byte_fallback_, json_bool_or(j, "byte_fallback", false, where));
  STRATA_ASSIGN_OR_RETURN(model->fuse_unk_, json_bool_or(j, "fuse_unk", false, where));
  STRATA_ASSIGN_OR_RETURN(model->ignore_merges_, json_bool_or(j, "ignore_merges", false, where));
  STRATA_ASSIGN_OR_RETURN(model->continuing_subword_prefix_,
                          json_string_or(j, "continuing_subword_prefix", "", where));
  STRATA_ASSIGN_OR_RETURN(model->end_of_word_suffix_,
                          json_string_or(j, "end_of_word_suffix", "", where));
  STRATA_ASSIGN_OR_RETURN(std::string unk, json_string_or(j, "unk_token", "", where));
  if (!unk.empty()) {
    auto id = model->token_to_id(unk);
    if (!id) return invalid_argument("{}.unk_token '{}' is not in the vocabulary", where, unk);
    model->unk_id_ = *id;
  }
  for (int b = 0; b < 256; ++b) {
    auto id = model->token_to_id(fmt::format("<0x{:02X}>", b));
    model->byte_token_ids_[size_t(b)] = id ? *id : -1;
  }

  auto merges_it = j.find("merges");
  if (merges_it != j.end() && !merges_it->is_null()) {
    if (!merges_it->is_array()) return invalid_argument("{}.merges must be an array", where);
    const size_t prefix_len = model->continuing_subword_prefix_.size();
    model->merges_.reserve(merges_it->size());
    for (size_t i = 0; i < merges_it->size(); ++i) {
      STRATA_ASSIGN_OR_RETURN(auto parts, parse_merge((*merges_it)[i], i, where));
      STRATA_ASSIGN_OR_RETURN(int32_t a, model->lookup_merge_part(parts.first, where));
      STRATA_ASSIGN_OR_RETURN(int32_t b, model->lookup_merge_part(parts.second, where));
      std::string merged = parts.first;
      merged +=
          std::string_view(parts.second)
              .substr(parts.second.starts_with(model->continuing_subword_prefix_) ? prefix_len : 0);
      STRATA_ASSIGN_OR_RETURN(int32_t new_id, model->lookup_merge_part(merged, where));
      // A repeated pair keeps its last rank, as in Hugging Face (HashMap collect).
      model->merges_[pair_key(a, b)] = MergeInfo{int32_t(i), new_id};
    }
  }
  return model;
}

StatusOr<int32_t> BpeModel::lookup_merge_part(const std::string& part,
                                              std::string_view where) const {
  auto id = token_to_id(part);
  if (!id) return invalid_argument("{}.merges: token '{}' is not in the vocabulary", where, part);
  return *id;
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string& BpeModel::id_to_token(int32_t id) const {
  static const std::string kEmpty;
  return id >= 0 && id < id_limit() ? id_to_token_[size_t(id)] : kEmpty;
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return;
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  CacheShard* shard = nullptr;
  if (cacheable) {
    shard = &cache_[std::hash<std::string_view>{}(word) % kCacheShards];
    std::lock_guard<std::mutex> lock(shard->mu);
    auto it = shard->map.find(word);
    if (it != shard->map.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = ids->size();
  if (auto id = ignore_merges_ ? token_to_id(word) : std::nullopt) {
    ids->push_back(*id);
  } else {
    merge_word(word, ids);
  }
  if (cacheable) {
    std::lock_guard<std::mutex> lock(shard->mu);
    // Crude bound: a full shard starts over (the working set of a batch refills it quickly).
    if (shard->map.size() >= kCacheEntriesPerShard) shard->map.clear();
    shard->map.emplace(std::string(word), std::vector<int32_t>(ids->begin() + first, ids->end()));
  }
}

// Hugging Face's BPE::merge_word + Word::merge_all: characters (or their byte fallbacks, or unk)
// become symbols; the lowest-ranked adjacent pair merges first, ties going to the leftmost.
void BpeModel::merge_word(std::string_view word, std::vector<int32_t>* ids) const {
  struct Symbol {
    int32_t id;
    int32_t prev, next;  // indices into symbols, -1 at the ends
    bool alive;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  auto add = [&](int32_t id) {
    const auto n = int32_t(symbols.size());
    symbols.push_back(Symbol{id, n - 1, n + 1, true});
  };
  int32_t pending_unk = -1;  // unk id waiting to be added (fused runs)
  std::string scratch;
  for (size_t pos = 0; pos < word.size();) {
    const size_t start = pos;
    const int n = utf8_scan(word, pos);
    pos += size_t(n > 0 ? n : -n);
    std::string_view ch = word.substr(start, pos - start);
    if (!continuing_subword_prefix_.empty() || !end_of_word_suffix_.empty()) {
      scratch.assign(start > 0 ? continuing_subword_prefix_ : "");
      scratch += ch;
      if (pos == word.size()) scratch += end_of_word_suffix_;
      ch = scratch;
    }
    if (auto id = token_to_id(ch)) {
      if (pending_unk >= 0) add(pending_unk), pending_unk = -1;
      add(*id);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (char c : ch) all = all && byte_token_ids_[static_cast<unsigned char>(c)] >= 0;
      if (all) {
        if (pending_unk >= 0) add(pending_unk), pending_unk = -1;
        for (char c : ch) add(byte_token_ids_[static_cast<unsigned char>(c)]);
        continue;
      }
    }
    if (unk_id_) {
      if (pending_unk >= 0 && !fuse_unk_) add(pending_unk);
      pending_unk = *unk_id_;
    }
    // No unk token: the character is dropped, as Hugging Face does.
  }
  if (pending_unk >= 0) add(pending_unk);
  if (symbols.empty()) return;
  symbols.back().next = -1;

  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t new_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto push_pair = [&](int32_t left) {
    const int32_t right = symbols[size_t(left)].next;
    if (right < 0) return;
    auto it = merges_.find(pair_key(symbols[size_t(left)].id, symbols[size_t(right)].id));
    if (it != merges_.end()) queue.push(Candidate{it->second.rank, left, it->second.new_id});
  };
  for (int32_t i = 0; i + 1 < int32_t(symbols.size()); ++i) push_pair(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[size_t(top.pos)];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[size_t(left.next)];
    auto it = merges_.find(pair_key(left.id, right.id));
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;  // stale entry
    left.id = top.new_id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[size_t(right.next)].prev = top.pos;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(top.pos);
  }
  for (const Symbol& s : symbols) {
    if (s.alive) ids->push_back(s.id);
  }
}

}  // namespace strata::tok
