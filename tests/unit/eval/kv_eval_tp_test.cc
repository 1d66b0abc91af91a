// eval-kv under tensor parallelism (the engine's in-process CPU ranks) and its checkpoint: a
// --tp-size 2 evaluation agrees with --tp-size 1 within the standard errors on both house models
// (the ranks sum partial results in another order, so not bit for bit), and an evaluation
// interrupted after its first group of windows and resumed from its checkpoint gives exactly the
// record of an uninterrupted one.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "dist/tensor_parallel.h"
#include "eval/kv_eval.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

std::string model_dir(const char* name) {
  return std::string(STRATA_SHARED_DIR) + "/models/" + name;
}

class KvEvalTp : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    data_ =
        (fs::temp_directory_path() / ("strata_kv_eval_tp_" + std::to_string(::getpid()) + ".jsonl"))
            .string();
    std::ifstream in(std::string(STRATA_SHARED_DIR) + "/data/heldout.jsonl");
    std::ofstream out(data_);
    std::string line;
    for (int i = 0; i < 24 && std::getline(in, line); ++i) out << line << "\n";
  }
  static void TearDownTestSuite() { fs::remove(data_); }

  static EvalKvOptions options(const char* model, int tp, int64_t tokens) {
    return EvalKvOptions{.model_path = model_dir(model),
                         .data_path = data_,
                         .max_tokens = tokens,
                         .context_len = 64,
                         .chunk = 16,
                         .page_size = 4,
                         .noise_chunk = 7,
                         .free_run_prompts = 1,
                         .free_run_tokens = 8,
                         .tp_size = tp,
                         .tp_allow_uneven = true,
                         .batch_windows = 2};
  }
  static std::unique_ptr<KvEvaluator> make(const EvalKvOptions& o) {
    auto e = KvEvaluator::create(o, &tensor_parallel_runtime());
    EXPECT_TRUE(e.ok()) << e.status().to_string();
    return e.ok() ? std::move(e).value() : nullptr;
  }
  static std::vector<std::pair<std::string, KvCacheConfig>> candidates(KvEvaluator& ev, bool mla) {
    std::vector<std::pair<std::string, KvCacheConfig>> c;
    c.push_back({"e4m3", *ev.resolve({.dtype = KvCacheDtype::kFp8E4M3})});
    c.push_back(
        {"e5m2 mixed", *ev.resolve({.dtype = KvCacheDtype::kFp8E5M2, .bf16_layers = {0, 3}})});
    if (mla) c.push_back({"flashmla", *ev.resolve({.dtype = KvCacheDtype::kFp8FlashMla})});
    return c;
  }
  static std::string data_;
};
std::string KvEvalTp::data_;

void expect_within_se(const KvMetrics& a, const KvMetrics& b, const std::string& label) {
  const nlohmann::json ja = a.to_json(), jb = b.to_json();
  ASSERT_EQ(a.tokens(), b.tokens()) << label;
  for (const char* m : {"kld", "ln_ppl_ratio"}) {
    const char* v = std::string(m) == "kld" ? "mean" : "value";
    const double x = ja[m][v], y = jb[m][v],
                 se = std::hypot(ja[m]["se"].get<double>(), jb[m]["se"].get<double>());
    EXPECT_LE(std::fabs(x - y), 2 * se + 1e-9)
        << label << " " << m << ": tp1 " << x << " tp2 " << y << " se " << se;
  }
  const double ta = ja["top1"]["agree"], tb = jb["top1"]["agree"];
  EXPECT_LE(std::fabs(ta - tb),
            2 * std::hypot(ja["top1"]["se"].get<double>(), jb["top1"]["se"].get<double>()) + 0.02)
      << label;
}

void tp2_matches_tp1(const char* model, bool mla) {
  auto one = KvEvalTp::make(KvEvalTp::options(model, 1, 4 * 63));
  auto two = KvEvalTp::make(KvEvalTp::options(model, 2, 4 * 63));
  ASSERT_TRUE(one && two);
  ASSERT_EQ(one->data().windows.size(), 4u);
  auto r1 = one->compare(KvEvalTp::candidates(*one, mla), true, true);
  auto r2 = two->compare(KvEvalTp::candidates(*two, mla), true, true);
  ASSERT_TRUE(r1.ok() && r2.ok());
  ASSERT_EQ(r1->size(), r2->size());
  for (size_t i = 0; i < r1->size(); ++i) {
    const std::string label = std::string(model) + " " + (*r1)[i].label;
    expect_within_se((*r1)[i].metrics, (*r2)[i].metrics, label);
    if (i > 0) EXPECT_GT((*r2)[i].metrics.mean_kl(), 1e-7) << label;  // lossy at tp 2 too
  }
  // The noise floor is far below every lossy candidate on both.
  EXPECT_LT((*r2)[0].metrics.mean_kl(), 0.1 * (*r2)[1].metrics.mean_kl());
  EXPECT_EQ(two->deployment()["tp_size"], 2);
}

TEST_F(KvEvalTp, Tp2EqualsTp1WithinStandardErrorsOnHouseLlama) {
  tp2_matches_tp1("house-llama", false);
}
TEST_F(KvEvalTp, Tp2EqualsTp1WithinStandardErrorsOnHouseMla) { tp2_matches_tp1("house-mla", true); }

TEST_F(KvEvalTp, ResumedRunGivesTheUninterruptedRecord) {
  const std::string ckpt =
      (fs::temp_directory_path() / ("strata_kv_ckpt_" + std::to_string(::getpid()))).string();
  fs::remove(ckpt);
  EvalKvOptions o = options("house-llama", 1, 4 * 63);
  o.checkpoint_path = ckpt;
  o.stop_after_windows = 2;
  auto full = make(options("house-llama", 1, 4 * 63));
  ASSERT_TRUE(full);
  const auto cands = candidates(*full, false);
  auto want = full->compare(cands, true, true, nullptr, -1, true);
  ASSERT_TRUE(want.ok());

  bool stopped = false;
  {
    auto first = make(o);
    auto part = first->compare(cands, true, true, nullptr, -1, true, &stopped);
    ASSERT_TRUE(part.ok()) << part.status().to_string();
    EXPECT_TRUE(stopped);
    EXPECT_EQ((*part)[1].metrics.tokens(), 2 * 63);
  }
  // A torn record after the finished group (killed while writing) is dropped.
  std::ofstream(ckpt, std::ios::app | std::ios::binary) << "KVG1partial";

  o.stop_after_windows = 0;
  auto second = make(o);
  std::vector<int64_t> reported;
  second->set_progress([&](const std::string& what, int64_t done, int64_t) {
    if (what == "teacher forcing") reported.push_back(done);
  });
  auto got = second->compare(cands, true, true, nullptr, -1, true, &stopped);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_FALSE(stopped);
  EXPECT_EQ(reported, (std::vector<int64_t>{4 * 63}));  // only the second group was computed
  ASSERT_EQ(got->size(), want->size());
  for (size_t i = 0; i < got->size(); ++i) {
    EXPECT_EQ((*got)[i].metrics.to_json(), (*want)[i].metrics.to_json()) << (*got)[i].label;
    EXPECT_EQ((*got)[i].free_run.to_json(), (*want)[i].free_run.to_json()) << (*got)[i].label;
  }

  // The same file for another evaluation (another chunk) is refused, not mixed in.
  EvalKvOptions other = o;
  other.chunk = 8;
  auto third = make(other);
  auto refused = third->compare(cands, true, true, nullptr, -1, true);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument) << refused.status().to_string();
  fs::remove(ckpt);
}

}  // namespace
}  // namespace strata
