// Speculative decoding on the CPU reference: house-llama, greedy, N chat prompts (the chat
// template applied), T new tokens each (ignore_eos), at batch 1 (--max-running-requests 1, one
// request at a time) and at batch N, with and without speculation. Prints output tokens per
// second of wall time, the mean accept length, the verifies by accept length and whether the
// outputs are identical (they must be: the CPU reference is batch invariant).
//   NGRAM (default): the first N prompts of prompts-explain.jsonl.
//   EAGLE3 (--algorithm EAGLE3, --drafter DIR: the committed house-llama drafter by default): the
//     prompts the drafter never saw, the last 100 of prompts-define.jsonl and the last 50 of
//     prompts-explain.jsonl interleaved (as tests/support/eagle3_heldout.h), the first N of them.
//     --topk K > 1 drafts trees of --draft-tokens T tokens (0: the default, spec_config.h).
//
// Usage: strata_bench_spec_cpu_bench [--algorithm NGRAM|EAGLE3] [--drafter DIR] [--prompts N]
//                                    [--new T] [--steps K] [--topk K] [--draft-tokens T]
//                                    [--model DIR]
#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/parse_enum.h"
#include "engine/engine.h"
#include "tokenizer/prompt_encoder.h"

namespace strata {
namespace {

struct Args {
  int prompts = 16, new_tokens = 128, steps = 4, topk = 1, draft_tokens = 0;
  SpeculativeAlgorithm algorithm = SpeculativeAlgorithm::kNgram;
  std::string drafter = std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/eagle3/house-llama";
  std::string model = std::string(STRATA_SHARED_DIR) + "/models/house-llama";
  std::string data = std::string(STRATA_SHARED_DIR) + "/data/";
};

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(line);
  return lines;
}

// The conversations the benchmark runs (see the header).
std::vector<std::string> prompt_lines(const Args& a) {
  if (a.algorithm != SpeculativeAlgorithm::kEagle3)
    return lines_of(a.data + "prompts-explain.jsonl");
  std::vector<std::string> define = lines_of(a.data + "prompts-define.jsonl");
  std::vector<std::string> explain = lines_of(a.data + "prompts-explain.jsonl");
  define.erase(define.begin(), define.end() - 100);
  explain.erase(explain.begin(), explain.end() - 50);
  std::vector<std::string> mixed;
  for (size_t i = 0; i < explain.size(); ++i) {
    mixed.push_back(define[i]);
    mixed.push_back(explain[i]);
  }
  mixed.insert(mixed.end(), define.begin() + long(explain.size()), define.end());
  return mixed;
}

struct Run {
  std::vector<std::vector<int32_t>> outputs;
  double seconds = 0;
  EngineStats stats;
};

Run run(const Args& a, const std::vector<std::vector<int32_t>>& prompts, bool batch1, bool spec) {
  EngineConfig c;
  c.model_path = a.model;
  c.page_size = 16;
  c.chunked_prefill_size = 128;
  c.max_prefill_tokens = 128;
  if (batch1) c.max_running_requests = 1;
  if (spec) {
    c.speculative.algorithm = a.algorithm;
    c.speculative.num_steps = a.steps;
    c.speculative.eagle_topk = a.topk;
    c.speculative.num_draft_tokens = a.draft_tokens;
    if (a.algorithm == SpeculativeAlgorithm::kEagle3) c.speculative.draft_model_path = a.drafter;
  }
  auto made = Engine::create(c);
  CHECK_MSG(made.ok(), "{}", made.status().to_string());
  Engine& e = **made;
  Run r;
  r.outputs.resize(prompts.size());
  std::mutex mu;
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerateRequest g;
    g.prompt_ids = prompts[i];
    g.params.temperature = 0;
    g.params.max_new_tokens = a.new_tokens;
    g.params.ignore_eos = true;
    g.on_event = [&r, &mu, i](const StreamEvent& ev) {
      std::lock_guard<std::mutex> lk(mu);
      r.outputs[i].insert(r.outputs[i].end(), ev.token_ids.begin(), ev.token_ids.end());
    };
    CHECK(e.submit(std::move(g)).ok());
  }
  e.wait_idle();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.stats = e.stats();
  return r;
}

