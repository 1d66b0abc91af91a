#include "kv/radix_cache.h"

#include <algorithm>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "core/check.h"

namespace strata {
namespace {

// Children are keyed by a hash of their first page of tokens; equal hashes are told apart by
// comparing the tokens (a multimap), so a collision costs time, never correctness.
uint64_t hash_page(std::span<const int32_t> page) {
  uint64_t h = 0x9e3779b97f4a7c15ULL ^ page.size();
  for (int32_t t : page) {
    h ^= static_cast<uint32_t>(t);
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 32;
  }
  return h;
}

}  // namespace

struct RadixNode {
  RadixNode* parent = nullptr;
  std::unordered_multimap<uint64_t, std::unique_ptr<RadixNode>> children;
  std::vector<int32_t> key;   // [pages.size() * page_size] tokens of this edge
  std::vector<PageId> pages;  // [key.size() / page_size]
  int32_t lock_ref = 0;       // locks at this node or below
  int32_t direct_locks = 0;   // locks taken at exactly this node
  int32_t end_tokens = 0;     // tokens from the root to the end of this node
  uint64_t last_access = 0;
};

RadixCache::RadixCache(PagePool* pool)
    : pool_(pool), page_size_(pool->page_size()), root_(std::make_unique<RadixNode>()) {}

RadixCache::~RadixCache() = default;

RadixNode* RadixCache::find_child(const RadixNode* node, std::span<const int32_t> tokens) const {
  if (tokens.size() < static_cast<size_t>(page_size_)) return nullptr;
  auto first = tokens.first(page_size_);
  auto [lo, hi] = node->children.equal_range(hash_page(first));
  for (auto it = lo; it != hi; ++it) {
    const auto& k = it->second->key;
    if (std::equal(first.begin(), first.end(), k.begin())) return it->second.get();
  }
  return nullptr;
}

// Splits node so that its first split_tokens tokens become a new parent node, which is returned.
// The original node keeps its identity (handles held by requests stay valid) and its tail.
RadixNode* RadixCache::split(RadixNode* node, int32_t split_tokens) {
  CHECK(split_tokens > 0 && split_tokens < static_cast<int32_t>(node->key.size()));
  CHECK_EQ(split_tokens % page_size_, 0);
  RadixNode* parent = node->parent;
  auto mid = std::make_unique<RadixNode>();
  mid->parent = parent;
  mid->key.assign(node->key.begin(), node->key.begin() + split_tokens);
  mid->pages.assign(node->pages.begin(), node->pages.begin() + split_tokens / page_size_);
  mid->lock_ref = node->lock_ref;
  mid->last_access = node->last_access;
  mid->end_tokens = node->end_tokens - static_cast<int32_t>(node->key.size()) + split_tokens;

  // Detach node from its parent (it is keyed by the same first page as mid).
  uint64_t h = hash_page(std::span<const int32_t>(mid->key).first(page_size_));
  std::unique_ptr<RadixNode> owned;
  auto [lo, hi] = parent->children.equal_range(h);
  for (auto it = lo; it != hi; ++it) {
    if (it->second.get() == node) {
      owned = std::move(it->second);
      parent->children.erase(it);
      break;
    }
  }
  CHECK(owned != nullptr);
  node->key.erase(node->key.begin(), node->key.begin() + split_tokens);
  node->pages.erase(node->pages.begin(), node->pages.begin() + split_tokens / page_size_);
  node->parent = mid.get();
  uint64_t tail_hash = hash_page(std::span<const int32_t>(node->key).first(page_size_));
  mid->children.emplace(tail_hash, std::move(owned));
  RadixNode* result = mid.get();
  parent->children.emplace(h, std::move(mid));
  return result;
}

RadixMatch RadixCache::match_prefix(std::span<const int32_t> tokens, bool record_stats) {
  RadixMatch m;
  RadixNode* cur = root_.get();
  size_t pos = 0;
  ++clock_;
  while (RadixNode* child = find_child(cur, tokens.subspan(pos))) {
    auto rest = tokens.subspan(pos);
    size_t n = std::min(rest.size(), child->key.size());
    size_t common = std::mismatch(child->key.begin(), child->key.begin() + n, rest.begin()).first -
                    child->key.begin();
    common = common / page_size_ * page_size_;  // >= page_size: the first page matched
    if (common < child->key.size()) child = split(child, static_cast<int32_t>(common));
    child->last_access = clock_;
    m.pages.insert(m.pages.end(), child->pages.begin(), child->pages.end());
    pos += common;
    cur = child;
  }
  m.matched_tokens = static_cast<int32_t>(pos);
  m.node = cur;
  if (record_stats) {
    lookup_tokens_ += static_cast<int64_t>(tokens.size());
    hit_tokens_ += m.matched_tokens;
  }
  return m;
}

RadixPeek RadixCache::peek_prefix(std::span<const int32_t> tokens) const {
  RadixPeek p;
  const RadixNode* cur = root_.get();
  size_t pos = 0;
  while (const RadixNode* child = find_child(cur, tokens.subspan(pos))) {
    auto rest = tokens.subspan(pos);
    size_t n = std::min(rest.size(), child->key.size());
    size_t common = std::mismatch(child->key.begin(), child->key.begin() + n, rest.begin()).first -
                    child->key.begin();
    common = common / page_size_ * page_size_;
    if (child->lock_ref == 0) p.evictable_pages += static_cast<int32_t>(common) / page_size_;
    pos += common;
    if (common < child->key.size()) break;
    cur = child;
  }
  p.matched_tokens = static_cast<int32_t>(pos);
  return p;
}

int32_t RadixCache::insert(std::span<const int32_t> tokens, std::span<const PageId> pages) {
  CHECK_EQ(tokens.size(), pages.size() * page_size_);
  RadixNode* cur = root_.get();
  size_t pos = 0;
  ++clock_;
  while (pos < tokens.size()) {
    RadixNode* child = find_child(cur, tokens.subspan(pos));
    if (child == nullptr) {
      auto leaf = std::make_unique<RadixNode>();
      leaf->parent = cur;
      leaf->key.assign(tokens.begin() + pos, tokens.end());
      leaf->pages.assign(pages.begin() + pos / page_size_, pages.end());
      leaf->end_tokens = cur->end_tokens + static_cast<int32_t>(leaf->key.size());
      leaf->last_access = clock_;
      int32_t n = static_cast<int32_t>(leaf->pages.size());
      cached_pages_ += n;
      inserted_pages_ += n;
      uint64_t h = hash_page(std::span<const int32_t>(leaf->key).first(page_size_));
      cur->children.emplace(h, std::move(leaf));
      return static_cast<int32_t>(pos);
    }
    auto rest = tokens.subspan(pos);
    size_t n = std::min(rest.size(), child->key.size());
    size_t common = std::mismatch(child->key.begin(), child->key.begin() + n, rest.begin()).first -
                    child->key.begin();
    common = common / page_size_ * page_size_;
    if (common < child->key.size()) child = split(child, static_cast<int32_t>(common));
    child->last_access = clock_;
    // Already cached: the tree keeps its page; the caller's copy (or extra reference) goes.
    pool_->release(pages.subspan(pos / page_size_, common / page_size_));
    pos += common;
    cur = child;
  }
  return static_cast<int32_t>(pos);
}

void RadixCache::inc_lock_ref(RadixNodeHandle node) {
  CHECK(node != nullptr);
  ++node->direct_locks;
  for (RadixNode* n = node; n != root_.get(); n = n->parent) {
    if (n->lock_ref++ == 0) locked_pages_ += static_cast<int32_t>(n->pages.size());
  }
}

void RadixCache::dec_lock_ref(RadixNodeHandle node) {
  CHECK(node != nullptr);
  CHECK_MSG(node->direct_locks > 0, "dec_lock_ref without a matching inc_lock_ref");
  --node->direct_locks;
  for (RadixNode* n = node; n != root_.get(); n = n->parent) {
    CHECK_GT(n->lock_ref, 0);
    if (--n->lock_ref == 0) locked_pages_ -= static_cast<int32_t>(n->pages.size());
  }
}

int32_t RadixCache::lock_ref(RadixNodeHandle node) const { return node->lock_ref; }

int32_t RadixCache::exclusive_locked_pages(RadixNodeHandle node) const {
  int32_t n = 0;
  // lock_ref never decreases towards the root, so the exclusive part is a suffix of the path.
  for (const RadixNode* p = node; p != root_.get() && p->lock_ref == 1; p = p->parent)
    n += static_cast<int32_t>(p->pages.size());
  return n;
}

std::vector<PageId> RadixCache::path_pages(RadixNodeHandle node) const {
  std::vector<const RadixNode*> path;
  for (const RadixNode* p = node; p != root_.get(); p = p->parent) path.push_back(p);
  std::vector<PageId> out;
  out.reserve(node->end_tokens / page_size_);
  for (auto it = path.rbegin(); it != path.rend(); ++it)
    out.insert(out.end(), (*it)->pages.begin(), (*it)->pages.end());
  return out;
}

int32_t RadixCache::path_tokens(RadixNodeHandle node) const { return node->end_tokens; }

void RadixCache::remove_leaf(RadixNode* leaf) {
  CHECK(leaf != root_.get() && leaf->children.empty() && leaf->lock_ref == 0);
  if (evict_hook_) {
    std::vector<int32_t> path(leaf->end_tokens);
    int32_t end = leaf->end_tokens;
    for (const RadixNode* p = leaf; p != root_.get(); p = p->parent) {
      end -= static_cast<int32_t>(p->key.size());
      std::copy(p->key.begin(), p->key.end(), path.begin() + end);
    }
    int32_t first = leaf->end_tokens - static_cast<int32_t>(leaf->key.size());
    evict_hook_(EvictedNode{
        .path_tokens = path, .first_token = first, .pages = leaf->pages, .parent = leaf->parent});
  }
  int32_t n = static_cast<int32_t>(leaf->pages.size());
  pool_->release(leaf->pages);
  cached_pages_ -= n;
  evicted_pages_ += n;
  RadixNode* parent = leaf->parent;
  uint64_t h = hash_page(std::span<const int32_t>(leaf->key).first(page_size_));
  auto [lo, hi] = parent->children.equal_range(h);
  for (auto it = lo; it != hi; ++it) {
    if (it->second.get() == leaf) {
      parent->children.erase(it);
      return;
    }
  }
  CHECK_MSG(false, "leaf missing from its parent");
}

int32_t RadixCache::evict(int32_t num_pages) {
  if (num_pages <= 0) return 0;
  using Entry = std::pair<uint64_t, RadixNode*>;  // (last_access, leaf), oldest first
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> leaves;
  std::vector<RadixNode*> stack = {root_.get()};
  while (!stack.empty()) {
    RadixNode* n = stack.back();
    stack.pop_back();
    if (n != root_.get() && n->children.empty() && n->lock_ref == 0)
      leaves.emplace(n->last_access, n);
    for (auto& [h, c] : n->children) stack.push_back(c.get());
  }
  int32_t released = 0;
  while (released < num_pages && !leaves.empty()) {
    RadixNode* leaf = leaves.top().second;
    leaves.pop();
    RadixNode* parent = leaf->parent;
    released += static_cast<int32_t>(leaf->pages.size());
    remove_leaf(leaf);
    if (parent != root_.get() && parent->children.empty() && parent->lock_ref == 0)
      leaves.emplace(parent->last_access, parent);
  }
  return released;
}

RadixCacheStats RadixCache::stats() const {
  return RadixCacheStats{.lookup_tokens = lookup_tokens_,
                         .hit_tokens = hit_tokens_,
                         .inserted_pages = inserted_pages_,
                         .evicted_pages = evicted_pages_,
                         .cached_pages = cached_pages_,
                         .evictable_pages = evictable_pages(),
                         .locked_pages = locked_pages_};
}

bool RadixCache::reset() {
  for (const auto& [h, c] : root_->children)
    if (c->lock_ref > 0) return false;
  std::vector<RadixNode*> stack = {root_.get()};
  while (!stack.empty()) {
    RadixNode* n = stack.back();
    stack.pop_back();
    pool_->release(n->pages);
    for (auto& [h, c] : n->children) stack.push_back(c.get());
  }
  root_->children.clear();
  cached_pages_ = 0;
  locked_pages_ = 0;
  return true;
}

void RadixCache::for_each_page(const std::function<void(PageId)>& fn) const {
  std::vector<const RadixNode*> stack = {root_.get()};
  while (!stack.empty()) {
    const RadixNode* n = stack.back();
    stack.pop_back();
    for (PageId p : n->pages) fn(p);
    for (const auto& [h, c] : n->children) stack.push_back(c.get());
  }
}

void RadixCache::check_invariants() const {
  const RadixNode* root = root_.get();
  CHECK(root->key.empty() && root->pages.empty() && root->parent == nullptr);
  CHECK_EQ(root->lock_ref, 0);
  std::unordered_set<PageId> seen;
  int32_t cached = 0, locked = 0;
  std::vector<const RadixNode*> stack = {root};
  while (!stack.empty()) {
    const RadixNode* n = stack.back();
    stack.pop_back();
    int32_t child_locks = 0;
    for (const auto& [h, c] : n->children) {
      CHECK(c->parent == n);
      CHECK(!c->key.empty());
      CHECK_EQ(c->key.size(), c->pages.size() * page_size_);
      CHECK_EQ(h, hash_page(std::span<const int32_t>(c->key).first(page_size_)));
      CHECK_EQ(c->end_tokens, n->end_tokens + static_cast<int32_t>(c->key.size()));
      CHECK_MSG(find_child(n, c->key) == c.get(), "two children share a first page");
      child_locks += c->lock_ref;
      stack.push_back(c.get());
    }
    if (n == root) continue;
    CHECK_GE(n->direct_locks, 0);
    CHECK_EQ(n->lock_ref, n->direct_locks + child_locks);
    cached += static_cast<int32_t>(n->pages.size());
    if (n->lock_ref > 0) locked += static_cast<int32_t>(n->pages.size());
    for (PageId p : n->pages) {
      CHECK_MSG(seen.insert(p).second, "page {} cached twice", p);
      CHECK_MSG(pool_->refcount(p) >= 1, "cached page {} is free in the pool", p);
    }
  }
  CHECK_EQ(cached, cached_pages_);
  CHECK_EQ(locked, locked_pages_);
}

}  // namespace strata
