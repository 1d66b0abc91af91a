// `strata eval-kv`: measures what a lossy KV cache costs in model quality (design.md §5).
// Teacher forcing over a token stream made from a JSONL dataset, cut into windows of
// `context_len`; every candidate KV configuration is compared, position by position, with the
// bf16-KV reference on the same windows (one reference pass serves all candidates). Also: a
// noise floor (bf16 against bf16 with another batch composition), free-running greedy
// divergence, per-layer sensitivity and scale calibration.
//
// Any backend (--device) and tensor parallelism (--tp-size: the engine's ranks through a
// ParallelRuntime, dist/tensor_parallel.h); the reference and every candidate run on the same
// devices. Windows go through the model in groups of `batch_windows` (one forward carries a chunk
// of each); the reference's logits of a group stay on the device (eval/reference_logits.h) and
// each candidate's are reduced there to per-position statistics (Backend::logit_stats), so only
// those reach the host. Finished groups can be checkpointed (eval/eval_checkpoint.h).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "arch/model.h"
#include "engine/kv_config.h"
#include "engine/parallel_runtime.h"
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
  int noise_chunk = 97;       // the noise-floor run: other chunks, page size 1, windows in pairs
  bool allow_repeat = false;  // wrap around the stream when it holds fewer than max_tokens
  int free_run_prompts = 16;
  int free_run_tokens = 64;
  Device device = Device::kCpu;  // the reference and the candidates run here
  int tp_size = 1;               // > 1: the ranks of the ParallelRuntime given to create()
  bool tp_allow_uneven = false;  // tests: split the 5-head house models (model/sharding.h)
  int batch_windows =
      2;  // windows per forward (a chunk of each); the noise floor batches half as many
  std::string checkpoint_path{};  // resumable statistics of finished groups ("" = none)
  int64_t stop_after_windows =
      0;  // > 0: stop after scoring this many new windows (interruption, for tests)
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

  // `parallel`: the runtime of --tp-size > 1 (dist/tensor_parallel.h), else may be null.
  static StatusOr<std::unique_ptr<KvEvaluator>> create(const EvalKvOptions& options,
                                                       const ParallelRuntime* parallel = nullptr);
  const ModelSpec& spec() const { return model_->spec(); }
  const EvalData& data() const { return data_; }
  const EvalKvOptions& options() const { return options_; }
  void set_progress(Progress p) { progress_ = std::move(p); }

  // Resolves KV options for this model (checkpoint scales included); errors when this backend
  // cannot store the configuration.
  StatusOr<KvCacheConfig> resolve(const KvCacheOptions& kv) const;
  // Where the forward passes run, as the records name it: device, tp size, activation dtype.
  nlohmann::json deployment() const;

  // Compares every candidate with the reference over the windows (and free-running prompts).
  // With noise_floor, the first result is "bf16-noise": bf16 against bf16, other batching.
  // `windows`: null = the dataset's; max_windows < 0: all of them. With `checkpoint`, groups a
  // checkpoint file (options().checkpoint_path) already holds are not computed again.
  // Errors: a checkpoint of another run. `stopped` (optional) is set when stop_after_windows ended
  // the run early (the results then cover only part of the windows).
  StatusOr<std::vector<CandidateResult>> compare(
      const std::vector<std::pair<std::string, KvCacheConfig>>& candidates, bool noise_floor,
      bool free_run, const std::vector<std::vector<int32_t>>* windows = nullptr,
      int max_windows = -1, bool checkpoint = false, bool* stopped = nullptr);

  // Per-layer amax of K and V over the first `tokens` tokens of `windows` (exact KV), turned
  // into scales amax / max_finite(dtype). Reads the KV pool on the host: --device cpu, tp 1.
  KvScales calibrate(const std::vector<std::vector<int32_t>>& windows, int64_t tokens, DType dtype);
  // Mean KL of quantizing one layer at a time to `base` (its dtype and scales; every other layer
  // bf16) over the first `tokens` positions. [num_layers].
  StatusOr<std::vector<double>> layer_sensitivity(const KvCacheConfig& base,
                                                  const std::vector<std::vector<int32_t>>& windows,
                                                  int64_t tokens);

  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const PromptEncoder& encoder() const { return *encoder_; }

 private:
  KvEvaluator() = default;
  void report(const std::string& what, int64_t done, int64_t total) const {
    if (progress_) progress_(what, done, total);
  }

  // The run's identity for its checkpoint: what must be equal for saved statistics to apply.
  std::string checkpoint_key(const std::vector<std::pair<std::string, KvCacheConfig>>& candidates,
                             bool noise_floor, const std::vector<std::vector<int32_t>>& windows,
                             size_t n_windows) const;

  EvalKvOptions options_;
  std::unique_ptr<Backend>
      backend_;  // declared before model_: the model (and its ranks) goes first
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
