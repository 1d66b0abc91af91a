// EAGLE-3 speculative decoding through the whole engine on house-llama with the committed drafter
// (tests/fixtures/eagle3/house-llama), on the CPU reference (batch invariant), on chat prompts
// the drafter never saw (support/eagle3_heldout.h):
//  - greedy outputs are token for token those of plain decoding at batch 1 and 64, with chunked
//    prefill and with retraction forced by a small pool, and drafts are accepted (accept length
//    > 1), for a chain (3 steps, topk 1) and draft trees (3 steps topk 4 with 8 draft tokens,
//    SGLang's 5 steps topk 8 with 32); a tree's accept length is at least the chain's;
//  - every proposal the engine's drafter makes equals a direct chain of Eagle3Drafter forwards on
//    the same context (the target's captured states of the whole context, one first-step forward,
//    then draft steps), and every tree proposal equals the tree built from direct chains along
//    each node's path (DraftTreeBuilder fed their top-k): the wiring (positions, pages, captured
//    rows, next tokens, the drafter's tree mask and scratch pages, the accepted path's rows) is
//    checked, not only the output, which verification keeps exact whatever is proposed;
//  - seeded sampled requests give plain decoding's tokens (each output position's draw), chain
//    and tree;
//  - verifies are padded to a fixed number of rows (engine/spec/verify_shape.h) near requests'
//    limits, and the outputs stay plain decoding's;
//  - --speculative-batch-size-threshold: above it steps run plain, below it speculation resumes,
//    with greedy outputs unchanged and proposals after a pause equal to the direct drafter's;
//  - a missing or mismatched drafter and trees out of bounds are refused with clear errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>
#include <span>

#include "arch/eagle3.h"
#include "arch/model.h"
#include "engine/engine.h"
#include "engine/spec/draft_tree.h"
#include "engine/spec/eagle3_drafter.h"
#include "support/eagle3_check.h"
#include "support/eagle3_heldout.h"
#include "support/temp_dir.h"

