// Speculative decoding through the whole engine on house-llama (CPU reference, which is batch
// invariant): with NGRAM drafts, greedy outputs are token for token those of plain decoding at
// batch 1 and 64, with chunked prefill and with retraction forced by a small pool; per-request
// settings (penalties, logit_bias, stop tokens and strings, max_tokens, logprobs) give the same
// results; a seeded sampled request is reproducible in any batch; drafts are accepted on a
// repetitive prompt; the pool and the prefix cache end consistent (only committed tokens cached:
// continuing from cached prefixes gives plain decoding's tokens).
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "support/heldout_prompts.h"

namespace strata {
namespace {

const std::string kShared = STRATA_SHARED_DIR;

std::vector<std::vector<int32_t>> heldout_prompts(const Tokenizer& tok, int count) {
  return testing::heldout_token_prompts(tok, count);
}

struct EngineOptions {
  bool speculative = false;
  bool capture = false;  // hidden-state capture of layers 1 and 3 for requests that ask
  int num_steps = 3;
  std::optional<int> max_running{};
  std::optional<int64_t> max_total_tokens{};
  double conservativeness = 1.0;
};

std::unique_ptr<Engine> make_engine(const EngineOptions& o) {
  EngineConfig c;
  c.model_path = kShared + "/models/house-llama";
  c.page_size = 4;
  c.chunked_prefill_size = 64;  // prompts up to ~110 tokens: chunked prefill is exercised
  c.max_running_requests = o.max_running;
  c.max_total_tokens = o.max_total_tokens;
  c.schedule_conservativeness = o.conservativeness;
  if (o.capture) c.capture = CaptureSpec{.layers = {1, 3}, .final_norm = true};
  if (o.speculative) {
    c.speculative.algorithm = SpeculativeAlgorithm::kNgram;
    c.speculative.num_steps = o.num_steps;
  }
  auto e = Engine::create(c);
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  return e.ok() ? std::move(e).value() : nullptr;
}

struct Result {
  std::vector<int32_t> tokens;
  std::string text;
  std::vector<TokenLogprobs> logprobs;
  std::vector<TokenLogprobs> prompt_logprobs;
  FinishReason finish = FinishReason::kNone;
  int32_t completion_tokens = 0;
  int32_t accepted = 0, drafted = 0, verifies = 0;
  int32_t last_event_completion = 0;
};

struct Job {
  std::vector<int32_t> prompt;
  SamplingParams params;
  int top_logprobs = -1;
  int32_t prompt_logprobs_from = -1;
};

std::vector<Result> run(Engine& engine, const std::vector<Job>& jobs, bool one_at_a_time = false) {
  std::vector<Result> out(jobs.size());
  std::mutex mu;
  for (size_t i = 0; i < jobs.size(); ++i) {
    GenerateRequest g;
    g.prompt_ids = jobs[i].prompt;
    g.params = jobs[i].params;
    g.top_logprobs = jobs[i].top_logprobs;
    g.prompt_logprobs_from = jobs[i].prompt_logprobs_from;
    g.on_event = [&out, &mu, i](const StreamEvent& ev) {
      std::lock_guard<std::mutex> lk(mu);
      Result& r = out[i];
      if (ev.prompt_logprobs_from > 0) r.prompt_logprobs = ev.prompt_logprobs;
      r.tokens.insert(r.tokens.end(), ev.token_ids.begin(), ev.token_ids.end());
      r.logprobs.insert(r.logprobs.end(), ev.logprobs.begin(), ev.logprobs.end());
      r.text += ev.text;
      EXPECT_TRUE(ev.error.empty()) << ev.error;
      if (!ev.token_ids.empty()) {
        // Each event's count is the tokens streamed so far, also inside a verify step.
        EXPECT_EQ(ev.completion_tokens, int32_t(r.tokens.size()));
        r.last_event_completion = ev.completion_tokens;
      }
      if (ev.finished) {
        r.finish = ev.finish_reason;
        r.completion_tokens = ev.completion_tokens;
        r.accepted = ev.spec_accept_token_num;
        r.drafted = ev.spec_draft_token_num;
        r.verifies = ev.spec_verify_ct;
      }
    };
    auto id = engine.submit(std::move(g));
    EXPECT_TRUE(id.ok()) << id.status().to_string();
    if (one_at_a_time) engine.wait_idle();
  }
  engine.wait_idle();
  return out;
}

std::vector<Job> greedy_jobs(const std::vector<std::vector<int32_t>>& prompts, int new_tokens) {
  std::vector<Job> jobs;
  for (const auto& p : prompts) {
    Job j{.prompt = p};
    j.params.temperature = 0;
    j.params.max_new_tokens = new_tokens;
    j.params.ignore_eos = true;
    jobs.push_back(std::move(j));
  }
  return jobs;
}

void expect_same_tokens(const std::vector<Result>& got, const std::vector<Result>& want,
                        const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << what << ": request " << i;
    EXPECT_EQ(got[i].completion_tokens, want[i].completion_tokens) << what << ": request " << i;
    EXPECT_EQ(got[i].finish, want[i].finish) << what << ": request " << i;
  }
}

TEST(SpeculativeEngine, GreedyEqualsPlainDecodingAtBatch1And64WithRetraction) {
  const int kNew = 40;
  auto plain = make_engine({});
  ASSERT_TRUE(plain);
  const auto prompts = heldout_prompts(plain->tokenizer(), 64);
  ASSERT_EQ(prompts.size(), 64u);
  const auto jobs = greedy_jobs(prompts, kNew);
  const std::vector<Result> want = run(*plain, jobs);
  plain.reset();

  // Batch 1: one request at a time.
  {
    auto spec = make_engine({.speculative = true, .max_running = 1});
    const std::vector<Job> some(jobs.begin(), jobs.begin() + 16);
    const std::vector<Result> got = run(*spec, some, /*one_at_a_time=*/true);
    expect_same_tokens(got, std::vector<Result>(want.begin(), want.begin() + 16), "batch 1");
    const EngineStats s = spec->stats();
    EXPECT_GT(s.spec_verify_total, 0);
    EXPECT_GT(s.spec_accepted_tokens_total, 0) << "NGRAM accepted nothing in 16 x 40 tokens";
  }
  // Batch 64.
  {
    auto spec = make_engine({.speculative = true});
    const std::vector<Result> got = run(*spec, jobs);
    expect_same_tokens(got, want, "batch 64");
    const EngineStats s = spec->stats();
    int64_t accepted = 0, drafted = 0, verifies = 0;
    for (const Result& r : got) {
      accepted += r.accepted;
      drafted += r.drafted;
      verifies += r.verifies;
    }
    EXPECT_EQ(accepted, s.spec_accepted_tokens_total);
    EXPECT_EQ(drafted, s.spec_draft_tokens_total);
    EXPECT_EQ(verifies, s.spec_verify_total);
    int64_t hist_verifies = 0, hist_accepted = 0;
    for (size_t len = 1; len < s.spec_accept_length_counts.size(); ++len) {
      hist_verifies += s.spec_accept_length_counts[len];
      hist_accepted += s.spec_accept_length_counts[len] * int64_t(len - 1);
    }
    EXPECT_EQ(hist_verifies, s.spec_verify_total);
    EXPECT_EQ(hist_accepted, s.spec_accepted_tokens_total);
    EXPECT_EQ(s.generation_tokens_total, 64 * kNew);
    // Every page is free or cached; with the cache flushed, every page is free.
    EXPECT_EQ(s.kv_tokens_used, s.kv_tokens_cached);
    ASSERT_TRUE(spec->flush_cache());
    EXPECT_EQ(spec->stats().kv_tokens_used, 0);
  }
  // A pool of 640 tokens and an optimistic reservation: requests are retracted mid-decode.
  {
    auto spec =
        make_engine({.speculative = true, .max_total_tokens = 640, .conservativeness = 0.02});
    const std::vector<Result> got = run(*spec, jobs);
    expect_same_tokens(got, want, "retraction");
    const EngineStats s = spec->stats();
    EXPECT_GT(s.retractions_total, 0) << "the small pool was meant to force retraction";
    EXPECT_GT(s.spec_accepted_tokens_total, 0);
    EXPECT_EQ(s.kv_tokens_used, s.kv_tokens_cached);
    ASSERT_TRUE(spec->flush_cache());
    EXPECT_EQ(spec->stats().kv_tokens_used, 0);
  }
}

// Prompt logprobs (completions echo) beside speculation: a prefill's scoring rows come before its
// sampled row, which the drafter's first verify follows; the prompts' logprobs and the greedy
// tokens equal plain decoding's, in one batch with chunked prefill.
TEST(SpeculativeEngine, PromptLogprobsAreThoseOfPlainDecoding) {
  auto plain = make_engine({});
  auto spec = make_engine({.speculative = true});
  ASSERT_TRUE(plain && spec);
  std::vector<Job> jobs = greedy_jobs(heldout_prompts(plain->tokenizer(), 6), 24);
  for (size_t i = 0; i < jobs.size(); ++i) {
    jobs[i].top_logprobs = 2;
    jobs[i].prompt_logprobs_from = i % 2 == 0 ? 0 : 5;
  }
  const std::vector<Result> want = run(*plain, jobs), got = run(*spec, jobs);
  expect_same_tokens(got, want, "prompt logprobs");
  for (size_t i = 0; i < jobs.size(); ++i) {
    ASSERT_EQ(want[i].prompt_logprobs.size(),
              jobs[i].prompt.size() - size_t(std::max(1, jobs[i].prompt_logprobs_from)));
    ASSERT_EQ(got[i].prompt_logprobs.size(), want[i].prompt_logprobs.size()) << i;
    for (size_t k = 0; k < got[i].prompt_logprobs.size(); ++k) {
      EXPECT_NEAR(got[i].prompt_logprobs[k].logprob, want[i].prompt_logprobs[k].logprob, 1e-5)
          << "request " << i << " token " << k;
      EXPECT_EQ(got[i].prompt_logprobs[k].top[0].first, want[i].prompt_logprobs[k].top[0].first);
    }
  }
  int64_t drafted = 0;
  for (const Result& r : got) drafted += r.drafted;
  EXPECT_GT(drafted, 0);  // speculation ran
}

TEST(SpeculativeEngine, RepetitivePromptAcceptsDraftsAndStaysExact) {
  auto plain = make_engine({});
  auto spec = make_engine({.speculative = true, .num_steps = 5});
  // house-llama counts on, then repeats itself: what NGRAM drafts well (accept len ~3.3 at 4
  // steps when this test was written).
  const std::string text = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,";
  const auto jobs = greedy_jobs({plain->tokenizer().encode(text)}, 64);
  const std::vector<Result> want = run(*plain, jobs);
  const std::vector<Result> got = run(*spec, jobs);
  expect_same_tokens(got, want, "repetitive");
  ASSERT_GT(got[0].verifies, 0);
  const double accept_len = double(got[0].accepted + got[0].verifies) / double(got[0].verifies);
  std::printf("repetitive prompt: %d verifies, %d drafted, %d accepted, accept len %.2f\n",
              got[0].verifies, got[0].drafted, got[0].accepted, accept_len);
  EXPECT_GT(got[0].accepted, 0);
  EXPECT_GT(accept_len, 2.0);
}

// Penalties, logit_bias, stop tokens and strings, max_tokens and logprobs: the same results with
// and without speculation (each verify row sees the drafts before it as output).
TEST(SpeculativeEngine, PerRequestSettingsGiveTheSameResults) {
  auto plain = make_engine({});
  auto spec = make_engine({.speculative = true, .num_steps = 4});
  const auto prompts = heldout_prompts(plain->tokenizer(), 8);
  const std::string loop = "one two three one two three one two three one two three one two";
  std::vector<Job> jobs;
  auto greedy = [](int n) {
    SamplingParams p;
    p.temperature = 0;
    p.max_new_tokens = n;
    p.ignore_eos = true;
    return p;
  };
  const auto loop_ids = plain->tokenizer().encode(loop);
  {
    Job j{.prompt = loop_ids, .params = greedy(30)};
    j.params.repetition_penalty = 1.3f;
    j.params.frequency_penalty = 0.4f;
    jobs.push_back(j);
  }
  {
    Job j{.prompt = loop_ids, .params = greedy(30)};
    j.params.presence_penalty = 0.7f;
    j.params.logit_bias = {{loop_ids[1], 3.0f}, {loop_ids[2], -100.0f}};
    jobs.push_back(j);
  }
  {
    Job j{.prompt = loop_ids, .params = greedy(30), .top_logprobs = 3};
    jobs.push_back(j);
  }
  {
    Job j{.prompt = loop_ids, .params = greedy(7)};  // max_tokens inside a verify step
    jobs.push_back(j);
  }
  for (const auto& p : prompts) jobs.push_back(Job{.prompt = p, .params = greedy(24)});
  const std::vector<Result> base = run(*plain, jobs);
  // Stop tokens and strings taken from the middle of the plain outputs of the loop prompt.
  {
    Job j{.prompt = loop_ids, .params = greedy(30)};
    j.params.stop_token_ids = {base[2].tokens[9]};
    jobs.push_back(j);
  }
  {
    Job j{.prompt = loop_ids, .params = greedy(30)};
    ASSERT_GT(base[2].text.size(), 20u);
    j.params.stop_strings = {base[2].text.substr(12, 5)};
    jobs.push_back(j);
  }
  const std::vector<Result> want = run(*plain, jobs);
  const std::vector<Result> got = run(*spec, jobs);
  expect_same_tokens(got, want, "settings");
  int64_t accepted = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].text, want[i].text) << i;
    ASSERT_EQ(got[i].logprobs.size(), want[i].logprobs.size()) << i;
    for (size_t t = 0; t < got[i].logprobs.size(); ++t) {
      EXPECT_EQ(got[i].logprobs[t].logprob, want[i].logprobs[t].logprob) << i << " " << t;
      EXPECT_EQ(got[i].logprobs[t].top, want[i].logprobs[t].top) << i << " " << t;
    }
    accepted += got[i].accepted;
  }
  EXPECT_EQ(want.back().finish, FinishReason::kStop);
  EXPECT_EQ(want[want.size() - 2].finish, FinishReason::kStop);
  EXPECT_LT(want.back().tokens.size(), 30u);
  EXPECT_GT(accepted, 0);
}

