// The engine thread: drain submissions and aborts, decide, apply, run the forward pass, sample,
// hand the tokens to each request's stream (engine_stream.cc). Everything here runs on the
// engine thread only.
#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "core/capture_counters.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "engine/batch_plan.h"
#include "engine/live_request.h"
#include "engine/parallel_runtime.h"
#include "engine/schedule_state.h"
#include "engine/spec/tree_verify.h"
#include "engine/spec/verify_shape.h"
#include "kv/page_pool.h"
#include "kv/radix_cache.h"

namespace strata {
namespace {

using StepClock = std::chrono::steady_clock;

// STRATA_STEP_TIMING=1: every 256 steps, the engine logs how a step's wall time splits between
// forward_sample (the GPU's work, with the host's launches overlapping it) and the rest
// (scheduling, batch plan, streaming: time the GPU idles). Engine thread only.
struct StepTiming {
  bool on = [] {
    const char* e = std::getenv("STRATA_STEP_TIMING");
    return e != nullptr && e[0] == '1';
  }();
  double forward_s = 0, rest_s = 0;
  int64_t steps = 0, rows = 0;
  void add(StepClock::time_point begin, StepClock::time_point fwd_begin,
           StepClock::time_point fwd_end, size_t n) {
    if (!on) return;
    const auto now = StepClock::now();
    forward_s += std::chrono::duration<double>(fwd_end - fwd_begin).count();
    rest_s += std::chrono::duration<double>((fwd_begin - begin) + (now - fwd_end)).count();
    rows += int64_t(n);
    if (++steps < 256) return;
    LOG_INFO(
        "engine steps: {} steps, {:.1f} rows each: forward + sampling {:.2f} ms, the rest of the "
        "step (host only) {:.2f} ms per step",
        steps, double(rows) / double(steps), 1e3 * forward_s / double(steps),
        1e3 * rest_s / double(steps));
    forward_s = rest_s = 0;
    steps = rows = 0;
  }
};

// One step's speculative verifies (requests whose step had drafts).
struct SpecStepCounts {
  int64_t verifies = 0, drafted = 0, accepted = 0;
  std::vector<int32_t> accept_lengths;  // accepted drafts + 1, per verify
  void add(int32_t num_drafts, int32_t num_accepted) {
    ++verifies;
    drafted += num_drafts;
    accepted += num_accepted;
    accept_lengths.push_back(num_accepted + 1);
  }
  void add_to(EngineStats* stats) const {
    stats->spec_verify_total += verifies;
    stats->spec_draft_tokens_total += drafted;
    stats->spec_accepted_tokens_total += accepted;
    auto& hist = stats->spec_accept_length_counts;
    for (int32_t len : accept_lengths)
      if (size_t(len) < hist.size()) ++hist[size_t(len)];
  }
};

// SGLang's decode log line, every kInterval decode steps: the batch, the generation throughput
// over the interval and, under speculative decoding, its mean accept length (tokens a verify
// commits: accepted drafts + 1). Engine thread only.
// Under speculative decoding it also splits the decode steps' wall time into its phases, per
// step: the drafter's proposals (draft), the target's forward and sampling (verify), the
// drafter's news after it (observe).
struct SpecPhases {
  double draft_s = 0, verify_s = 0, observe_s = 0;
};
struct DecodeLog {
  static constexpr int kInterval = 40;
  int steps = 0;
  int64_t tokens = 0, verifies = 0, accepted = 0;
  SpecPhases phases;
  StepClock::time_point since = StepClock::now();
  void add(size_t batch, int64_t step_tokens, const SpecStepCounts& spec, bool speculative,
           int64_t kv_tokens_used, int64_t kv_tokens_total, const SpecPhases& step_phases) {
    tokens += step_tokens;
    verifies += spec.verifies;
    accepted += spec.accepted;
    phases.draft_s += step_phases.draft_s;
    phases.verify_s += step_phases.verify_s;
    phases.observe_s += step_phases.observe_s;
    if (++steps < kInterval) return;
    const auto now = StepClock::now();
    const double seconds = std::chrono::duration<double>(now - since).count();
    const double usage =
        kv_tokens_total > 0 ? double(kv_tokens_used) / double(kv_tokens_total) : 0.0;
    if (speculative)
      LOG_INFO(
          "Decode batch. #running-req: {}, token usage: {:.2f}, accept len: {:.2f}, gen "
          "throughput (token/s): {:.2f}, ms per step: draft {:.3f} verify {:.3f} observe {:.3f}",
          batch, usage, verifies > 0 ? double(accepted + verifies) / double(verifies) : 1.0,
          seconds > 0 ? double(tokens) / seconds : 0.0, 1e3 * phases.draft_s / steps,
          1e3 * phases.verify_s / steps, 1e3 * phases.observe_s / steps);
    else
      LOG_INFO(
          "Decode batch. #running-req: {}, token usage: {:.2f}, gen throughput (token/s): {:.2f}",
          batch, usage, seconds > 0 ? double(tokens) / seconds : 0.0);
    *this = DecodeLog{};
  }
};

// The last propose_drafts()'s wall time, for the decode log (engine thread only).
thread_local double last_draft_seconds = 0;

double seconds_since(StepClock::time_point t) {
  return std::chrono::duration<double>(StepClock::now() - t).count();
}

// A proposed tree as a seq's drafts: its first `max_drafts` drafts (node order is a topological
// order, so they form a tree), with their parents unless they are a chain (the chain's verify is
// the plain causal one).
void set_drafts(ScheduledSeq* seq, const DraftTree& tree, int32_t max_drafts) {
  const Request& r = *seq->request;
  CHECK_MSG(tree.tokens[0] == r.token_at(r.kv_len()),
            "request {}: a draft tree rooted at token {}, its last token is {}", r.id(),
            tree.tokens[0], r.token_at(r.kv_len()));
  const int32_t n = std::min(tree.num_drafts(), max_drafts);
  seq->draft.assign(tree.tokens.begin() + 1, tree.tokens.begin() + 1 + n);
  bool chain = true;
  for (int32_t i = 1; i <= n; ++i) chain = chain && tree.parents[size_t(i)] == i - 1;
  if (chain)
    seq->draft_parents.clear();
  else
    seq->draft_parents.assign(tree.parents.begin() + 1, tree.parents.begin() + 1 + n);
}

// The tree a sampled seq verifies: its last token, then its drafts (a chain when they have no
// parents).
DraftTree verified_tree(const ScheduledSeq& seq) {
  const Request& r = *seq.request;
  const int32_t root = r.token_at(r.kv_len() + seq.num_new_tokens - 1);
  if (seq.draft_parents.empty()) return DraftTree::chain(root, seq.draft);
  DraftTree tree = DraftTree::root_only(root);
  for (size_t i = 0; i < seq.draft.size(); ++i) tree.add(seq.draft_parents[i], seq.draft[i]);
  return tree;
}

}  // namespace

void Engine::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] {
        return stop_ || !inbox_.empty() || !abort_inbox_.empty() || flush_requested_ ||
               !live_.empty() || !retiring_.empty();
      });
      if (stop_) break;
    }
    drain_inbox();
    if (!live_.empty()) run_step();
    // Nothing left to run: the last finished requests wait for their rows here.
    retire_written(/*wait=*/live_.empty());
    update_stats();
  }
  // Shutdown: everything still live ends with an abort event (after the writer is done with it).
  drain_inbox();
  if (capture_writer_) capture_writer_->wait(capture_writer_->last_submitted());
  retire_written(/*wait=*/true);
  for (auto& [id, live] : live_) {
    if (live->request.is_live()) state_->abort(&live->request);
    finalize(*live);
  }
  live_.clear();
  update_stats();
}