namespace strata {
namespace {

const std::string kTarget = std::string(STRATA_SHARED_DIR) + "/models/house-llama";
const std::string kDrafter = STRATA_REPO_FIXTURES_DIR "/eagle3/house-llama";

struct Options {
  int num_steps = 3;
  std::optional<int> max_running{};
  std::optional<int64_t> max_total_tokens{};
  double conservativeness = 1.0;
  int chunked_prefill_size = 64;
  bool disable_radix_cache = false;
  bool speculative = true;
  std::string drafter = kDrafter;
  int topk = 1;
  int num_draft_tokens = 0;
  int threshold = 0;  // --speculative-batch-size-threshold
  // Pad rows at every decode step (the CPU has no graphs: kGraphs would pad none).
  SpeculativeConfig::PadVerify pad = SpeculativeConfig::PadVerify::kAlways;
  std::function<std::unique_ptr<Drafter>(std::unique_ptr<Drafter>)> wrap{};
};

EngineConfig engine_config(const Options& o) {
  EngineConfig c;
  c.model_path = kTarget;
  c.page_size = 4;
  c.chunked_prefill_size = o.chunked_prefill_size;
  c.max_running_requests = o.max_running;
  c.max_total_tokens = o.max_total_tokens;
  c.schedule_conservativeness = o.conservativeness;
  c.disable_radix_cache = o.disable_radix_cache;
  if (o.speculative) {
    c.speculative.algorithm = SpeculativeAlgorithm::kEagle3;
    c.speculative.draft_model_path = o.drafter;
    c.speculative.num_steps = o.num_steps;
    c.speculative.eagle_topk = o.topk;
    c.speculative.num_draft_tokens = o.num_draft_tokens;
    c.speculative.batch_size_threshold = o.threshold;
    c.speculative.pad_verify = o.pad;
  }
  c.wrap_drafter = o.wrap;
  return c;
}

std::unique_ptr<Engine> make_engine(const Options& o) {
  auto e = Engine::create(engine_config(o));
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  return e.ok() ? std::move(e).value() : nullptr;
}

struct Result {
  std::vector<int32_t> tokens;
  int32_t accepted = 0, drafted = 0, verifies = 0;
};

// `new_tokens` (when given): request i's max_new_tokens instead of params'.
std::vector<Result> run(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                        const SamplingParams& params, bool one_at_a_time = false,
                        std::span<const int> new_tokens = {}) {
  std::vector<Result> out(prompts.size());
  std::mutex mu;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerateRequest g;
    g.prompt_ids = prompts[i];
    g.params = params;
    if (!new_tokens.empty()) g.params.max_new_tokens = new_tokens[i];
    g.on_event = [&out, &mu, i](const StreamEvent& ev) {
      std::lock_guard<std::mutex> lk(mu);
      EXPECT_TRUE(ev.error.empty()) << ev.error;
      Result& r = out[i];
      r.tokens.insert(r.tokens.end(), ev.token_ids.begin(), ev.token_ids.end());
      if (ev.finished) {
        r.accepted = ev.spec_accept_token_num;
        r.drafted = ev.spec_draft_token_num;
        r.verifies = ev.spec_verify_ct;
      }
    };
    EXPECT_TRUE(engine.submit(std::move(g)).ok());
    if (one_at_a_time) engine.wait_idle();
  }
  engine.wait_idle();
  return out;
}

SamplingParams greedy(int new_tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.max_new_tokens = new_tokens;
  p.ignore_eos = true;
  return p;
}

void expect_same_tokens(const std::vector<Result>& got, const std::vector<Result>& want,
                        const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_EQ(got[i].tokens, want[i].tokens) << what << ": request " << i;
}

double accept_length(const EngineStats& s) {
  return s.spec_verify_total == 0 ? 0.0
                                  : double(s.spec_accepted_tokens_total + s.spec_verify_total) /
                                        double(s.spec_verify_total);
}

std::string histogram(const EngineStats& s) {
  std::string h;
  for (size_t len = 1; len < s.spec_accept_length_counts.size(); ++len)
    h += fmt::format(" {}:{}", len, s.spec_accept_length_counts[len]);
  return h;
}

std::vector<std::vector<int32_t>> heldout(const Engine& e, int count) {
  return testing::eagle3_heldout_prompts(e.tokenizer(), kTarget, count);
}

// The committed drafter's accept length on held-out prompts at 3 steps is ~1.5 (its teacher-forced
// estimate at training time: 1.47); a broken wiring (stale rows, shifted positions) falls to ~1.0.
constexpr double kMinAcceptLength = 1.25;

// A draft setting: steps, topk, draft tokens.
struct Shape {
  int steps = 3, topk = 1, tokens = 0;
  SpeculativeConfig::PadVerify pad = SpeculativeConfig::PadVerify::kAlways;
  std::string name() const {
    return fmt::format("steps {} topk {} tokens {}", steps, topk, tokens);
  }
};

// Batch 1 (16 prompts one at a time, prefill chunks of 16), batch 64 (chunks of 64) and batch 64
// with retraction (a pool of 640 tokens, an optimistic reservation: requests are retracted
// mid-decode and come back through a new prefill, the drafter forgets them and observes them
// again): every greedy output equals plain decoding's. Returns batch 64's accept length.
double check_greedy(const Shape& shape, const std::vector<std::vector<int32_t>>& prompts,
                    const std::vector<Result>& want, int new_tokens) {
  const Options base{.num_steps = shape.steps,
                     .topk = shape.topk,
                     .num_draft_tokens = shape.tokens,
                     .pad = shape.pad};
  const std::string name = shape.name();
  {
    Options o = base;
    o.max_running = 1;
    o.chunked_prefill_size = 16;
    auto spec = make_engine(o);
    if (!spec) return 0;
    const std::vector<std::vector<int32_t>> some(prompts.begin(), prompts.begin() + 16);
    const std::vector<Result> got = run(*spec, some, greedy(new_tokens), /*one_at_a_time=*/true);
    expect_same_tokens(got, std::vector<Result>(want.begin(), want.begin() + 16),
                       (name + ", batch 1").c_str());
    const EngineStats s = spec->stats();
    std::printf("%s, batch 1: %lld verifies, accept len %.3f, histogram%s\n", name.c_str(),
                (long long)s.spec_verify_total, accept_length(s), histogram(s).c_str());
    EXPECT_GT(accept_length(s), kMinAcceptLength) << name;
  }
  double batch64 = 0;
  {
    auto spec = make_engine(base);
    if (!spec) return 0;
    const std::vector<Result> got = run(*spec, prompts, greedy(new_tokens));
    expect_same_tokens(got, want, (name + ", batch 64").c_str());
    const EngineStats s = spec->stats();
    batch64 = accept_length(s);
    std::printf("%s, batch 64: %lld verifies, %lld pad rows, accept len %.3f, histogram%s\n",
                name.c_str(), (long long)s.spec_verify_total, (long long)s.spec_pad_rows_total,
                batch64, histogram(s).c_str());
    // Requests draft fewer near their limit: fixed-shape verifies pad them (verify_shape.h);
    // where padding is for cuda only, none on the CPU.
    if (shape.pad == SpeculativeConfig::PadVerify::kAlways)
      EXPECT_GT(s.spec_pad_rows_total, 0) << name;
    else
      EXPECT_EQ(s.spec_pad_rows_total, 0) << name;
    EXPECT_GT(batch64, kMinAcceptLength) << name;
    int64_t accepted = 0;
    for (const Result& r : got) accepted += r.accepted;
    EXPECT_EQ(accepted, s.spec_accepted_tokens_total);
    EXPECT_EQ(s.generation_tokens_total, int64_t(prompts.size()) * new_tokens);
    EXPECT_EQ(s.kv_tokens_used, s.kv_tokens_cached);
    EXPECT_TRUE(spec->flush_cache());
    EXPECT_EQ(spec->stats().kv_tokens_used, 0);
  }
  {
    Options o = base;
    o.max_total_tokens = 640;
    o.conservativeness = 0.02;
    auto spec = make_engine(o);
    if (!spec) return 0;
    const std::vector<Result> got = run(*spec, prompts, greedy(new_tokens));
    expect_same_tokens(got, want, (name + ", retraction").c_str());
    const EngineStats s = spec->stats();
    std::printf("%s, retraction: %lld retractions, accept len %.3f\n", name.c_str(),
                (long long)s.retractions_total, accept_length(s));
    EXPECT_GT(s.retractions_total, 0) << "the small pool was meant to force retraction";
    EXPECT_GT(accept_length(s), kMinAcceptLength) << name;
    EXPECT_EQ(s.kv_tokens_used, s.kv_tokens_cached);
  }
  return batch64;
}

// Plain decoding's greedy outputs of the 64 held-out prompts, computed once per test binary.
struct PlainGreedy {
  static constexpr int kNew = 40;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<Result> want;
};
const PlainGreedy& plain_greedy() {
  static const PlainGreedy p = [] {
    PlainGreedy g;
    auto plain = make_engine({.speculative = false});
    if (!plain) return g;
    g.prompts = heldout(*plain, 64);
    g.want = run(*plain, g.prompts, greedy(PlainGreedy::kNew));
    return g;
  }();
  return p;
}

TEST(Eagle3Engine, GreedyEqualsPlainDecodingAtBatch1And64WithRetraction) {
  const PlainGreedy& p = plain_greedy();
  ASSERT_EQ(p.prompts.size(), 64u);
  check_greedy({.steps = 3, .topk = 1}, p.prompts, p.want, PlainGreedy::kNew);
}

// Draft trees: (3, 4, 8), whose accept length is compared with the chain's at the same depth
// (batch 64), and SGLang's common EAGLE tree setting (5, 8, 32).
TEST(Eagle3Engine, TreeGreedyEqualsPlainDecodingAndAcceptsMoreThanTheChain) {
  const PlainGreedy& p = plain_greedy();
  ASSERT_EQ(p.prompts.size(), 64u);
  const double tree =
      check_greedy({.steps = 3, .topk = 4, .tokens = 8}, p.prompts, p.want, PlainGreedy::kNew);
  double chain = 0;
  {
    auto spec = make_engine({.num_steps = 3});
    ASSERT_TRUE(spec);
    run(*spec, p.prompts, greedy(PlainGreedy::kNew));
    chain = accept_length(spec->stats());
  }
  std::printf("accept len at batch 64: chain (3, 1, 4) %.3f, tree (3, 4, 8) %.3f\n", chain, tree);
  // At the same depth the tree verifies the best-scored alternatives beside the likeliest path
  // (not always the chain's: a node's score is its path's, so the chain's deeper nodes may lose
  // to siblings' children); on these prompts that accepts more drafts, not fewer.
  EXPECT_GE(tree, chain);
}

TEST(Eagle3Engine, WideTreeGreedyEqualsPlainDecoding) {
  const PlainGreedy& p = plain_greedy();
  ASSERT_EQ(p.prompts.size(), 64u);
  // Padding only on cuda (none on the CPU): a 32-row verify per request of 40 new tokens would
  // be mostly pads, and slow here.
  const double wide = check_greedy(
      {.steps = 5, .topk = 8, .tokens = 32, .pad = SpeculativeConfig::PadVerify::kGraphs},
      p.prompts, p.want, PlainGreedy::kNew);
  EXPECT_GT(wide, 3.0);  // 3.45 when written
}

// --speculative-batch-size-threshold 16 at batch 64 with prefill chunks of 64 tokens and
// outputs of 8 to 40 tokens: the batch grows past the threshold while requests are admitted
// (speculation pauses), then shrinks below it as they finish (it resumes); greedy outputs are
// plain decoding's, and acceptance after resuming is that of a drafter that kept up (its KV
// observed every plain step).
TEST(Eagle3Engine, BatchSizeThresholdPausesSpeculationAndGreedyStaysPlain) {
  const PlainGreedy& p = plain_greedy();
  ASSERT_EQ(p.prompts.size(), 64u);
  std::vector<int> lengths;
  std::vector<Result> want;
  for (size_t i = 0; i < p.prompts.size(); ++i) {
    lengths.push_back(8 + int(i % 9) * 4);
    Result w;
    w.tokens.assign(p.want[i].tokens.begin(), p.want[i].tokens.begin() + lengths.back());
    want.push_back(w);  // greedy outputs of a shorter limit are prefixes
  }
  for (const Shape& shape :
       {Shape{.steps = 3, .topk = 1}, Shape{.steps = 3, .topk = 4, .tokens = 8}}) {
    auto spec = make_engine({.num_steps = shape.steps,
                             .topk = shape.topk,
                             .num_draft_tokens = shape.tokens,
                             .threshold = 16});
    ASSERT_TRUE(spec);
    const std::vector<Result> got =
        run(*spec, p.prompts, greedy(PlainGreedy::kNew), /*one_at_a_time=*/false, lengths);
    expect_same_tokens(got, want, (shape.name() + ", threshold 16").c_str());
    const EngineStats s = spec->stats();
    std::printf("%s, threshold 16: %lld plain decode steps, %lld verifies, accept len %.3f\n",
                shape.name().c_str(), (long long)s.spec_paused_steps_total,
                (long long)s.spec_verify_total, accept_length(s));
    EXPECT_GT(s.spec_paused_steps_total, 0) << "the batch was meant to exceed the threshold";
    EXPECT_GT(s.spec_verify_total, 0);
    EXPECT_GT(accept_length(s), kMinAcceptLength) << shape.name();
    EXPECT_EQ(s.kv_tokens_used, s.kv_tokens_cached);
  }
}

// What the engine's drafter was asked and answered.
struct Proposal {
  std::vector<int32_t> context;  // the request's tokens (prompt + output) at the time
  int32_t max_tokens = 0;
  DraftTree tree;
};

class RecordingDrafter : public Drafter {
 public:
  RecordingDrafter(std::unique_ptr<Drafter> inner, std::vector<Proposal>* log)
      : inner_(std::move(inner)), log_(log) {}
  std::string_view name() const override { return inner_->name(); }
  CaptureSpec capture_spec() const override { return inner_->capture_spec(); }
  void observe(std::span<const CommittedTokens> c, int64_t width, DType dtype,
               bool drafts_next) override {
    inner_->observe(c, width, dtype, drafts_next);
  }
  void propose(std::span<const DraftQuery> queries, std::vector<DraftTree>* drafts) override {
    inner_->propose(queries, drafts);
    for (size_t i = 0; i < queries.size(); ++i) {
      const Request& r = *queries[i].request;
      log_->push_back(Proposal{.context = r.tokens(r.total_len()),
                               .max_tokens = queries[i].max_tokens,
                               .tree = (*drafts)[i]});
    }
  }
  void release(int64_t id) override { inner_->release(id); }