// Sampled requests draw, for each output position, the draw plain decoding gives it: seeded and
// unseeded (the engine's per-request streams) requests produce plain decoding's tokens, with
// penalties too, alone and in a batch.
TEST(SpeculativeEngine, SampledRequestsGivePlainDecodingsTokens) {
  auto plain = make_engine({});
  auto spec = make_engine({.speculative = true});
  const auto loop = spec->tokenizer().encode(
      "the cat sat on the mat and the cat sat on the mat and the cat sat on the mat and the");
  const auto prompts = heldout_prompts(spec->tokenizer(), 7);
  Job seeded{.prompt = loop};
  seeded.params.temperature = 0.9f;
  seeded.params.top_p = 0.95f;
  seeded.params.max_new_tokens = 40;
  seeded.params.ignore_eos = true;
  seeded.params.seed = 77;
  std::vector<Job> batch{seeded};
  for (const auto& p : prompts) {
    Job j{.prompt = p};
    j.params.temperature = 1.0f;
    j.params.top_k = 20;
    j.params.max_new_tokens = 30;
    j.params.ignore_eos = true;
    j.params.repetition_penalty = 1.1f;
    batch.push_back(j);
  }
  Job loop_unseeded = batch[1];
  loop_unseeded.prompt = loop;
  loop_unseeded.params.temperature = 0.5f;
  batch.push_back(loop_unseeded);
  const std::vector<Result> alone = run(*spec, {seeded});
  const std::vector<Result> batched = run(*spec, batch);
  EXPECT_EQ(batched[0].tokens, alone[0].tokens);
  EXPECT_GT(alone[0].verifies, 0);
  EXPECT_GT(batched[0].accepted + batched.back().accepted, 0);
  // The plain engine numbers its requests the same way (the unseeded requests' streams).
  ASSERT_EQ(run(*plain, {seeded})[0].tokens, alone[0].tokens);
  const std::vector<Result> want = run(*plain, batch);
  expect_same_tokens(batched, want, "sampled");
}