// The --speculative-num-draft-tokens the engine resolves for `a` (spec_config.h's defaults).
int resolved_draft_tokens(const Args& a) {
  SpeculativeConfig c{.algorithm = a.algorithm,
                      .draft_model_path = a.drafter,
                      .num_steps = a.steps,
                      .eagle_topk = a.topk,
                      .num_draft_tokens = a.draft_tokens};
  if (a.algorithm != SpeculativeAlgorithm::kEagle3) c.draft_model_path.clear();
  const Status st = resolve_speculative_config(&c);
  CHECK_MSG(st.ok(), "{}", st.to_string());
  return c.num_draft_tokens;
}

int main_impl(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--prompts")
      a.prompts = std::stoi(v);
    else if (k == "--new")
      a.new_tokens = std::stoi(v);
    else if (k == "--steps")
      a.steps = std::stoi(v);
    else if (k == "--topk")
      a.topk = std::stoi(v);
    else if (k == "--draft-tokens")
      a.draft_tokens = std::stoi(v);
    else if (k == "--model")
      a.model = v;
    else if (k == "--drafter")
      a.drafter = v;
    else if (k == "--algorithm") {
      auto alg = parse_enum<SpeculativeAlgorithm>(v, "--algorithm");
      CHECK_MSG(alg.ok(), "{}", alg.status().to_string());
      a.algorithm = *alg;
    } else {
      std::fprintf(stderr, "spec_cpu_bench: unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  auto tok = Tokenizer::load(a.model);
  CHECK_MSG(tok.ok(), "{}", tok.status().to_string());
  auto enc = PromptEncoder::load(a.model, *tok);
  CHECK_MSG(enc.ok(), "{}", enc.status().to_string());
  std::vector<std::vector<int32_t>> prompts;
  for (const std::string& line : prompt_lines(a)) {
    if (int(prompts.size()) >= a.prompts) break;
    auto ids = enc->encode_chat(nlohmann::json::parse(line)["conversations"]);
    CHECK_MSG(ids.ok(), "{}", ids.status().to_string());
    prompts.push_back(*ids);
  }
  for (bool batch1 : {true, false}) {
    const Run plain = run(a, prompts, batch1, false);
    const Run spec = run(a, prompts, batch1, true);
    const double tokens = double(prompts.size()) * a.new_tokens;
    const EngineStats& s = spec.stats;
    std::printf(
        "batch %-3s %zu prompts x %d new tokens: plain %.1f tok/s, %s (%d steps, topk %d, %d draft "
        "tokens) %.1f tok/s "
        "(x%.2f), accept len %.2f (%lld verifies, %lld of %lld drafts accepted), outputs %s\n",
        batch1 ? "1" : "all", prompts.size(), a.new_tokens, tokens / plain.seconds,
        std::string(enum_name(a.algorithm)).c_str(), a.steps, a.topk, resolved_draft_tokens(a),
        tokens / spec.seconds, plain.seconds / spec.seconds,
        s.spec_verify_total > 0 ? double(s.spec_accepted_tokens_total + s.spec_verify_total) /
                                      double(s.spec_verify_total)
                                : 1.0,
        (long long)s.spec_verify_total, (long long)s.spec_accepted_tokens_total,
        (long long)s.spec_draft_tokens_total,
        plain.outputs == spec.outputs ? "identical" : "DIFFER");
    std::printf("  verifies by accept length:");
    for (size_t len = 1; len < s.spec_accept_length_counts.size(); ++len)
      std::printf(" %zu: %lld", len, (long long)s.spec_accept_length_counts[len]);
    std::printf("\n");
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) { return strata::main_impl(argc, argv); }