void Engine::drain_inbox() {
  std::deque<std::unique_ptr<Live>> incoming;
  std::vector<int64_t> aborts;
  bool flush = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    incoming.swap(inbox_);
    aborts.swap(abort_inbox_);
    flush = flush_requested_;
    flush_requested_ = false;
  }
  for (auto& live : incoming) {
    Status st = stop_ ? unavailable("the engine is shutting down") : state_->submit(&live->request);
    if (!st.ok()) {
      if (live->request.is_live()) live->request.abort(st.message());
      finalize(*live);
      continue;
    }
    const int64_t id = live->request.id();
    import_kv(*live);  // checkpointed KV rows become a cached prefix its admission hits
    if (!live->resume_output_ids.empty())
      emit(*live, std::move(live->resume_output_ids), {}, /*resumed=*/true);
    live_[id] = std::move(live);
  }
  for (int64_t id : aborts) {
    auto it = live_.find(id);
    if (it == live_.end()) continue;
    if (it->second->request.is_live()) state_->abort(&it->second->request);
    retire(id);
  }
  if (flush) {
    const bool ok = state_->flush_cache();
    update_stats();  // the caller reads stats right after: they must show the flush
    std::lock_guard<std::mutex> lk(mu_);
    flush_result_ = ok;
    flush_done_ = true;
    idle_cv_.notify_all();
  }
}

