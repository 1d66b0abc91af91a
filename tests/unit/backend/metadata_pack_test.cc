// pack_attention_metadata's layout (backend/metadata_pack.h: the sections at their offsets, the
// draft-tree words 8-byte aligned, the page table last) and packs_to, the in-place comparison a
// device backend makes on every attention op of a step: true for the metadata it was packed
// from (or an equal copy), false when any one value of any section differs, when the page table
// grows or shrinks, and when the counts, the page size or the tree's presence differ.
#include "backend/metadata_pack.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <vector>

namespace strata {
namespace {

// Owned arrays behind an AttentionMetadata: 3 sequences with 1, 4 and 1 new tokens.
struct Meta {
  std::vector<int32_t> q_indptr{0, 1, 5, 6}, kv_lens{17, 9, 40}, page_indptr{0, 5, 8, 18},
      page_indices, positions{16, 5, 6, 7, 8, 39}, slots{70, 20, 21, 22, 23, 1000};
  std::vector<uint64_t> tree{0, 1, 3, 5, 9, 0};
  bool with_tree = false;
  int page_size = 4;
  Meta() {
    for (int i = 0; i < 18; ++i) page_indices.push_back(100 + 7 * i);
  }
  AttentionMetadata view() const {
    AttentionMetadata m;
    m.num_seqs = int(kv_lens.size());
    m.num_tokens = int(positions.size());
    m.page_size = page_size;
    m.q_indptr = q_indptr.data();
    m.kv_lens = kv_lens.data();
    m.page_indptr = page_indptr.data();
    m.page_indices = page_indices.data();
    m.positions = positions.data();
    m.slot_mapping = slots.data();
    m.tree_mask = with_tree ? tree.data() : nullptr;
    return m;
  }
};

TEST(MetadataPack, SectionsSitAtTheirOffsets) {
  for (bool tree : {false, true}) {
    Meta meta;
    meta.with_tree = tree;
    const PackedMetadata p = pack_attention_metadata(meta.view());
    const std::vector<int32_t>& v = p.values;
    auto section = [&](size_t at, size_t n) {
      return std::vector<int32_t>(v.begin() + long(at), v.begin() + long(at + n));
    };
    EXPECT_EQ(section(p.q_indptr_at(), 4), meta.q_indptr);
    EXPECT_EQ(section(p.kv_lens_at(), 3), meta.kv_lens);
    EXPECT_EQ(section(p.page_indptr_at(), 4), meta.page_indptr);
    EXPECT_EQ(section(p.positions_at(), 6), meta.positions);
    EXPECT_EQ(section(p.slot_mapping_at(), 6), meta.slots);
    EXPECT_EQ(section(p.pages_at, 18), meta.page_indices);
    EXPECT_EQ(v.size(), p.pages_at + 18);
    if (tree) {
      EXPECT_EQ(p.tree_at % 2, 0u) << "tree words must be 8-byte aligned in the copy";
      std::vector<uint64_t> words(6);
      std::memcpy(words.data(), v.data() + p.tree_at, 6 * 8);
      EXPECT_EQ(words, meta.tree);
    }
    EXPECT_TRUE(packs_to(meta.view(), p)) << "tree " << tree;
    const Meta copy = meta;  // equal values at other addresses
    EXPECT_TRUE(packs_to(copy.view(), p)) << "tree " << tree;
  }
}

TEST(MetadataPack, AnyChangeIsSeen) {
  for (bool tree : {false, true}) {
    Meta base;
    base.with_tree = tree;
    const PackedMetadata p = pack_attention_metadata(base.view());
    // Every value of every section, changed alone.
    const std::vector<std::function<std::vector<int32_t>&(Meta&)>> sections = {
        [](Meta& m) -> std::vector<int32_t>& { return m.q_indptr; },
        [](Meta& m) -> std::vector<int32_t>& { return m.kv_lens; },
        [](Meta& m) -> std::vector<int32_t>& { return m.positions; },
        [](Meta& m) -> std::vector<int32_t>& { return m.slots; },
        [](Meta& m) -> std::vector<int32_t>& { return m.page_indices; },
    };
    for (size_t s = 0; s < sections.size(); ++s) {
      for (size_t i = 0; i < sections[s](base).size(); ++i) {
        Meta m = base;
        sections[s](m)[i] += 1;
        EXPECT_FALSE(packs_to(m.view(), p)) << "section " << s << " value " << i;
      }
    }
    if (tree) {
      for (size_t i = 0; i < base.tree.size(); ++i) {
        Meta m = base;
        m.tree[i] ^= uint64_t(1) << 40;
        EXPECT_FALSE(packs_to(m.view(), p)) << "tree word " << i;
      }
    }
    {  // a sequence gains a page: the table grows by one
      Meta m = base;
      m.page_indices.insert(m.page_indices.begin() + 8, 999);
      m.page_indptr[3] += 1;
      EXPECT_FALSE(packs_to(m.view(), p));
    }
    {  // one page fewer at the end
      Meta m = base;
      m.page_indices.pop_back();
      m.page_indptr[3] -= 1;
      EXPECT_FALSE(packs_to(m.view(), p));
    }
    {
      Meta m = base;
      m.page_size = 8;
      EXPECT_FALSE(packs_to(m.view(), p));
    }
    {
      Meta m = base;
      m.with_tree = !tree;
      EXPECT_FALSE(packs_to(m.view(), p));
    }
    {  // a sequence fewer (the first two)
      Meta m = base;
      m.q_indptr.resize(3);
      m.kv_lens.resize(2);
      m.page_indptr.resize(3);
      m.positions.resize(5);
      m.slots.resize(5);
      m.tree.resize(5);
      EXPECT_FALSE(packs_to(m.view(), p));
    }
  }
}

}  // namespace
}  // namespace strata
