// Replica selection and failover bookkeeping (pipeline/replicas.h): least outstanding requests,
// rotation of ties, a failed replica skipped until its backoff ends, one probe at a time, the
// backoff doubling per failed probe but not per stale in-flight failure, and recovery.
#include "pipeline/replicas.h"

#include <gtest/gtest.h>

#include <map>

namespace strata {
namespace {

RetryPolicy policy() {
  return RetryPolicy{.initial_delay_s = 1, .max_delay_s = 8, .multiplier = 2};
}

TEST(ReplicaSet, SpreadsEvenlyAndPrefersTheLeastOutstanding) {
  ReplicaSet set({"a", "b", "c"}, policy());
  std::vector<ReplicaTicket> held;
  for (int i = 0; i < 9; ++i) held.push_back(*set.acquire(0));
  for (size_t r = 0; r < 3; ++r) EXPECT_EQ(set.outstanding(r), 3) << r;
  // b finishes two of its requests: the next two go to b.
  int released = 0;
  for (auto it = held.begin(); it != held.end() && released < 2;) {
    if (it->replica == 1) {
      set.release(*it, ReplicaResult::kAnswered, 0);
      it = held.erase(it);
      ++released;
    } else {
      ++it;
    }
  }
  EXPECT_EQ(set.acquire(0)->replica, 1u);
  EXPECT_EQ(set.acquire(0)->replica, 1u);
  // Now all three have 3 again: ties rotate, so the next three cover all replicas.
  std::map<size_t, int> got;
  for (int i = 0; i < 3; ++i) ++got[set.acquire(0)->replica];
  EXPECT_EQ(got.size(), 3u);
}

TEST(ReplicaSet, AFailedReplicaGetsNothingUntilItsBackoffEndsThenOneProbe) {
  ReplicaSet set({"a", "b"}, policy());
  auto t = set.acquire(0);
  ASSERT_EQ(t->replica, 0u);
  auto in_flight_on_a = set.acquire(0);  // goes to b (least outstanding)
  ASSERT_EQ(in_flight_on_a->replica, 1u);
  in_flight_on_a = set.acquire(0);  // a tie: rotates back to a
  ASSERT_EQ(in_flight_on_a->replica, 0u);
  EXPECT_EQ(set.release(*t, ReplicaResult::kDown, 10), ReplicaChange::kWentDown);
  EXPECT_TRUE(set.is_down(0));
  EXPECT_EQ(set.up_count(), 1u);
  // Until 11 (10 + 1 s) every request goes to b, however loaded.
  for (int i = 0; i < 5; ++i) EXPECT_EQ(set.acquire(10.5)->replica, 1u);
  // A request that was in flight on a fails too: no new state, the wait is not extended.
  EXPECT_EQ(set.release(*in_flight_on_a, ReplicaResult::kDown, 10.9), ReplicaChange::kNone);
  EXPECT_EQ(*set.next_probe_s(), 11);
  // At 11 one request probes a (it has fewer outstanding than b); the next ones go to b.
  auto probe = set.acquire(11);
  ASSERT_EQ(probe->replica, 0u);
  EXPECT_TRUE(probe->probe);
  EXPECT_FALSE(set.next_probe_s().has_value());  // being probed
  EXPECT_EQ(set.acquire(11)->replica, 1u);
  // The probe fails: the wait doubles (2 s), then 4, 8, and stays at the 8 s cap.
  EXPECT_EQ(set.release(*probe, ReplicaResult::kDown, 11), ReplicaChange::kNone);
  EXPECT_EQ(*set.next_probe_s(), 13);
  double now = 13;
  for (double expected_wait : {4.0, 8.0, 8.0}) {
    probe = set.acquire(now);
    ASSERT_EQ(probe->replica, 0u);
    ASSERT_TRUE(probe->probe);
    set.release(*probe, ReplicaResult::kDown, now);
    EXPECT_EQ(*set.next_probe_s(), now + expected_wait);
    now += expected_wait;
  }
  // A successful probe brings it back, and its next failure starts the backoff again at 1 s.
  probe = set.acquire(now);
  EXPECT_EQ(set.release(*probe, ReplicaResult::kAnswered, now), ReplicaChange::kCameBack);
  EXPECT_FALSE(set.is_down(0));
  EXPECT_EQ(set.up_count(), 2u);
  EXPECT_EQ(set.outstanding(0), 0);
  auto again = set.acquire(now);
  ASSERT_EQ(again->replica, 0u);
  set.release(*again, ReplicaResult::kDown, now);
  EXPECT_EQ(*set.next_probe_s(), now + 1);
}

TEST(ReplicaSet, EveryReplicaDownMeansWaitForTheEarliestProbe) {
  ReplicaSet set({"a", "b"}, policy());
  auto a = set.acquire(0), b = set.acquire(0);
  ASSERT_NE(a->replica, b->replica);
  set.release(*a, ReplicaResult::kDown, 5);
  set.release(*b, ReplicaResult::kDown, 5.5);
  EXPECT_EQ(set.up_count(), 0u);
  EXPECT_FALSE(set.acquire(5.9).has_value());
  EXPECT_EQ(*set.next_probe_s(), 6);  // a's
  auto p = set.acquire(6);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->replica, a->replica);
  EXPECT_FALSE(set.acquire(6.1).has_value());  // a is being probed, b still waits
  EXPECT_EQ(*set.next_probe_s(), 6.5);
  // A request answered (even with an error status) is an answer: the replica is up.
  EXPECT_EQ(set.release(*p, ReplicaResult::kAnswered, 6.2), ReplicaChange::kCameBack);
  EXPECT_EQ(set.acquire(6.2)->replica, a->replica);
}

TEST(ReplicaSet, OneReplicaBehavesLikeOneServerWithBackoff) {
  ReplicaSet set({"only"}, policy());
  auto t = set.acquire(0);
  EXPECT_EQ(set.release(*t, ReplicaResult::kDown, 0), ReplicaChange::kWentDown);
  EXPECT_FALSE(set.acquire(0.5).has_value());
  t = set.acquire(1);
  ASSERT_TRUE(t.has_value());
  EXPECT_TRUE(t->probe);
  EXPECT_EQ(set.release(*t, ReplicaResult::kAnswered, 1), ReplicaChange::kCameBack);
  EXPECT_EQ(set.down_delay_s(1), 1);
  EXPECT_EQ(set.down_delay_s(3), 4);
  EXPECT_EQ(set.down_delay_s(10), 8);
}

}  // namespace
}  // namespace strata
