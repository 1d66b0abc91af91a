// The host KV tier's tensor-parallel protocol (dist/tp_host_tier.h) with a scripted copier whose
// copies land only when the test says: rank 0 records every copy and what it saw complete; a
// worker issues the same copies in order and waits for exactly those rank 0 waited for before
// the step, so its other copies overlap its forward. Wire forms round-trip; bad messages are
// DataLoss errors.
#include <gtest/gtest.h>

#include "dist/tp_host_tier.h"

namespace strata {
namespace {

// Copies complete when complete_through() (or a wait) says so; tickets count from 1.
class ScriptedCopier : public HiCacheIo {
 public:
  struct Call {
    bool to_host;
    std::vector<PageCopy> pages;
  };
  uint64_t device_to_host(std::span<const PageCopy> c) override { return issue(true, c); }
  uint64_t host_to_device(std::span<const PageCopy> c) override { return issue(false, c); }
  bool done(uint64_t ticket) override { return ticket <= completed; }
  void wait(uint64_t ticket) override {
    waits.push_back(ticket);
    completed = std::max(completed, ticket);
  }
  int64_t page_bytes() const override { return 100; }
  double copy_seconds() const override { return 0.5; }

  std::vector<Call> calls;
  std::vector<uint64_t> waits;
  uint64_t completed = 0;

 private:
  uint64_t issue(bool to_host, std::span<const PageCopy> c) {
    calls.push_back(Call{to_host, std::vector<PageCopy>(c.begin(), c.end())});
    return calls.size();
  }
};

std::vector<PageCopy> pages(std::initializer_list<std::pair<int, int>> p) {
  std::vector<PageCopy> out;
  for (auto [d, h] : p) out.push_back(PageCopy{.device_page = d, .host_page = h});
  return out;
}

bool same(const std::vector<PageCopy>& a, const std::vector<PageCopy>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].device_page != b[i].device_page || a[i].host_page != b[i].host_page) return false;
  return true;
}

TEST(TpHostTierTest, RankZeroRecordsCopiesAndWhatItSawComplete) {
  auto local = std::make_unique<ScriptedCopier>();
  ScriptedCopier& copier = *local;
  TpHostTier tier(std::move(local), /*host_pages=*/8);
  EXPECT_FALSE(tier.stats_stale());
  EXPECT_EQ(tier.device_to_host(pages({{1, 0}, {2, 1}})), 1u);
  EXPECT_EQ(tier.host_to_device(pages({{5, 0}})), 2u);
  EXPECT_EQ(copier.calls.size(), 2u);  // issued on rank 0 at once
  EXPECT_TRUE(tier.stats_stale());
  HostTierSync first = tier.take_sync();
  ASSERT_EQ(first.batches.size(), 2u);
  EXPECT_TRUE(first.batches[0].to_host);
  EXPECT_EQ(first.batches[0].ticket, 1u);
  EXPECT_TRUE(same(first.batches[0].pages, pages({{1, 0}, {2, 1}})));
  EXPECT_FALSE(first.batches[1].to_host);
  EXPECT_EQ(first.done_through, 0u);
  EXPECT_FALSE(tier.done(1));
  copier.completed = 1;
  EXPECT_TRUE(tier.done(1));
  EXPECT_EQ(tier.take_sync().done_through, 1u);  // nothing new, but rank 0 saw ticket 1 land
  tier.wait(2);
  const HostTierSync third = tier.take_sync();
  EXPECT_TRUE(third.batches.empty());
  EXPECT_EQ(third.done_through, 2u);
  const HostTierRankStats s = tier.local_stats();
  EXPECT_EQ(s.pages_to_host, 2);
  EXPECT_EQ(s.pages_to_device, 1);
  EXPECT_EQ(s.bytes_to_host, 200);
  EXPECT_EQ(s.host_bytes, 800);
}