void Engine::run_step() {
  auto step_begin = StepClock::now();
  ScheduledStep step = state_->schedule(*scheduler_);
  for (Request* r : step.rejected) retire(r->id());
  for (Request* r : step.truncated) retire(r->id());
  {
    // Published before the forward pass, so /metrics shows this step's batch while it runs.
    std::lock_guard<std::mutex> lk(mu_);
    stats_.retractions_total += int64_t(step.retracted.size());
    stats_.num_running = int64_t(state_->num_running());
    stats_.num_waiting = int64_t(state_->num_waiting()) + int64_t(inbox_.size());
    stats_.kv_tokens_used = int64_t(pool_->num_used_pages()) * config_.page_size;
  }
  if (step.seqs.empty()) {
    // Nothing runnable (should not last): wait for new input instead of spinning.
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait_for(lk, std::chrono::milliseconds(5));
    return;
  }
  // Admission is news for a client waiting to send its response headers (server/generation.h).
  for (const ScheduledSeq& seq : step.seqs) {
    Live& live = *live_.at(seq.request->id());
    if (live.start_announced) continue;
    live.start_announced = true;
    StreamEvent ev;
    ev.started = true;
    ev.prompt_tokens = live.request.prompt_len();
    if (live.on_event) live.on_event(ev);
  }
  for (Request* r : step.retracted)
    if (drafter_) drafter_->release(r->id());
  for (int i = 0; i < step.num_decode_steps; ++i) {
    if (i > 0) {
      drain_inbox();  // aborts take effect between continuous decode steps
      step = state_->continue_decode();
      if (step.seqs.empty()) break;
    }
    if (drafter_) propose_drafts(&step);
    run_one_step(step, step_begin);
    step_begin = StepClock::now();
  }
}

// Speculative decoding: the drafter's proposals for this step's decodes, each cut to the room its
// pages hold (ScheduleState::draft_room), then pad rows so that every verify of a decode step has
// num_draft_tokens rows (engine/spec/verify_shape.h). A step above
// --speculative-batch-size-threshold (not ScheduledStep::speculative) runs plain.
void Engine::propose_drafts(ScheduledStep* step) {
  const auto begin = StepClock::now();
  last_draft_seconds = 0;
  if (!step->speculative) {
    // Paused above the threshold (a step with decodes that ScheduleState kept plain).
    const bool decodes = std::any_of(step->seqs.begin(), step->seqs.end(), [](const auto& seq) {
      return seq.request->state() == RequestState::kDecoding;
    });
    if (decodes && config_.speculative.batch_size_threshold > 0) {
      std::lock_guard<std::mutex> lk(mu_);
      ++stats_.spec_paused_steps_total;
    }
    return;
  }
  std::vector<DraftQuery> queries;
  std::vector<size_t> seq_of;
  for (size_t s = 0; s < step->seqs.size(); ++s) {
    const Request& r = *step->seqs[s].request;
    if (r.state() != RequestState::kDecoding) continue;
    const int32_t room = state_->draft_room(r);
    if (room <= 0) continue;
    queries.push_back(DraftQuery{.request = &r, .max_tokens = room});
    seq_of.push_back(s);
  }
  if (!queries.empty()) {
    std::vector<DraftTree> trees;
    drafter_->propose(queries, &trees);
    CHECK_EQ(trees.size(), queries.size());
    for (size_t q = 0; q < queries.size(); ++q)
      set_drafts(&step->seqs[seq_of[q]], trees[q], queries[q].max_tokens);
  }
  // A model drafter proposes full drafts but near a request's limits: fixed shapes are worth the
  // few pad rows on cuda (CUDA graphs of the verify and of the drafter's observe() per batch
  // size; eager steps padded alike, so graph and eager runs compute the same shapes); on the CPU
  // they would only cost. NGRAM often has no drafts at all: padding would multiply its verify's
  // cost.
  using PadVerify = SpeculativeConfig::PadVerify;
  const PadVerify policy = config_.speculative.pad_verify;
  const bool pad = policy == PadVerify::kAlways ||
                   (policy == PadVerify::kGraphs && config_.device == Device::kCuda);
  if (pad && !step->is_prefill && config_.speculative.algorithm == SpeculativeAlgorithm::kEagle3) {
    pad_verify_rows(step->seqs, config_.speculative.num_draft_tokens, config_.page_size);
    int64_t pads = 0;
    for (const ScheduledSeq& seq : step->seqs) pads += seq.pad_rows;
    std::lock_guard<std::mutex> lk(mu_);
    stats_.spec_pad_rows_total += pads;
  }
  last_draft_seconds = seconds_since(begin);
}