 private:
  std::unique_ptr<Drafter> inner_;
  std::vector<Proposal>* log_;
};

// The drafter's proposals for a context computed directly, one path at a time: the target over
// the whole context with the aux layers captured, one first-step drafter forward over positions
// 0..n-2 (row p: the target's states at p, token p + 1), whose last row gives the first draft's
// distribution; then, for a path of drafts, causal draft steps along it, each fed the row before
// (no tree mask, no scratch pages: each path is a chain of its own).
class DirectDrafter {
 public:
  DirectDrafter() : backend_(make_cpu_backend()) {
    auto target = load_model(kTarget, *backend_);
    CHECK_MSG(target.ok(), "{}", target.status().to_string());
    target_ = std::move(target).value();
    auto d = Eagle3Drafter::load(kDrafter, *backend_, nullptr, kTarget);
    CHECK_MSG(d.ok(), "{}", d.status().to_string());
    drafter_ = std::move(d).value();
    auto aux = drafter_->aux_layers(target_->spec().num_layers);
    CHECK(aux.ok());
    CHECK(target_->set_capture(CaptureSpec{.layers = *aux}, 1024).ok());
  }

  // The target and the first drafter step over `context`; paths of up to max_depth drafts follow.
  void start(const std::vector<int32_t>& context, int max_depth) {
    Backend& be = *backend_;
    const int n = int(context.size());
    rows_ = n - 1;
    const int64_t width = target_->capture_width(), h = drafter_->hidden_size();
    const int64_t dv = drafter_->draft_vocab_size();
    // The target's captured states of positions 0..n-2.
    testing::DraftBatch tplan(1, 4, n);
    KvLayout tl = target_->kv_layout();
    tl.page_size = 4;
    tl.num_pages = tplan.num_pages();
    auto tkv = be.alloc_kv(tl);
    Eagle3Batch tb;
    tplan.plan({0}, {rows_}, &tb);
    std::vector<float> captured(size_t(rows_ * width));
    ForwardBatch fb{.token_ids = context.data(), .attn = tb.attn, .captured = captured.data()};
    target_->forward(fb, *tkv, nullptr);

    dplan_ = std::make_unique<testing::DraftBatch>(1, 4, n + max_depth);
    KvLayout dl = drafter_->kv_layout();
    dl.page_size = 4;
    dl.num_pages = dplan_->num_pages();
    dkv_ = be.alloc_kv(dl);
    auto feats = be.upload(Tensor::make(captured.data(), DType::kF32, {rows_, width}), DType::kF32);
    auto hidden = be.alloc(DType::kF32, {rows_, h});
    std::vector<int32_t> tokens(context.begin() + 1, context.end());
    const int32_t last = rows_ - 1;
    first_logits_.assign(size_t(dv), 0);
    Eagle3Batch b1;
    dplan_->plan({0}, {rows_}, &b1);
    b1.token_ids = tokens.data();
    b1.target_features = &feats->view();
    b1.logit_rows = &last;
    b1.num_logit_rows = 1;
    drafter_->forward(b1, *dkv_, *hidden, first_logits_.data());
    first_hidden_ = be.alloc(DType::kF32, {1, h});
    be.gather_rows(*hidden, &last, 1, *first_hidden_);
  }