// The prefix cache holds committed tokens only: prompts that continue finished outputs hit the
// cache, and their continuations equal a fresh plain engine's.
TEST(SpeculativeEngine, CachedPrefixesAfterSpeculationAreCommittedTokens) {
  auto spec = make_engine({.speculative = true, .num_steps = 4});
  const auto prompts = heldout_prompts(spec->tokenizer(), 8);
  const std::vector<Result> first = run(*spec, greedy_jobs(prompts, 32));
  std::vector<std::vector<int32_t>> longer;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto p = prompts[i];
    p.insert(p.end(), first[i].tokens.begin(), first[i].tokens.begin() + 20);
    longer.push_back(p);
  }
  const int64_t hits_before = spec->stats().cache_hit_tokens_total;
  const std::vector<Result> again = run(*spec, greedy_jobs(longer, 16));
  EXPECT_GT(spec->stats().cache_hit_tokens_total - hits_before, 8 * 16);
  auto plain = make_engine({});
  const std::vector<Result> want = run(*plain, greedy_jobs(longer, 16));
  expect_same_tokens(again, want, "from cached prefixes");
}

// Hidden-state capture (drafter training data) under speculation: every position's captured row
// equals plain decoding's; rejected drafts' rows never reach the request's CapturedStates.
TEST(SpeculativeEngine, CapturedStatesAreThoseOfPlainDecoding) {
  auto capture_all = [](Engine& engine, const std::vector<int32_t>& prompt) {
    auto states = std::make_shared<CapturedStates>(DType::kF32);
    GenerateRequest g;
    g.prompt_ids = prompt;
    g.params.temperature = 0;
    g.params.max_new_tokens = 40;
    g.params.ignore_eos = true;
    g.capture = states;
    g.use_prefix_cache = false;
    std::vector<int32_t> out;
    std::mutex mu;
    g.on_event = [&](const StreamEvent& ev) {
      std::lock_guard<std::mutex> lk(mu);
      out.insert(out.end(), ev.token_ids.begin(), ev.token_ids.end());
    };
    EXPECT_TRUE(engine.submit(std::move(g)).ok());
    engine.wait_idle();
    return std::make_pair(out, states);
  };
  auto plain = make_engine({.capture = true});
  auto spec = make_engine({.speculative = true, .capture = true, .num_steps = 4});
  const auto prompt = plain->tokenizer().encode("1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,");
  auto [want_tokens, want] = capture_all(*plain, prompt);
  auto [got_tokens, got] = capture_all(*spec, prompt);
  ASSERT_EQ(got_tokens, want_tokens);
  EXPECT_GT(spec->stats().spec_accepted_tokens_total, 0);
  const int64_t n = int64_t(prompt.size() + want_tokens.size()) - 1;  // the last is never computed
  ASSERT_TRUE(want->complete(n));
  ASSERT_TRUE(got->complete(n));
  for (int64_t pos = 0; pos < n; ++pos)
    ASSERT_EQ(0, std::memcmp(got->row(pos), want->row(pos), size_t(want->width() * 4))) << pos;
  // Nothing past the committed positions: a rejected draft's row would sit there.
  for (int64_t pos = n; pos < got->rows(); ++pos) EXPECT_FALSE(got->has(pos)) << pos;
}