void Engine::run_one_step(const ScheduledStep& step, StepClock::time_point step_begin) {
  static thread_local StepTiming timing;
  static thread_local DecodeLog decode_log;
  const int64_t vocab = model_->spec().vocab_size;
  {
    // Apply: the step's host-side metadata.
    BatchPlan plan = BatchPlan::build(step.seqs, config_.page_size);
    // Each row's sampling parameters, with its request's draw (one per sampled token, in the
    // request's own stream); the backend samples where the logits are and only ids come back,
    // plus the full rows of requests that asked for logprobs. A seq that verifies drafts has a
    // row per draft after its own (tree node i: row i): each row sees the drafts on its path as
    // output (penalties) and takes the draw of its depth's output position.
    const size_t n = plan.logits_rows.size();
    std::vector<Live*> row_live(n);
    std::vector<SampleRowParams> row_params(n);
    std::vector<int32_t> keep_rows;
    std::vector<LogitEdit> edits;  // penalties and logit_bias (engine/logit_edits.h)
    std::vector<size_t> first_row(step.seqs.size(), n);  // of each sampled seq
    std::vector<DraftTree> trees(step.seqs.size());      // of each sampled seq
    // A verifying row's counts (output + the drafts on its path) are those of node counts_node;
    // a chain's next node extends them by one token, a tree's other nodes rebuild them.
    OutputTokenCounts draft_counts;
    int32_t counts_node = -1;
    std::vector<int32_t> banned;  // a row's tokens under min_new_tokens (engine/logit_edits.h)
    // Prompt-scoring rows (batch_plan.h prompt_score_rows): a seq's first rows of the step, kept
    // in full and never sampled (greedy, like pad rows: no draw, no edits).
    std::vector<PromptScoreRows> score(step.seqs.size());
    for (size_t s = 0; s < step.seqs.size(); ++s)
      score[s] = prompt_score_rows(*step.seqs[s].request, step.seqs[s].num_new_tokens);
    std::vector<int32_t> scored(step.seqs.size(), 0);
    struct ScoreRow {
      size_t keep;  // its index in keep_rows (and kept_logits)
      Live* live;
      int32_t position;  // its logits score the prompt token after it
    };
    std::vector<ScoreRow> score_rows;
    std::vector<char> is_score(n, 0);
    for (size_t j = 0; j < n; ++j) {
      const size_t s = size_t(plan.sampled_seqs[j]);
      const ScheduledSeq& seq = step.seqs[s];
      if (scored[s] < score[s].size()) {
        Live& live = *live_.at(seq.request->id());
        row_live[j] = &live;
        row_params[j] = SampleRowParams{};
        is_score[j] = 1;
        score_rows.push_back({keep_rows.size(), &live, score[s].first + scored[s]++});
        keep_rows.push_back(int32_t(j));
        continue;
      }
      if (first_row[s] == n) {
        first_row[s] = j;
        trees[s] = verified_tree(seq);
      }
      const int32_t node = int32_t(j - first_row[s]);
      const DraftTree& tree = trees[s];
      Live& live = *live_.at(seq.request->id());
      row_live[j] = &live;
      // A pad row (verify_shape.h): sampled greedily, never read; no draw, edits or logprobs.
      if (node >= tree.size()) {
        row_params[j] = SampleRowParams{};
        continue;
      }
      const SamplingParams& p = live.request.params();
      // The draw plain decoding would give this row's output position; taken when its token is
      // kept (below), so a seeded request samples the same tokens with or without speculation.
      row_params[j] = peek_row_params(p, live.rng, size_t(tree.depths[size_t(node)]));
      min_tokens_banned(p, live.request.output_len() + tree.depths[size_t(node)],
                        state_->eos_token_ids(), &banned);
      if (p.edits_logits()) {
        if (node == 0) {
          counts_node = -1;
          append_logit_edits(p, live.output_counts, int32_t(j), banned, &edits);
        } else {
          if (counts_node >= 0 && tree.parents[size_t(node)] == counts_node) {
            draft_counts.add(tree.tokens[size_t(node)]);
          } else {
            draft_counts = live.output_counts;
            draft_counts.add(tree.path_tokens(node));
          }
          counts_node = node;
          append_logit_edits(p, draft_counts, int32_t(j), banned, &edits);
        }
      } else if (!banned.empty()) {  // no penalties: the counts are not read
        append_logit_edits(p, live.output_counts, int32_t(j), banned, &edits);
      }
      if (live.top_logprobs >= 0) keep_rows.push_back(int32_t(j));
    }
    bool capture = drafter_ && !drafter_->capture_spec().empty();
    for (const ScheduledSeq& seq : step.seqs)
      capture = capture || live_.at(seq.request->id())->capture != nullptr;
    // Small decode steps replay captured graphs (the host's launch work then leaves the step).
    // Graph mode covers this forward only, so nothing else (host-tier copies) is ever recorded.
    // Steps with logit edits run eagerly: their edit counts change every step, and so would a
    // graph's signature. Capture's device copies are part of the graph (fixed buffers). Steps
    // that verify drafts replay graphs too, by their number of requests (--cuda-graph-max-bs):
    // a chain's verify has 1 + k rows per request, so a batch size and k make one signature
    // (the recorder keys graphs by every launch's parameters; the rows' values are staged). A
    // tree's shape lives in staged values too (rope positions, tree mask words: the device
    // metadata copy), and whether a step has a tree mask in the launch parameters, so one graph
    // per batch size and row count serves every tree shape.
    const bool graphs = !step.is_prefill &&
                        int(plan.num_seqs()) <= config_.cuda_graph_max_bs.value_or(0) &&
                        edits.empty();
    // Run.
    const auto fwd_begin = StepClock::now();
    runner_->run(plan, StepInputs{.row_params = row_params,
                                  .keep_rows = keep_rows,
                                  .edits = edits,
                                  .capture = capture,
                                  .graphs = graphs});
    const auto fwd_end = StepClock::now();
    // Post-process: verification, logprobs, tokens, stops, then the captured states by position
    // (the drafter reads them first: the block then goes to the capture writer).
    const uint8_t* captured = runner_->captured();
    const std::vector<int32_t>& sampled = runner_->sampled();
    const float* kept_logits = runner_->kept_logits();
    // Each kept row's log-softmax over the vocabulary, rows across the thread pool: a prompt
    // scored in chunks of 512 rows of a 163,840-token vocabulary is ~84 M exp a step.
    std::vector<TokenLogprobs> lps(n);
    parallel_for(int64_t(keep_rows.size()), 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const size_t j = size_t(keep_rows[size_t(i)]);
        if (is_score[j]) continue;
        lps[j] = token_logprobs(kept_logits + size_t(i) * size_t(vocab), vocab, sampled[j],
                                row_live[j]->top_logprobs);
      }
    });
    parallel_for(int64_t(score_rows.size()), 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const ScoreRow& sr = score_rows[size_t(i)];
        Live& live = *sr.live;
        const int32_t token = live.request.token_at(sr.position + 1);
        live.prompt_logprobs[size_t(sr.position + 1 - live.prompt_logprobs_from)] = token_logprobs(
            kept_logits + sr.keep * size_t(vocab), vocab, token, std::max(0, live.top_logprobs));
      }
    });
    // Verification (engine/spec/verify.h, tree_verify.h): per sampled seq, the path its target
    // rows' own samples follow through its drafts, then the target's token after the path. A
    // tree's accepted nodes' target KV moves to the committed positions (kv_len + 1 + k).
    std::vector<std::vector<int32_t>> committed;
    std::vector<size_t> sampled_seq_index;  // the seq of each committed entry
    // Of each seq: the rows of its block that are committed (its tokens, then the accepted
    // drafts), by committed position.
    std::vector<std::vector<int32_t>> kept_rows(step.seqs.size());
    std::vector<std::vector<int32_t>> paths(step.seqs.size());  // of each sampled seq
    std::vector<int32_t> move_from, move_to;                    // target KV slots
    SpecStepCounts spec;
    for (size_t s = 0; s < step.seqs.size(); ++s) {
      const ScheduledSeq& seq = step.seqs[s];
      std::vector<int32_t>& kept = kept_rows[s];
      for (int32_t i = 0; i < seq.num_new_tokens; ++i) kept.push_back(i);
      if (first_row[s] == n) continue;
      const DraftTree& tree = trees[s];
      const TreeAcceptance acc =
          accept_tree(tree, std::span(sampled).subspan(first_row[s], size_t(tree.size())));
      const int32_t a = acc.accepted();
      // Block row of tree node i: the seq's last new token's row + i.
      const int32_t root_row = seq.num_new_tokens - 1;
      for (int32_t k = 1; k <= a; ++k) kept.push_back(root_row + acc.path[size_t(k)]);
      const int32_t q0 = plan.q_indptr[s] + root_row;
      for (const auto& [from, to] : accepted_kv_moves(acc.path)) {
        move_from.push_back(plan.slot_mapping[size_t(q0 + from)]);
        move_to.push_back(plan.slot_mapping[size_t(q0 + to)]);
      }
      committed.push_back(acc.committed_tokens(tree));
      paths[s] = acc.path;
      sampled_seq_index.push_back(s);
      if (!seq.draft.empty()) {
        Live& live = *live_.at(seq.request->id());
        ++live.spec_verify_ct;
        live.spec_draft_token_num += int32_t(seq.draft.size());
        live.spec_accept_token_num += a;
        spec.add(int32_t(seq.draft.size()), a);
      }
    }
    // Before anything reads the committed positions (the next forward, a KV export, the host
    // tier's copies of pages complete() caches); the rows they leave are past kv_len.
    if (!move_from.empty()) model_->move_kv_rows(*kv_, move_from, move_to);
    std::vector<int32_t> kv_before(step.seqs.size()), out_before(step.seqs.size());
    for (size_t s = 0; s < step.seqs.size(); ++s) {
      kv_before[s] = step.seqs[s].request->kv_len();
      out_before[s] = step.seqs[s].request->output_len();
    }
    std::vector<Request*> finished = state_->complete(step, committed);
    int64_t user_tokens = 0;
    for (size_t k = 0; k < committed.size(); ++k) {
      const size_t s = sampled_seq_index[k];
      Request* r = step.seqs[s].request;
      Live& live = *live_.at(r->id());
      // What complete() appended (a stop token or the length limit may cut the committed list).
      const int32_t appended = r->output_len() - out_before[s];
      for (int32_t t = 0; t < appended; ++t) {
        const int32_t token = r->output_ids()[size_t(out_before[s] + t)];
        // The row that sampled it: the t-th node of the accepted path.
        const size_t row = first_row[s] + size_t(paths[s][size_t(t)]);
        if (!sample_is_greedy(row_params[row])) live.rng.uniform();
        if (r->params().edits_logits()) live.output_counts.add(token);
        std::vector<TokenLogprobs> lp;
        if (live.top_logprobs >= 0) lp.push_back(std::move(lps[row]));
        emit(live, {token}, std::move(lp), /*resumed=*/false, appended - t - 1);
        user_tokens += live.internal ? 0 : 1;
        if (!live.stopped_by_string) continue;
        // A stop string: what followed in this step is dropped, as a plain decode would never
        // have produced it.
        state_->truncate_output(r, out_before[s] + t + 1);
        if (r->state() == RequestState::kDecoding) {
          state_->finish(r, FinishReason::kStop);
          finished.push_back(r);
        }
        break;
      }
    }
    SpecPhases phases{.draft_s = last_draft_seconds,
                      .verify_s = std::chrono::duration<double>(fwd_end - fwd_begin).count()};
    last_draft_seconds = 0;
    if (drafter_) {
      const auto observe_begin = StepClock::now();
      // Whether the next step speculates (the drafter then keeps what propose() needs): the
      // next decision's decodes are the running requests that decode now (fewer if it retracts).
      const int32_t threshold = config_.speculative.batch_size_threshold;
      bool drafts_next = threshold <= 0;
      if (!drafts_next) {
        int64_t decoding = 0;
        for (const Request* r : state_->running())
          decoding += r->state() == RequestState::kDecoding ? 1 : 0;
        drafts_next = decoding <= threshold;
      }
      observe_committed(step, plan, captured, kv_before, paths, drafts_next);
      phases.observe_s = seconds_since(observe_begin);
    }
    // Captured states of the committed positions (a rejected draft's are not the request's).
    // The block changes hands here, after the drafter read it: `captured` is not valid after this.
    if (captured != nullptr) store_captured(step, plan, kept_rows);
    {
      const double seconds = std::chrono::duration<double>(StepClock::now() - step_begin).count();
      step_seconds_[size_t(stats_.steps_total % int64_t(step_seconds_.size()))] = seconds;
      std::lock_guard<std::mutex> lk(mu_);
      ++stats_.steps_total;
      stats_.generation_tokens_total += user_tokens;
      stats_.last_step_seconds = seconds;
      stats_.longest_recent_step_seconds =
          *std::max_element(step_seconds_.begin(), step_seconds_.end());
      spec.add_to(&stats_);
    }
    if (!step.is_prefill)
      decode_log.add(step.seqs.size(), user_tokens, spec, drafter_ != nullptr,
                     int64_t(pool_->num_used_pages()) * config_.page_size, plan_.kv_tokens, phases);
    export_kv(step.seqs);  // pages this step completed, for requests that checkpoint their KV
    for (Request* r : finished) retire(r->id());
    retire_written(/*wait=*/false);  // requests of earlier steps whose rows are stored by now
    timing.add(step_begin, fwd_begin, fwd_end, n);
  }
}