  // The drafter's logits for the token after the context and `path` (target ids).
  std::vector<float> logits_after(std::span<const int32_t> path) {
    Backend& be = *backend_;
    std::vector<float> logits = first_logits_;
    auto prev = be.alloc(DType::kF32, {1, drafter_->hidden_size()});
    const int32_t zero = 0;
    be.gather_rows(*first_hidden_, &zero, 1, *prev);
    for (size_t j = 1; j <= path.size(); ++j) {
      Eagle3Batch b;
      dplan_->plan({rows_ - 1 + int(j)}, {1}, &b);
      b.token_ids = &path[j - 1];
      b.prev_hidden = &prev->view();
      b.logit_rows = &zero;
      b.num_logit_rows = 1;
      drafter_->forward(b, *dkv_, *prev, logits.data());
    }
    return logits;
  }

  int32_t argmax(const std::vector<float>& logits) const {
    return drafter_->target_token(argmax_row_reference(logits.data(), int64_t(logits.size())));
  }

  // The k best target ids and their log-probabilities, best first (the lower draft id on ties).
  void top(const std::vector<float>& logits, int k, std::vector<int32_t>* ids,
           std::vector<float>* logprobs) const {
    const float max = *std::max_element(logits.begin(), logits.end());
    double sum = 0;
    for (float x : logits) sum += std::exp(double(x) - max);
    const float log_z = max + float(std::log(sum));
    std::vector<int32_t> order(logits.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return logits[size_t(a)] > logits[size_t(b)]; });
    for (int j = 0; j < k; ++j) {
      ids->push_back(drafter_->target_token(order[size_t(j)]));
      logprobs->push_back(logits[size_t(order[size_t(j)])] - log_z);
    }
  }

