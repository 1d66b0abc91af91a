// `strata eval-kv`: measures what a lossy KV cache costs in model quality (design.md §5).
// Teacher forcing over a token stream made from a JSONL dataset, cut into windows of
// `context_len`; every candidate KV configuration is compared, position by position, with the
// bf16-KV reference on the same windows (one reference pass serves all candidates). Also: a
// noise floor (bf16 against bf16 with another batch composition: two windows batched together,
// other chunk and page sizes), free-running greedy divergence, per-layer sensitivity and scale
// calibration. CPU backend; the forward pass is multithreaded (parallel_for).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "arch/model.h"
#include "engine/kv_config.h"
#include "eval/kv_metrics.h"
#include "model/weights.h"
#include "tokenizer/prompt_encoder.h"
#include "tokenizer/tokenizer.h"

namespace strata {

struct EvalKvOptions {
  std::string model_path{};
  std::string data_path{};
  int64_t max_tokens = 100000;  // scored positions per candidate
  int context_len = 1024;       // window length; positions 0 .. context_len - 2 are scored
  int chunk = 256;              // prefill chunk of the reference and the candidates
  int page_size = 16;
  int noise_chunk = 97;         // the noise-floor run: other chunks, page size 1, windows in pairs
  bool allow_repeat = false;    // wrap around the stream when it holds fewer than max_tokens
  int free_run_prompts = 16;
  int free_run_tokens = 64;
};

// The dataset as the evaluator uses it.
struct EvalData {
  std::vector<std::vector<int32_t>> windows;  // each context_len tokens
  std::vector<std::vector<int32_t>> prompts;  // free-running prompts
  int64_t stream_tokens = 0;                  // tokens in the whole stream
  int64_t records = 0;
  bool repeated = false;  // windows wrap around the stream (allow_repeat)
};

// Tokenizes every record of a JSONL file ({"text"}, {"messages"}, {"conversations"} or
// {"prompt"}) into one stream (documents concatenated, each as the tokenizer/chat template
// encodes it) and cuts it into windows of `context_len` until `max_tokens` positions are scored.
StatusOr<EvalData> load_eval_data(const std::string& path, const PromptEncoder& encoder,
                                  int context_len, int64_t max_tokens, bool allow_repeat,
                                  int free_run_prompts);

struct FreeRunResult {
  int prompts = 0;
  int tokens_per_prompt = 0;
  std::vector<int> first_divergence;  // per prompt; tokens_per_prompt when identical
  nlohmann::json to_json() const;
};

struct CandidateResult {
  std::string label;
  KvCacheConfig config;
  KvMetrics metrics;
  FreeRunResult free_run;
};

class KvEvaluator {
 public:
  using Progress = std::function<void(const std::string& what, int64_t done, int64_t total)>;

  static StatusOr<std::unique_ptr<KvEvaluator>> create(const EvalKvOptions& options);
  const ModelSpec& spec() const { return model_->spec(); }
  const EvalData& data() const { return data_; }
  const EvalKvOptions& options() const { return options_; }
  void set_progress(Progress p) { progress_ = std::move(p); }

  // Resolves KV options for this model (checkpoint scales included).
  StatusOr<KvCacheConfig> resolve(const KvCacheOptions& kv) const;

  // Compares every candidate with the reference over the windows (and free-running prompts).
  // With noise_floor, the first result is "bf16-noise": bf16 against bf16, other batching.
  // `windows`: null = the dataset's; max_windows < 0: all of them.
  std::vector<CandidateResult> compare(const std::vector<std::pair<std::string, KvCacheConfig>>& candidates,
                                       bool noise_floor, bool free_run,
                                       const std::vector<std::vector<int32_t>>* windows = nullptr,
                                       int max_windows = -1);

  // Per-layer amax of K and V over the first `tokens` tokens of `windows` (exact KV), turned
  // into scales amax / max_finite(dtype).
  KvScales calibrate(const std::vector<std::vector<int32_t>>& windows, int64_t tokens, DType dtype);
  // Mean KL of quantizing one layer at a time to `base` (its dtype and scales; every other layer
  // bf16) over the first `tokens` positions. [num_layers].
  std::vector<double> layer_sensitivity(const KvCacheConfig& base,
                                        const std::vector<std::vector<int32_t>>& windows, int64_t tokens);

  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const PromptEncoder& encoder() const { return *encoder_; }

 private:
  KvEvaluator() = default;
  void report(const std::string& what, int64_t done, int64_t total) const {
    if (progress_) progress_(what, done, total);
  }

  EvalKvOptions options_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<PromptEncoder> encoder_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<WeightStore> weights_;
  EvalData data_;
  Progress progress_;
};

// The bf16 reference configuration for a model.
KvCacheConfig reference_kv_config(const ModelSpec& spec);
// The layers to keep in bf16: the `count` with the largest sensitivity, sorted.
std::vector<int> most_sensitive_layers(const std::vector<double>& sensitivity, int count);

}  // namespace strata
