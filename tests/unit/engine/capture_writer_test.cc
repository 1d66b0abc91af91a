// CaptureWriter (engine/capture_writer.h): the engine's captured blocks stored on the writer's
// thread, in order, behind a fence, with a bounded number of blocks.
#include "engine/capture_writer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <future>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace strata {
namespace {

constexpr int64_t kWidth = 4;  // f32 values per row

// A spill whose writes wait at a gate the test opens, and which records each row it was given.
class GatedSpill final : public RowSpill {
 public:
  int64_t prefix_bytes() const override { return 4; }  // the row's first value
  void write(int64_t pos, const uint8_t* prefix) override {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return open_; });
    float v;
    std::memcpy(&v, prefix, 4);
    writes.emplace_back(pos, v);
  }
  void open() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  std::vector<std::pair<int64_t, float>> writes;  // read after the fence

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

// A job of `n` rows at positions first.. of `states`, row p's values p*10 + column.
CaptureJob job_for(CaptureBlock buffer, std::shared_ptr<CapturedStates> states, int64_t first,
                   int32_t n) {
  CaptureJob job;
  job.width = kWidth;
  job.dtype = DType::kF32;
  job.states = {std::move(states)};
  job.row_begin = {0};
  job.row_count = {n};
  job.rows = std::move(buffer);
  job.rows.resize(size_t(n * kWidth * 4));
  for (int32_t r = 0; r < n; ++r) {
    job.positions.push_back(first + r);
    for (int64_t c = 0; c < kWidth; ++c) {
      const float v = float((first + r) * 10 + c);
      std::memcpy(job.rows.data() + (r * kWidth + c) * 4, &v, 4);
    }
  }
  return job;
}

TEST(CaptureWriter, RowsAreStoredBeforeTheFencePasses) {
  auto spill = std::make_shared<GatedSpill>();
  auto states = std::make_shared<CapturedStates>(DType::kF32, spill);
  CaptureWriter writer(3);
  const uint64_t a = writer.submit(job_for(writer.take_buffer(), states, 0, 3));
  const uint64_t b = writer.submit(job_for(writer.take_buffer(), states, 3, 1));
  EXPECT_EQ(b, a + 1);
  // The writer is held inside the first job's first row: neither fence has passed.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(writer.written(a));
  EXPECT_FALSE(writer.written(b));
  EXPECT_TRUE(writer.written(0));
  spill->open();
  writer.wait(b);
  EXPECT_TRUE(writer.written(a));
  ASSERT_TRUE(states->complete(4));
  EXPECT_EQ(states->rows(), 4);
  // Positions reach the spill in order across jobs; the rest of each row is in memory.
  ASSERT_EQ(spill->writes.size(), 4u);
  for (int64_t p = 0; p < 4; ++p) {
    EXPECT_EQ(spill->writes[size_t(p)].first, p);
    EXPECT_EQ(spill->writes[size_t(p)].second, float(p * 10));
    float kept[kWidth - 1];
    std::memcpy(kept, states->row(p), sizeof(kept));
    for (int64_t c = 1; c < kWidth; ++c) EXPECT_EQ(kept[c - 1], float(p * 10 + c));
  }
}