  std::vector<int32_t> chain(const std::vector<int32_t>& context, int k) {
    start(context, k);
    std::vector<int32_t> out;
    while (int(out.size()) < k) out.push_back(argmax(logits_after(out)));
    return out;
  }

  // EAGLE's tree (DraftTreeBuilder) with every frontier node's candidates from logits_after(its
  // path).
  DraftTree tree(const std::vector<int32_t>& context, int steps, int topk, int tokens) {
    start(context, steps);
    DraftTreeBuilder b(context.back(), topk, tokens);
    for (int step = 0; step < steps; ++step) {
      std::vector<int32_t> ids;
      std::vector<float> logprobs;
      for (int32_t f : b.frontier()) {
        std::vector<int32_t> path;
        for (int32_t a = f; a != 0; a = b.parent(a)) path.insert(path.begin(), b.token(a));
        top(logits_after(path), topk, &ids, &logprobs);
      }
      b.expand(ids, logprobs);
    }
    return b.finish();
  }

 private:
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> target_;
  std::unique_ptr<Eagle3Drafter> drafter_;
  int rows_ = 0;
  std::unique_ptr<testing::DraftBatch> dplan_;
  std::unique_ptr<KvStorage> dkv_;
  std::vector<float> first_logits_;
  DeviceTensorPtr first_hidden_;
};