// The same at batch 24 (and again with a pool small enough to retract requests mid-decode, whose
// positions are then captured again): each step's block holds many requests' rows, verifies with
// and without accepted drafts side by side, and goes to the capture writer's thread
// (engine/capture_writer.h) with only each request's committed rows. The CPU reference is batch
// invariant, so every row is bitwise plain decoding's at batch 24.
// A spill of each row's first value that logs the positions in the order they were written.
class PositionLog final : public RowSpill {
 public:
  int64_t prefix_bytes() const override { return 4; }
  void write(int64_t pos, const uint8_t* prefix) override {
    positions.push_back(pos);  // the capture writer's threads, one at a time for a request
    if (pos >= int64_t(firsts.size())) firsts.resize(size_t(pos) + 1);
    std::memcpy(&firsts[size_t(pos)], prefix, 4);
  }
  std::vector<int64_t> positions;
  std::vector<float> firsts;  // each position's last written first value
};

TEST(SpeculativeEngine, BatchedCaptureStoresPlainDecodingsRows) {
  struct Captured {
    std::vector<int32_t> tokens;
    std::shared_ptr<CapturedStates> states;
    std::shared_ptr<PositionLog> spill;
  };
  auto capture_batch = [](Engine& engine, const std::vector<std::vector<int32_t>>& prompts) {
    std::vector<Captured> out(prompts.size());
    std::mutex mu;
    for (size_t i = 0; i < prompts.size(); ++i) {
      out[i].spill = std::make_shared<PositionLog>();
      out[i].states = std::make_shared<CapturedStates>(DType::kF32, out[i].spill);
      GenerateRequest g;
      g.prompt_ids = prompts[i];
      g.use_prefix_cache = false;  // every position computed (and spilled) by each run
      g.params.temperature = 0;
      g.params.max_new_tokens = 32;
      g.params.ignore_eos = true;
      g.capture = out[i].states;
      g.on_event = [&out, &mu, i](const StreamEvent& ev) {
        std::lock_guard<std::mutex> lk(mu);
        out[i].tokens.insert(out[i].tokens.end(), ev.token_ids.begin(), ev.token_ids.end());
      };
      EXPECT_TRUE(engine.submit(std::move(g)).ok());
    }
    engine.wait_idle();
    return out;
  };
  auto plain = make_engine({.capture = true});
  auto prompts = heldout_prompts(plain->tokenizer(), 22);
  // Two that NGRAM drafts well, so that some verifies accept drafts and others reject them.
  prompts.push_back(plain->tokenizer().encode("1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"));
  prompts.push_back(plain->tokenizer().encode("a b c a b c a b c a b c a b c"));
  const std::vector<Captured> want = capture_batch(*plain, prompts);
  plain.reset();
  const EngineOptions batched{.speculative = true, .capture = true, .num_steps = 4};
  EngineOptions retracting = batched;
  retracting.max_total_tokens = 640;
  retracting.conservativeness = 0.02;
  for (const EngineOptions& o : {batched, retracting}) {
    const bool retract = o.max_total_tokens.has_value();
    SCOPED_TRACE(retract ? "small pool (retraction)" : "batch 24");
    auto spec = make_engine(o);
    const std::vector<Captured> got = capture_batch(*spec, prompts);
    const EngineStats s = spec->stats();
    EXPECT_GT(s.spec_accepted_tokens_total, 0);
    EXPECT_LT(s.spec_accepted_tokens_total, s.spec_draft_tokens_total) << "no draft was rejected";
    if (retract) {
      EXPECT_GT(s.retractions_total, 0) << "the small pool was meant to retract";
    }
    for (size_t i = 0; i < prompts.size(); ++i) {
      ASSERT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
      // Every position but the last token's (never computed).
      const int64_t n = int64_t(prompts[i].size() + want[i].tokens.size()) - 1;
      ASSERT_TRUE(want[i].states->complete(n)) << "request " << i;
      ASSERT_TRUE(got[i].states->complete(n)) << "request " << i;
      ASSERT_EQ(got[i].states->width(), want[i].states->width());
      // The spill took each row's first value; memory keeps the rest.
      const size_t kept_bytes = size_t(want[i].states->width() * 4 - 4);
      for (int64_t pos = 0; pos < n; ++pos) {
        ASSERT_EQ(0, std::memcmp(got[i].states->row(pos), want[i].states->row(pos), kept_bytes))
            << "request " << i << " position " << pos;
        ASSERT_EQ(got[i].spill->firsts[size_t(pos)], want[i].spill->firsts[size_t(pos)])
            << "request " << i << " position " << pos;
      }
      for (int64_t pos = n; pos < got[i].states->rows(); ++pos)
        EXPECT_FALSE(got[i].states->has(pos)) << "request " << i << ": a rejected draft's row";
      // Without retraction every position is written once, in order, as plain decoding writes
      // them: a rejected draft's row (later overwritten by the right one) would show here.
      if (!retract) {
        EXPECT_EQ(got[i].spill->positions, want[i].spill->positions) << "request " << i;
      }
    }
  }
}

}  // namespace
}  // namespace strata