TEST(TpHostTierTest, WorkerIssuesInOrderAndWaitsOnlyForWhatRankZeroWaitedFor) {
  auto local = std::make_unique<ScriptedCopier>();
  ScriptedCopier& copier = *local;
  TpHostMirror mirror(std::move(local), {.device_pages = 16, .host_pages = 8}, /*rank=*/3);
  // Rank 0's tickets 5 and 7 (its own numbering): the worker's are 1 and 2.
  HostTierSync sync;
  sync.batches.push_back(
      HostCopyBatch{.to_host = true, .ticket = 5, .pages = pages({{1, 0}, {2, 1}})});
  sync.batches.push_back(HostCopyBatch{.to_host = false, .ticket = 7, .pages = pages({{9, 0}})});
  ASSERT_TRUE(mirror.apply(sync).ok());
  ASSERT_EQ(copier.calls.size(), 2u);
  EXPECT_TRUE(copier.calls[0].to_host);
  EXPECT_TRUE(same(copier.calls[1].pages, pages({{9, 0}})));
  EXPECT_TRUE(copier.waits.empty());  // rank 0 waited for none: both overlap the forward

  ASSERT_TRUE(mirror.apply(HostTierSync{.done_through = 5, .batches = {}}).ok());
  EXPECT_EQ(copier.waits, std::vector<uint64_t>{1});  // the worker's ticket for rank 0's 5, not 7
  ASSERT_TRUE(mirror.apply(HostTierSync{.done_through = 6, .batches = {}}).ok());
  EXPECT_EQ(copier.waits.size(), 1u);
  copier.completed = 2;  // landed on its own: no wait needed
  ASSERT_TRUE(mirror.apply(HostTierSync{.done_through = 7, .batches = {}}).ok());
  EXPECT_EQ(copier.waits.size(), 1u);

  const HostTierRankStats s = mirror.stats();
  EXPECT_EQ(s.rank, 3);
  EXPECT_EQ(s.pages_to_host, 2);
  EXPECT_EQ(s.pages_to_device, 1);
  EXPECT_EQ(s.bytes_to_device, 100);
  EXPECT_EQ(s.host_bytes, 800);
  EXPECT_EQ(s.copy_seconds, 0.5);
}

TEST(TpHostTierTest, WorkerRefusesCopiesOutsideItsPoolsOrOutOfOrder) {
  TpHostMirror mirror(std::make_unique<ScriptedCopier>(), {.device_pages = 16, .host_pages = 8}, 1);
  auto one = [](uint64_t ticket, int device, int host) {
    HostTierSync s;
    s.batches.push_back(
        HostCopyBatch{.to_host = true, .ticket = ticket, .pages = pages({{device, host}})});
    return s;
  };
  EXPECT_EQ(mirror.apply(one(1, 16, 0)).code(), StatusCode::kDataLoss);
  EXPECT_EQ(mirror.apply(one(1, 0, 8)).code(), StatusCode::kDataLoss);
  EXPECT_EQ(mirror.apply(one(1, -1, 0)).code(), StatusCode::kDataLoss);
  EXPECT_TRUE(mirror.apply(one(2, 15, 7)).ok());
  EXPECT_EQ(mirror.apply(one(2, 0, 0)).code(), StatusCode::kDataLoss);  // a ticket again
}

TEST(TpHostTierTest, WireFormsRoundTripAndTruncationIsDataLoss) {
  HostTierSync sync{.done_through = 41, .batches = {}};
  sync.batches.push_back(
      HostCopyBatch{.to_host = false, .ticket = 40, .pages = pages({{3, 4}, {5, 6}})});
  sync.batches.push_back(HostCopyBatch{.to_host = true, .ticket = 42, .pages = {}});
  std::vector<uint8_t> bytes;
  sync.encode(bytes);
  auto back = HostTierSync::decode(bytes);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->done_through, 41u);
  ASSERT_EQ(back->batches.size(), 2u);
  EXPECT_FALSE(back->batches[0].to_host);
  EXPECT_EQ(back->batches[0].ticket, 40u);
  EXPECT_TRUE(same(back->batches[0].pages, pages({{3, 4}, {5, 6}})));
  EXPECT_TRUE(back->batches[1].to_host);
  for (size_t n = 0; n < bytes.size(); ++n)
    EXPECT_EQ(HostTierSync::decode(std::span(bytes).first(n)).status().code(),
              StatusCode::kDataLoss)
        << n;
  bytes.push_back(0);
  EXPECT_EQ(HostTierSync::decode(bytes).status().code(), StatusCode::kDataLoss);

  const HostTierRankStats stats{.rank = 4,
                                .host_bytes = 1,
                                .pages_to_host = 2,
                                .pages_to_device = 3,
                                .bytes_to_host = 4,
                                .bytes_to_device = 5,
                                .copy_seconds = 0.25};
  std::vector<uint8_t> sb;
  encode_rank_stats(stats, sb);
  auto sback = decode_rank_stats(sb);
  ASSERT_TRUE(sback.ok());
  EXPECT_EQ(sback->rank, 4);
  EXPECT_EQ(sback->bytes_to_device, 5);
  EXPECT_EQ(sback->copy_seconds, 0.25);
  EXPECT_FALSE(decode_rank_stats(std::span(sb).first(sb.size() - 1)).ok());
}

}  // namespace
}  // namespace strata