TEST(CaptureWriter, ASlowWriterBlocksTheProducerInsteadOfGrowing) {
  auto spill = std::make_shared<GatedSpill>();
  auto states = std::make_shared<CapturedStates>(DType::kF32, spill);
  CaptureWriter writer(2);                                     // two blocks in all
  writer.submit(job_for(writer.take_buffer(), states, 0, 1));  // being written (held)
  writer.submit(job_for(writer.take_buffer(), states, 1, 1));  // queued
  auto third = std::async(std::launch::async, [&] { return writer.take_buffer(); });
  EXPECT_EQ(third.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout);
  spill->open();  // the writer frees the first block
  ASSERT_EQ(third.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  const uint64_t last = writer.submit(job_for(third.get(), states, 2, 1));
  writer.wait(last);
  EXPECT_TRUE(states->complete(3));
}

// A verify step's block: each seq's segment keeps only its committed rows (its token and the
// drafts it accepted); a rejected draft's row, and a seq that does not capture, store nothing.
TEST(CaptureWriter, OnlyEachSegmentsKeptRowsAreStored) {
  auto a = std::make_shared<CapturedStates>(DType::kF32);
  auto b = std::make_shared<CapturedStates>(DType::kF32);
  CaptureWriter writer(2);
  // Block rows: a's positions 5..8 (rows 0-3), an uncaptured seq (row 4), b's 2..4 (rows 5-7).
  CaptureJob job = job_for(writer.take_buffer(), nullptr, 0, 8);
  job.positions = {5, 6, 7, 8, 0, 2, 3, 4};
  job.states = {a, b};
  job.row_begin = {0, 5};
  job.row_count = {2, 3};  // a accepted 1 of 3 drafts; b accepted both of its 2
  writer.wait(writer.submit(std::move(job)));
  EXPECT_TRUE(a->has(5));
  EXPECT_TRUE(a->has(6));
  EXPECT_FALSE(a->has(7));
  EXPECT_FALSE(a->has(8));
  EXPECT_FALSE(b->has(0));
  for (int64_t p : {2, 3, 4}) EXPECT_TRUE(b->has(p)) << p;
  // Row r of the block (its values r*10 + column, from job_for) went to its own position.
  float v[kWidth];
  std::memcpy(v, a->row(6), sizeof(v));
  EXPECT_EQ(v[0], 10.f);
  std::memcpy(v, b->row(4), sizeof(v));
  EXPECT_EQ(v[0], 70.f);
  EXPECT_EQ(v[3], 73.f);
}

// A spill that counts writes entered concurrently (there must be none) and positions that come
// out of order (none either).
class CheckingSpill final : public RowSpill {
 public:
  int64_t prefix_bytes() const override { return 4; }
  void write(int64_t pos, const uint8_t* prefix) override {
    if (inside_.exchange(true)) ++overlaps;
    std::this_thread::sleep_for(std::chrono::microseconds(50));  // widens any overlap
    float v;
    std::memcpy(&v, prefix, 4);
    if (pos != next_ || v != float(pos * 10)) ++out_of_order;
    next_ = pos + 1;
    inside_.store(false);
  }
  std::atomic<int> overlaps{0};
  int out_of_order = 0;

 private:
  std::atomic<bool> inside_{false};
  int64_t next_ = 0;
};

// The crew's split: 12 requests over 4 threads, each request's rows in two segments (a tree's
// accepted path: not adjacent in the block), over several jobs. Every request's rows reach its
// spill one at a time and in position order, and every row is stored.
TEST(CaptureWriter, EachRequestsSegmentsGoToOneThreadInOrder) {
  constexpr int kRequests = 12;
  std::vector<std::shared_ptr<CheckingSpill>> spills;
  std::vector<std::shared_ptr<CapturedStates>> states;
  for (int r = 0; r < kRequests; ++r) {
    spills.push_back(std::make_shared<CheckingSpill>());
    states.push_back(std::make_shared<CapturedStates>(DType::kF32, spills.back()));
  }
  CaptureWriter writer(3, 4);
  uint64_t last = 0;
  for (int64_t step = 0; step < 5; ++step) {
    // Request r's positions 3*step .. 3*step+2: rows r*3 (one row) and 36 + r*2 (two rows).
    const int64_t first = 3 * step;
    CaptureJob job = job_for(writer.take_buffer(), nullptr, 0, 3 * kRequests);
    for (int r = 0; r < kRequests; ++r) {
      job.states.push_back(states[size_t(r)]);
      job.row_begin.push_back(r);
      job.row_count.push_back(1);
      job.positions[size_t(r)] = first;
    }
    for (int r = 0; r < kRequests; ++r) {
      job.states.push_back(states[size_t(r)]);
      job.row_begin.push_back(kRequests + 2 * r);
      job.row_count.push_back(2);
      job.positions[size_t(kRequests + 2 * r)] = first + 1;
      job.positions[size_t(kRequests + 2 * r + 1)] = first + 2;
    }
    // Row values follow positions (job_for wrote row*10 + column; rewrite column 0).
    for (size_t row = 0; row < job.positions.size(); ++row) {
      const float v = float(job.positions[row] * 10);
      std::memcpy(job.rows.data() + row * kWidth * 4, &v, 4);
    }
    last = writer.submit(std::move(job));
  }
  writer.wait(last);
  for (int r = 0; r < kRequests; ++r) {
    EXPECT_EQ(spills[size_t(r)]->overlaps.load(), 0) << r;
    EXPECT_EQ(spills[size_t(r)]->out_of_order, 0) << r;
    EXPECT_TRUE(states[size_t(r)]->complete(15)) << r;
  }
}

// Blocks come back for reuse with their memory: no reallocation (nor, on CUDA, a new page lock)
// per step once they are large enough.
TEST(CaptureWriter, BlocksAreReusedWithTheirMemory) {
  auto states = std::make_shared<CapturedStates>(DType::kF32);
  CaptureWriter writer(2);
  CaptureBlock a = writer.take_buffer();
  EXPECT_EQ(a.capacity(), 0u);
  a.resize(1000);
  const uint8_t* memory = a.data();
  const size_t capacity = a.capacity();
  EXPECT_GE(capacity, 1000u);
  writer.wait(writer.submit(job_for(std::move(a), states, 0, 2)));
  CaptureBlock again = writer.take_buffer();  // the only free block is the one written
  EXPECT_EQ(again.data(), memory);
  EXPECT_EQ(again.capacity(), capacity);
  again.resize(capacity);  // within the capacity: the same memory
  EXPECT_EQ(again.data(), memory);
  again.resize(capacity + 1);  // beyond it: at least half as large again
  EXPECT_GE(again.capacity(), capacity + capacity / 2);
  CaptureBlock moved = std::move(again);
  EXPECT_EQ(again.capacity(), 0u);  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_EQ(again.data(), nullptr);
  EXPECT_FALSE(moved.pinned());  // no backend was given
}

TEST(CaptureWriter, DestructionStoresWhatIsQueued) {
  auto states = std::make_shared<CapturedStates>(DType::kF32);
  {
    CaptureWriter writer(4);
    for (int64_t p = 0; p < 6; p += 2) writer.submit(job_for(writer.take_buffer(), states, p, 2));
  }
  EXPECT_TRUE(states->complete(6));
}

}  // namespace
}  // namespace strata