// The engine's proposals of a run with `options` (greedy, 12 held-out prompts, 24 new tokens);
// its stats in *stats when given.
std::vector<Proposal> record_proposals(Options options, EngineStats* stats = nullptr) {
  // No prefix sharing: a shared page's last drafter row pairs the first request's next token
  // (acceptance may drop there, by design), which a direct computation would not reproduce.
  auto log = std::make_shared<std::vector<Proposal>>();
  options.max_running = 8;
  options.chunked_prefill_size = 16;
  options.disable_radix_cache = true;
  options.wrap = [log](std::unique_ptr<Drafter> d) {
    return std::make_unique<RecordingDrafter>(std::move(d), log.get());
  };
  auto spec = make_engine(options);
  if (!spec) return {};
  const auto prompts = heldout(*spec, 12);
  run(*spec, prompts, greedy(24));
  if (stats != nullptr) *stats = spec->stats();
  return *log;
}

TEST(Eagle3Engine, ProposalsEqualADirectDrafterChain) {
  const std::vector<Proposal> log = record_proposals({.num_steps = 4});
  ASSERT_GT(log.size(), 12u);
  DirectDrafter direct;
  int checked = 0, full = 0;
  for (const Proposal& p : log) {
    ASSERT_GT(p.max_tokens, 0);
    // Every query is answered: the drafter observed each request's last commit.
    ASSERT_EQ(p.tree.num_drafts(), p.max_tokens) << "context of " << p.context.size();
    const std::vector<int32_t> want = direct.chain(p.context, p.max_tokens);
    EXPECT_EQ(p.tree.tokens, DraftTree::chain(p.context.back(), want).tokens)
        << "context of " << p.context.size() << " tokens";
    EXPECT_EQ(p.tree.parents, DraftTree::chain(p.context.back(), want).parents);
    ++checked;
    full += p.max_tokens == 4 ? 1 : 0;
  }
  std::printf("%d proposals checked (%d of 4 drafts)\n", checked, full);
  EXPECT_GT(full, checked / 2);
}

