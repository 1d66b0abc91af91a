// Capture through the engine (EngineTarget with CaptureOptions; engine/model_runner.h): on the CPU
// reference with house-llama, each generated record's states at every position of prompt +
// response equal one teacher-forced prefill over the same tokens (several records batched
// together, prefill and decode steps mixed, the last token from the one-token tail request); the
// loss mask is 1 exactly on assistant turns; --capture-only keeps the conversation and captures it.
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstdio>
#include <mutex>

#include "dist/tensor_parallel.h"
#include "engine/engine.h"
#include "pipeline/engine_target.h"

namespace strata {
namespace {

const std::string kModel = std::string(STRATA_SHARED_DIR) + "/models/house-llama";

struct Outcomes {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, GenerationOutcome> done;
  OutcomeCallback callback(const std::string& id) {
    return [this, id](GenerationOutcome o) {
      std::lock_guard<std::mutex> lk(mu);
      done[id] = std::move(o);
      cv.notify_all();
    };
  }
  void wait(size_t n) {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return done.size() >= n; });
  }
};

// `messages` must be an array: callers pass nlohmann::json::array(...), since a braced list of one
// json value is that value under clang and a one-element array under gcc.
PromptRecord record(const std::string& id, nlohmann::json messages) {
  PromptRecord r;
  r.id = id;
  r.messages = std::move(messages);
  r.original = {{"id", id}, {"conversations", r.messages}};
  return r;
}

nlohmann::json msg(const std::string& role, const std::string& content) {
  return {{"role", role}, {"content", content}};
}

class CaptureEngine : public ::testing::Test {
 protected:
  void SetUp() override {
    EngineConfig c;
    c.model_path = kModel;
    c.device_memory_gib = 1;
    c.chunked_prefill_size = 64;  // long prompts take several chunks
    c.max_prefill_tokens = 64;
    c.capture.layers = eagle3_default_layers(8);
    c.capture.final_norm = true;
    auto e = Engine::create(c);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    engine_ = std::move(e).value();
    opts_.enabled = true;
    opts_.layers = c.capture.layers;
    opts_.hidden_size = engine_->spec().hidden_size;
    opts_.dtype = DType::kF32;  // exact: compared within float tolerance
  }
  // The states of one prefill over `ids` (no prefix cache: every position computed).
  std::shared_ptr<CapturedStates> prefill_states(const std::vector<int32_t>& ids) {
    return prefill_states(*engine_, ids);
  }
  static std::shared_ptr<CapturedStates> prefill_states(Engine& engine,
                                                        const std::vector<int32_t>& ids) {
    auto states = std::make_shared<CapturedStates>(DType::kF32);
    GenerateRequest g;
    g.prompt_ids = ids;
    g.params = SamplingParams{.temperature = 0.0f, .seed = 0};
    g.params.max_new_tokens = 1;
    g.capture = states;
    g.use_prefix_cache = false;
    std::mutex mu;
    std::condition_variable cv;
    bool finished = false;
    g.on_event = [&](const StreamEvent& ev) {
      if (!ev.finished) return;
      std::lock_guard<std::mutex> lk(mu);
      finished = true;
      cv.notify_all();
    };
    EXPECT_TRUE(engine.submit(std::move(g)).ok());
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return finished; });
    return states;
  }

  std::unique_ptr<Engine> engine_;
  CaptureOptions opts_;
};

double max_rel_diff(const CapturedStates& a, const CapturedStates& b, int64_t rows) {
  double num = 0, den = 0;
  for (int64_t p = 0; p < rows; ++p) {
    const float* x = reinterpret_cast<const float*>(a.row(p));
    const float* y = reinterpret_cast<const float*>(b.row(p));
    for (int64_t i = 0; i < a.width(); ++i) {
      num = std::max(num, double(std::fabs(x[i] - y[i])));
      den = std::max(den, double(std::fabs(y[i])));
    }
  }
  return num / den;
}