// Tells the drafter what each request committed this step: the positions whose KV is now
// committed target KV, the token after each, and their captured hidden states.
void Engine::observe_committed(const ScheduledStep& step, const BatchPlan& plan,
                               const uint8_t* captured, std::span<const int32_t> kv_before,
                               std::span<const std::vector<int32_t>> paths, bool drafts_next) {
  const int64_t width = runner_->capture_width();
  const DType dtype = runner_->capture_dtype();
  const int64_t row_bytes = width * dtype_size(dtype);
  std::vector<CommittedTokens> news;
  std::vector<std::vector<int32_t>> next_tokens, hidden_rows;
  news.reserve(step.seqs.size());
  next_tokens.reserve(step.seqs.size());
  hidden_rows.reserve(step.seqs.size());
  for (size_t s = 0; s < step.seqs.size(); ++s) {
    const ScheduledSeq& seq = step.seqs[s];
    const Request& r = *seq.request;
    const int32_t first = kv_before[s];
    // Committed KV now ends at kv_len (a retraction or abort since planning: nothing); each
    // position's next token must exist (the request's last token has no successor yet).
    const int32_t end = r.is_running() || r.state() == RequestState::kFinished
                            ? std::min(r.kv_len(), r.total_len() - 1)
                            : first;
    if (end <= first) continue;
    const int32_t rows = plan.q_indptr[s + 1] - plan.q_indptr[s];
    std::vector<int32_t> next;
    for (int32_t p = first; p < end; ++p) next.push_back(r.token_at(p + 1));
    // The rejected rows' successors as the verify had them: the drafts after the committed.
    for (int32_t i = end - first; i < rows; ++i)
      next.push_back(seq.draft.empty()
                         ? next.back()
                         : seq.draft[std::min<size_t>(size_t(i), seq.draft.size() - 1)]);
    next_tokens.push_back(std::move(next));
    const std::span<const int32_t> all = next_tokens.back();
    // A tree's committed positions read the accepted path's rows, the rest its other nodes'.
    std::vector<int32_t> order;
    if (!seq.draft_parents.empty()) {
      order = paths[s];
      std::vector<bool> on_path(size_t(rows), false);
      for (int32_t v : order) on_path[size_t(v)] = true;
      for (int32_t v = 0; v < rows; ++v)
        if (!on_path[size_t(v)]) order.push_back(v);
    }
    hidden_rows.push_back(std::move(order));
    news.push_back(CommittedTokens{
        .request = &r,
        .first_position = first,
        .count = end - first,
        .next_tokens = all.first(size_t(end - first)),
        .hidden = captured == nullptr ? nullptr : captured + int64_t(plan.q_indptr[s]) * row_bytes,
        .hidden_rows = hidden_rows.back(),
        .rows = std::max(rows, end - first),
        .step_tokens = all,
        .step_pages = std::span(plan.page_indices)
                          .subspan(size_t(plan.page_indptr[s]),
                                   size_t(plan.page_indptr[s + 1] - plan.page_indptr[s]))});
  }
  drafter_->observe(news, width, dtype, drafts_next);
}

