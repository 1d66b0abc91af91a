// KV rows of checkpoints through the whole engine on house-llama (CPU reference): a request that
// streams its KV rows (GenerateRequest::export_kv), resumed on an engine whose prefix cache was
// dropped with those rows loaded (resume_kv), computes one token (its last resumed one, which its
// next decode step computes anyway) instead of prefilling prompt + partial output, and produces
// exactly the tokens of the uninterrupted run, greedy and seeded. Rows that do not fit are refused
// and the request prefills, with the same tokens.
#include <gtest/gtest.h>

#include <mutex>

#include "engine/engine.h"

namespace strata {
namespace {

const std::string kHouse = std::string(STRATA_SHARED_DIR) + "/models/house-llama";
constexpr int kPageSize = 4;
constexpr int kNewTokens = 48;

Engine& engine() {
  static std::unique_ptr<Engine> e = [] {
    EngineConfig c;
    c.model_path = kHouse;
    c.page_size = kPageSize;
    auto made = Engine::create(c);
    EXPECT_TRUE(made.ok()) << made.status().to_string();
    return made.ok() ? std::move(made).value() : nullptr;
  }();
  return *e;
}

struct Generated {
  std::vector<int32_t> tokens;        // sampled this run
  std::vector<uint64_t> draws_after;  // per sampled token
  std::vector<KvRows> kv;             // exported, in order
  std::vector<int32_t> resumed;       // the resumed event's tokens
};

Generated generate(const GenerateRequest& base) {
  Generated out;
  std::mutex mu;
  GenerateRequest g = base;
  g.on_event = [&](const StreamEvent& ev) {
    std::lock_guard<std::mutex> lk(mu);
    if (ev.kv) out.kv.push_back(*ev.kv);
    if (ev.resumed) {
      out.resumed = ev.token_ids;
      return;
    }
    for (int32_t t : ev.token_ids) {
      out.tokens.push_back(t);
      out.draws_after.push_back(ev.rng_draws);
    }
  };
  auto id = engine().submit(std::move(g));
  EXPECT_TRUE(id.ok());
  engine().wait_idle();
  return out;
}

// Rows [0, rows) of a run's exports, concatenated.
std::shared_ptr<KvRows> first_rows(const Generated& run, int64_t rows) {
  auto out = std::make_shared<KvRows>();
  for (const KvRows& k : run.kv) {
    EXPECT_EQ(k.first_row, out->rows) << "exports are contiguous from row 0";
    if (k.first_row >= rows) break;
    const size_t bytes_per_row = k.bytes.size() / size_t(k.rows);
    const int64_t n = std::min(k.rows, rows - k.first_row);
    out->bytes.insert(out->bytes.end(), k.bytes.begin(),
                      k.bytes.begin() + ptrdiff_t(size_t(n) * bytes_per_row));
    out->rows += n;
  }
  return out;
}

class EngineKvResume : public ::testing::TestWithParam<float> {};

TEST_P(EngineKvResume, LoadedRowsDecodeOnWithTheUninterruptedTokens) {
  GenerateRequest base;
  base.prompt_ids = engine().tokenizer().encode("The old lighthouse keeper said that the sea");
  base.params =
      SamplingParams{.temperature = GetParam(), .max_new_tokens = kNewTokens, .ignore_eos = true};
  base.params.seed = 11;
  base.export_kv = true;
  const int32_t prompt = int32_t(base.prompt_ids.size());
  const Generated ref = generate(base);
  ASSERT_EQ(ref.tokens.size(), size_t(kNewTokens));
  // Rows arrive as pages fill, up to the last page before the final token's.
  ASSERT_FALSE(ref.kv.empty());
  const int64_t exported = ref.kv.back().first_row + ref.kv.back().rows;
  EXPECT_EQ(exported, (prompt + kNewTokens - 2) / kPageSize * kPageSize);
  const std::optional<KvRowsLayout> layout = engine().kv_rows_layout();
  ASSERT_TRUE(layout.has_value());
  for (const KvRows& k : ref.kv)
    EXPECT_EQ(int64_t(k.bytes.size()), k.rows / kPageSize * layout->page_bytes);

  // A checkpoint at a page boundary about halfway: rows R hold prompt + the first T - 1 outputs.
  const int64_t rows = (prompt + kNewTokens / 2) / kPageSize * kPageSize;
  const int64_t t = rows - prompt + 1;
  ASSERT_GT(t, 1);
  ASSERT_TRUE(engine().flush_cache()) << "the resume must not find the reference's pages cached";
  GenerateRequest resume = base;
  resume.resume_output_ids.assign(ref.tokens.begin(), ref.tokens.begin() + t);
  resume.resume_rng_draws = ref.draws_after[size_t(t - 1)];
  resume.resume_kv = first_rows(ref, rows);
  resume.kv_export_from_row = int32_t(rows);
  const EngineStats before = engine().stats();
  const Generated got = generate(resume);
  const EngineStats after = engine().stats();
  EXPECT_EQ(got.resumed, resume.resume_output_ids);
  std::vector<int32_t> whole = resume.resume_output_ids;
  whole.insert(whole.end(), got.tokens.begin(), got.tokens.end());
  EXPECT_EQ(whole, ref.tokens) << "the continuation differs from the uninterrupted run";
  EXPECT_EQ(after.kv_import_tokens_total - before.kv_import_tokens_total, rows);
  EXPECT_EQ(after.kv_import_refused_total, before.kv_import_refused_total);
  // One token computed by the prefill step: the last resumed one, at position `rows`.
  EXPECT_EQ(after.prefill_tokens_total - before.prefill_tokens_total, 1);
  ASSERT_FALSE(got.kv.empty());
  EXPECT_EQ(got.kv.front().first_row, rows) << "exports continue where the checkpoint's rows end";

  // Rows of the wrong size are refused: the request prefills prompt + resumed tokens instead.
  ASSERT_TRUE(engine().flush_cache());
  GenerateRequest bad = resume;
  auto cut = std::make_shared<KvRows>(*resume.resume_kv);
  cut->bytes.resize(cut->bytes.size() - 1);
  bad.resume_kv = cut;
  const EngineStats before_bad = engine().stats();
  const Generated fallback = generate(bad);
  const EngineStats after_bad = engine().stats();
  EXPECT_EQ(after_bad.kv_import_refused_total - before_bad.kv_import_refused_total, 1);
  EXPECT_EQ(after_bad.prefill_tokens_total - before_bad.prefill_tokens_total, prompt + t);
  EXPECT_EQ(fallback.tokens, got.tokens);
}

INSTANTIATE_TEST_SUITE_P(GreedyAndSeeded, EngineKvResume, ::testing::Values(0.0f, 0.8f),
                         [](const auto& info) { return info.param == 0.0f ? "greedy" : "seeded"; });

}  // namespace
}  // namespace strata