// With speculation paused above 4 requests (the 8 running requests cross it both ways: admitted
// one prefill chunk at a time, finishing at different steps), the drafter observes the plain steps
// without logits (its KV only) and proposes again when the batch shrinks: every proposal after
// resuming still equals the direct chain over the whole context, so the drafter's KV of the
// positions committed while paused is exactly what observing them with drafts would have left.
TEST(Eagle3Engine, ProposalsAfterAPauseEqualADirectDrafterChain) {
  EngineStats stats;
  const std::vector<Proposal> log = record_proposals({.num_steps = 3, .threshold = 4}, &stats);
  EXPECT_GT(stats.spec_paused_steps_total, 0) << "the batch was meant to exceed the threshold";
  ASSERT_GT(log.size(), 12u);
  DirectDrafter direct;
  int checked = 0;
  for (const Proposal& p : log) {
    ASSERT_GT(p.max_tokens, 0);
    ASSERT_EQ(p.tree.num_drafts(), p.max_tokens) << "context of " << p.context.size();
    const std::vector<int32_t> want = direct.chain(p.context, p.max_tokens);
    EXPECT_EQ(p.tree.tokens, DraftTree::chain(p.context.back(), want).tokens)
        << "context of " << p.context.size() << " tokens";
    ++checked;
  }
  std::printf("%d proposals checked, %lld plain decode steps\n", checked,
              (long long)stats.spec_paused_steps_total);
}

// The tree proposals after tree verifies (the drafter observed accepted paths whose rows are not
// consecutive) equal trees built from direct chains along every node's path.
TEST(Eagle3Engine, TreeProposalsEqualTreesOfDirectDrafterChains) {
  const Shape shapes[] = {{.steps = 3, .topk = 4, .tokens = 8},
                          {.steps = 4, .topk = 3, .tokens = 12}};
  for (const Shape& shape : shapes) {
    const std::vector<Proposal> log = record_proposals(
        {.num_steps = shape.steps, .topk = shape.topk, .num_draft_tokens = shape.tokens});
    ASSERT_GT(log.size(), 12u);
    DirectDrafter direct;
    int checked = 0, full = 0, branched = 0;
    for (const Proposal& p : log) {
      ASSERT_GT(p.max_tokens, 0);
      const int tokens = std::min(shape.tokens, p.max_tokens + 1);
      // Every query is answered with a full tree (the drafter observed each request's last commit).
      ASSERT_EQ(p.tree.size(), tokens) << shape.name() << ", context of " << p.context.size();
      // Checking every proposal costs a chain per node: every third one.
      if (checked++ % 3 != 0) continue;
      const DraftTree want = direct.tree(p.context, shape.steps, shape.topk, tokens);
      EXPECT_EQ(p.tree.tokens, want.tokens) << shape.name() << ", context of " << p.context.size();
      EXPECT_EQ(p.tree.parents, want.parents) << shape.name();
      full += tokens == shape.tokens ? 1 : 0;
      branched += p.tree.children(0).size() > 1 ? 1 : 0;
    }
    std::printf("%s: %d proposals, every third checked (%d full trees, %d branching at the root)\n",
                shape.name().c_str(), checked, full, branched);
    EXPECT_GT(full, 0);
    EXPECT_GT(branched, 0);
  }
}