// Hands the step's captured block, with each kept row's request and position, to the capture
// writer, which scatters the rows into each capturing request's CapturedStates (by position: a
// recomputed position is written again) while the engine runs the next steps. Seq s keeps the
// rows kept_rows[s] of its block, by committed position: its new tokens and the drafts it
// accepted (a tree's accepted path: rows that need not be consecutive; each run of consecutive
// rows is one segment). The block changes hands by a swap; the engine waits here only when the
// writer is `depth` blocks behind.
void Engine::store_captured(const ScheduledStep& step, const BatchPlan& plan,
                            std::span<const std::vector<int32_t>> kept_rows) {
  if (capture_writer_ == nullptr) return;  // the drafter's capture alone: nothing to store
  CaptureJob job;
  std::vector<Live*> lives;
  // The committed position of each block row (a tree node's row holds rope position
  // kv_len + depth, which is the committed position of an accepted node).
  job.positions.assign(plan.positions.begin(), plan.positions.begin() + plan.num_tokens());
  for (size_t s = 0; s < step.seqs.size(); ++s) {
    Live* live = live_.at(step.seqs[s].request->id()).get();
    const std::vector<int32_t>& kept = kept_rows[s];
    if (live->capture == nullptr || kept.empty()) continue;
    lives.push_back(live);
    for (size_t i = 0; i < kept.size();) {
      size_t end = i + 1;
      while (end < kept.size() && kept[end] == kept[end - 1] + 1) ++end;
      job.states.push_back(live->capture);
      job.row_begin.push_back(plan.q_indptr[s] + kept[i]);
      job.row_count.push_back(int32_t(end - i));
      i = end;
    }
  }
  if (lives.empty()) return;
  job.width = runner_->capture_width();
  job.dtype = runner_->capture_dtype();
  job.rows = capture_writer_->take_buffer();
  runner_->swap_captured(job.rows);
  const uint64_t seq = capture_writer_->submit(std::move(job));
  for (Live* live : lives) live->capture_fence = seq;
}

