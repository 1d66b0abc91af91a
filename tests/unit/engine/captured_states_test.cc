// CapturedStates (engine/captured_states.h): rows by position, a spill taking each row's prefix,
// and keep_written(), which a capture job's tail request relies on to add only the positions the
// record lacks.
#include "engine/captured_states.h"

#include <gtest/gtest.h>

#include <cstring>
#include <utility>
#include <vector>

namespace strata {
namespace {

constexpr int64_t kWidth = 4;  // f32 values per row

std::vector<float> row_of(float base) { return {base, base + 1, base + 2, base + 3}; }

float value(const CapturedStates& s, int64_t pos, int64_t col) {
  float v;
  std::memcpy(&v, s.row(pos) + 4 * col, 4);
  return v;
}

// Records every prefix it is given: (position, first value).
class RecordingSpill final : public RowSpill {
 public:
  int64_t prefix_bytes() const override { return 4; }
  void write(int64_t pos, const uint8_t* prefix) override {
    float v;
    std::memcpy(&v, prefix, 4);
    writes.emplace_back(pos, v);
  }
  std::vector<std::pair<int64_t, float>> writes;
};

TEST(CapturedStates, RewritesReplaceRowsUntilKeepWritten) {
  CapturedStates s(DType::kF32);
  s.reserve(8, kWidth);
  for (int64_t p = 0; p < 3; ++p) s.put(p, row_of(float(10 * p)).data(), DType::kF32, kWidth);
  s.put(1, row_of(100).data(), DType::kF32, kWidth);  // a recomputation replaces the row
  EXPECT_EQ(value(s, 1, 0), 100);
  s.keep_written();
  s.put(1, row_of(200).data(), DType::kF32, kWidth);  // kept as it was
  s.put(3, row_of(30).data(), DType::kF32, kWidth);   // a new position is added
  EXPECT_EQ(value(s, 1, 0), 100);
  EXPECT_EQ(value(s, 3, 2), 32);
  EXPECT_TRUE(s.complete(4));
  EXPECT_EQ(value(s, 0, 3), 3);
  EXPECT_EQ(value(s, 2, 1), 21);
}

// The tail request's pattern: the record's rows [0, n - 1) written, then a recomputation of the
// last page [n - 5, n) after keep_written(): only position n - 1 reaches the spill, and the rows
// kept in memory stay within the reserved capacity (no reallocation, so no copy of the record).
TEST(CapturedStates, KeepWrittenSendsOnlyNewRowsToTheSpill) {
  auto spill = std::make_shared<RecordingSpill>();
  CapturedStates s(DType::kF32, spill);
  const int64_t n = 40;
  s.reserve(n + 1, kWidth);
  for (int64_t p = 0; p < n - 1; ++p) s.put(p, row_of(float(10 * p)).data(), DType::kF32, kWidth);
  const uint8_t* before = s.row(0);
  spill->writes.clear();
  s.keep_written();
  for (int64_t p = n - 5; p < n; ++p) s.put(p, row_of(-1).data(), DType::kF32, kWidth);
  ASSERT_EQ(spill->writes.size(), 1u);
  EXPECT_EQ(spill->writes[0], std::make_pair(n - 1, -1.0f));
  EXPECT_EQ(s.row(0), before);
  EXPECT_TRUE(s.complete(n));
  EXPECT_EQ(value(s, n - 2, 0), float(10 * (n - 2) + 1));  // the spill took column 0
  EXPECT_EQ(value(s, n - 1, 0), 0);                        // -1 + 1
}

TEST(CapturedStates, ConvertsBetweenFloatAndBf16) {
  CapturedStates s(DType::kBF16);
  const std::vector<float> v = {1.0f, -2.5f, 0.15625f, 1024.0f};
  s.put(0, v.data(), DType::kF32, kWidth);
  for (int64_t i = 0; i < kWidth; ++i) {
    uint16_t b;
    std::memcpy(&b, s.row(0) + 2 * i, 2);
    EXPECT_EQ(bf16_to_f32(b), v[size_t(i)]);
  }
}

}  // namespace
}  // namespace strata