TEST_F(CaptureEngine, GeneratedRecordsEqualAPrefillOverPromptAndResponse) {
  JobSampling sampling;
  sampling.params.max_new_tokens = 12;
  auto target = EngineTarget::create(*engine_, sampling, 0, opts_);
  ASSERT_TRUE(target.ok()) << target.status().to_string();
  std::string long_text;
  for (int i = 0; i < 40; ++i) long_text += "word" + std::to_string(i) + " ";
  std::vector<PromptRecord> records = {
      record("short", nlohmann::json::array({msg("user", "What does the word \"Cavity\" mean?")})),
      record("long", nlohmann::json::array({msg("user", long_text)})),
      record("multi", {msg("user", "Define \"Brookside\"."),
                       msg("assistant", "A place by a brook."), msg("user", "And \"Abort\"?")}),
  };
  Outcomes out;
  std::vector<GenerationTask> tasks(records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    tasks[i] = GenerationTask{.dataset = "d", .record = &records[i], .seed = 7};
    (*target)->start(tasks[i], out.callback(records[i].id));
  }
  out.wait(records.size());
  for (const PromptRecord& r : records) {
    const GenerationOutcome& o = out.done.at(r.id);
    ASSERT_EQ(o.kind, OutcomeKind::kDone) << r.id << ": " << o.error;
    ASSERT_TRUE(o.hidden) << r.id;
    const CapturedRecord& rec = *o.hidden;
    const int64_t n = int64_t(rec.input_ids.size());
    EXPECT_EQ(n, o.prompt_tokens + o.completion_tokens) << r.id;
    ASSERT_TRUE(rec.states->complete(n)) << r.id;
    EXPECT_EQ(rec.states->width(), 4 * opts_.hidden_size);
    auto reference = prefill_states(rec.input_ids);
    ASSERT_TRUE(reference->complete(n));
    const double err = max_rel_diff(*rec.states, *reference, n);
    EXPECT_LT(err, 1e-5) << r.id;
    std::printf("%s: %lld positions, generated vs prefill rel max diff %.3g\n", r.id.c_str(),
                (long long)n, err);
    // The response is masked; the prompt is not, except an earlier assistant turn.
    for (int64_t p = o.prompt_tokens; p < n; ++p)
      EXPECT_EQ(rec.loss_mask[size_t(p)], 1) << r.id << " " << p;
    int64_t prompt_masked = 0;
    for (int64_t p = 0; p < o.prompt_tokens; ++p) prompt_masked += rec.loss_mask[size_t(p)];
    if (r.id != "multi") {
      EXPECT_EQ(prompt_masked, 0) << r.id;
    } else {
      // "A place by a brook.<|im_end|>\n": the earlier assistant turn's content and end of turn.
      std::vector<int32_t> masked;
      for (int64_t p = 0; p < o.prompt_tokens; ++p)
        if (rec.loss_mask[size_t(p)]) masked.push_back(rec.input_ids[size_t(p)]);
      EXPECT_EQ(engine_->tokenizer().decode(masked), "A place by a brook.<|im_end|>\n");
    }
  }
}

TEST_F(CaptureEngine, CaptureOnlyKeepsTheConversationAndCapturesEveryPosition) {
  opts_.capture_only = true;
  auto target = EngineTarget::create(*engine_, JobSampling{}, 0, opts_);
  ASSERT_TRUE(target.ok());
  PromptRecord r =
      record("conv", {msg("user", "Define \"Brookside\"."), msg("assistant", "A place by a brook."),
                      msg("user", "And \"Abort\"?"), msg("assistant", "To stop early.")});
  Outcomes out;
  GenerationTask task{.dataset = "d", .record = &r, .seed = 1};
  (*target)->start(task, out.callback("conv"));
  out.wait(1);
  const GenerationOutcome& o = out.done.at("conv");
  ASSERT_EQ(o.kind, OutcomeKind::kDone) << o.error;
  EXPECT_TRUE(o.teacher_forced);
  ASSERT_TRUE(o.hidden);
  const CapturedRecord& rec = *o.hidden;
  const int64_t n = int64_t(rec.input_ids.size());
  EXPECT_EQ(n, o.prompt_tokens);
  EXPECT_EQ(engine_->tokenizer().decode(rec.input_ids),
            "<|im_start|>user\nDefine \"Brookside\".<|im_end|>\n<|im_start|>assistant\nA place by "
            "a brook.<|im_end|>\n"
            "<|im_start|>user\nAnd \"Abort\"?<|im_end|>\n<|im_start|>assistant\nTo stop "
            "early.<|im_end|>\n");
  std::vector<int32_t> masked;
  for (int64_t p = 0; p < n; ++p)
    if (rec.loss_mask[size_t(p)]) masked.push_back(rec.input_ids[size_t(p)]);
  EXPECT_EQ(engine_->tokenizer().decode(masked),
            "A place by a brook.<|im_end|>\nTo stop early.<|im_end|>\n");
  auto reference = prefill_states(rec.input_ids);
  EXPECT_LT(max_rel_diff(*rec.states, *reference, n), 1e-6);
}

// Under tensor parallelism rank 0's model captures (dist/tp_driver.cc forwards set_capture; after
// each all-reduce its residual stream is the whole hidden state): the states of a tp 2 prefill
// equal tp 1's within the all-reduce's float reordering.
TEST_F(CaptureEngine, TensorParallelCaptureEqualsOneRank) {
  EngineConfig c;
  c.model_path = kModel;
  c.device_memory_gib = 1;
  c.tp_size = 2;
  c.tp_allow_uneven = true;  // house-llama's 5 heads
  c.chunked_prefill_size = 64;
  c.max_prefill_tokens = 64;
  c.capture.layers = eagle3_default_layers(8);
  c.capture.final_norm = true;
  auto tp = Engine::create(c, &tensor_parallel_runtime());
  ASSERT_TRUE(tp.ok()) << tp.status().to_string();
  std::vector<int32_t> ids;
  for (int i = 0; i < 150; ++i) ids.push_back(int32_t((i * 7919 + 13) % 8000));
  auto one = prefill_states(ids);
  auto two = prefill_states(**tp, ids);
  const int64_t n = int64_t(ids.size());
  ASSERT_TRUE(one->complete(n));
  ASSERT_TRUE(two->complete(n));
  ASSERT_EQ(two->width(), one->width());
  const double d = max_rel_diff(*two, *one, n);
  std::printf("capture tp 2 vs tp 1: max relative difference %.3g over %lld positions\n", d,
              (long long)n);
  EXPECT_LT(d, 1e-5);
}

}  // namespace
}  // namespace strata