void Engine::retire(int64_t id) {
  auto it = live_.find(id);
  if (it == live_.end()) return;
  std::unique_ptr<Live> live = std::move(it->second);
  live_.erase(it);
  if (!retiring_.empty() || (live->capture != nullptr && capture_writer_ != nullptr &&
                             !capture_writer_->written(live->capture_fence))) {
    retiring_.push_back(std::move(live));  // in order: events of requests keep their ending order
    return;
  }
  finalize(*live);
}

void Engine::retire_written(bool wait) {
  while (!retiring_.empty()) {
    Live& live = *retiring_.front();
    if (live.capture != nullptr && capture_writer_ != nullptr) {
      if (wait)
        capture_writer_->wait(live.capture_fence);
      else if (!capture_writer_->written(live.capture_fence))
        return;
    }
    finalize(live);
    retiring_.pop_front();
  }
}

std::vector<HostTierRankStats> Engine::rank_host_stats(bool force) {
  if (!hicache_) return {};
  if (group_host_tier_ == nullptr) {
    const HiCacheStats h = hicache_->stats();
    return {HostTierRankStats{.rank = 0,
                              .host_bytes = host_io_->host_bytes(),
                              .pages_to_host = h.backed_up_pages,
                              .pages_to_device = h.promoted_pages,
                              .bytes_to_host = h.bytes_to_host,
                              .bytes_to_device = h.bytes_to_device,
                              .copy_seconds = h.copy_seconds}};
  }
  const auto now = StepClock::now();
  if (!force && (!group_host_tier_->stats_stale() ||
                 (!live_.empty() && now - last_rank_stats_ < std::chrono::seconds(1))))
    return {};
  last_rank_stats_ = now;
  auto ranks = group_host_tier_->gather_rank_stats();
  if (!ranks.ok()) {
    LOG_WARN("host KV tier: the ranks' statistics were not gathered: {}",
             ranks.status().to_string());
    return {};
  }
  return std::move(ranks).value();
}