// A sampled request draws, for each output position, the draw plain decoding gives it, and
// verification keeps a draft only where the target's own sample agrees: the same tokens.
// Also with a frequency penalty on half of them: a tree row's penalties count the drafts on its
// own path (not the nodes before it in node order).
TEST(Eagle3Engine, SeededSampledRequestsGivePlainDecodingsTokens) {
  auto plain = make_engine({.speculative = false});
  ASSERT_TRUE(plain);
  const auto prompts = heldout(*plain, 8);
  SamplingParams p;
  p.temperature = 0.7f;
  p.top_p = 0.95f;
  p.max_new_tokens = 32;
  p.ignore_eos = true;
  p.seed = 1234;
  SamplingParams penalized = p;
  penalized.frequency_penalty = 0.8f;
  const std::vector<std::vector<int32_t>> some(prompts.begin(), prompts.begin() + 4);
  const std::vector<Result> want = run(*plain, prompts, p);
  const std::vector<Result> want_penalized = run(*plain, some, penalized);
  plain.reset();
  for (const Shape& shape :
       {Shape{.steps = 3, .topk = 1}, Shape{.steps = 3, .topk = 4, .tokens = 8}}) {
    auto spec = make_engine(
        {.num_steps = shape.steps, .topk = shape.topk, .num_draft_tokens = shape.tokens});
    ASSERT_TRUE(spec);
    const std::vector<Result> got = run(*spec, prompts, p);
    expect_same_tokens(got, want, (shape.name() + ", seeded sampling").c_str());
    expect_same_tokens(run(*spec, some, penalized), want_penalized,
                       (shape.name() + ", seeded sampling with a penalty").c_str());
    const EngineStats s = spec->stats();
    std::printf("%s, sampled: accept len %.3f\n", shape.name().c_str(), accept_length(s));
    EXPECT_GT(s.spec_accepted_tokens_total, 0);
  }
}

std::string create_error(const Options& o) {
  auto e = Engine::create(engine_config(o));
  return e.ok() ? "" : e.status().to_string();
}

TEST(Eagle3Engine, RefusesAMissingOrMismatchedDrafterAndTreesOutOfBounds) {
  EXPECT_NE(create_error({.drafter = "/nonexistent/drafter"}).find("no such directory"),
            std::string::npos);
  EXPECT_NE(create_error({.topk = 4, .num_draft_tokens = 40}).find("36 candidate drafts"),
            std::string::npos)
      << create_error({.topk = 4, .num_draft_tokens = 40});
  EXPECT_EQ(create_error({.topk = 4, .num_draft_tokens = 8}), "");
  EXPECT_NE(create_error({.num_steps = 1, .topk = 65, .num_draft_tokens = 8})
                .find("at most 64 candidates"),
            std::string::npos);
  testing::TempDir dir;
  std::filesystem::copy_file(kDrafter + "/model.safetensors", dir.str() + "/model.safetensors");
  std::ifstream in(kDrafter + "/config.json");
  const nlohmann::json config = nlohmann::json::parse(in);
  auto with = [&](const nlohmann::json& c) {
    std::ofstream(dir.str() + "/config.json") << c.dump();
    return create_error({.drafter = dir.str()});
  };
  EXPECT_EQ(with(config), "");
  nlohmann::json c = config;
  c["vocab_size"] = 32000;
  EXPECT_NE(with(c).find("vocab_size is 32000"), std::string::npos) << with(c);
  c = config;
  c["target_hidden_size"] = 4096;
  EXPECT_NE(with(c).find("target_hidden_size"), std::string::npos) << with(c);
  c = config;
  c["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = {1, 3, 9};  // house-llama has 8 layers
  EXPECT_NE(with(c).find("9"), std::string::npos) << with(c);
}

}  // namespace
}  // namespace strata