void Engine::update_stats() {
  if (hicache_) hicache_->poll();  // landed copies let go of their pages before counting
  std::vector<HostTierRankStats> ranks = rank_host_stats(/*force=*/false);
  const RadixCacheStats cs = cache_->stats();
  std::lock_guard<std::mutex> lk(mu_);
  stats_.num_running = int64_t(state_->num_running());
  stats_.num_waiting = int64_t(state_->num_waiting()) + int64_t(inbox_.size());
  stats_.kv_tokens_total = plan_.kv_tokens;
  stats_.kv_tokens_used = int64_t(pool_->num_used_pages()) * config_.page_size;
  stats_.kv_tokens_cached = int64_t(cs.evictable_pages) * config_.page_size;
  stats_.cache_hit_tokens_total = cs.hit_tokens;
  stats_.cache_lookup_tokens_total = cs.lookup_tokens;
  stats_.new_token_ratio = state_->new_token_ratio();
  stats_.prefill_tokens_total = state_->prefill_tokens_total();
  if (hicache_) stats_.hicache = hicache_->stats();
  if (!ranks.empty()) stats_.hicache_ranks = std::move(ranks);
  stats_.cpu_fallback_ops = backend_->cpu_fallback_counts();
  // Requests finalized since the last update stop counting as live only now, so wait_idle()
  // returns with stats that already show them gone.
  live_count_ -= finalized_pending_;
  finalized_pending_ = 0;
  if (live_count_ == 0) idle_cv_.notify_all();
}

}  // namespace strata
