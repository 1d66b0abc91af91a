// A loaded model: its forward pass written once against the Backend op interface.
// Architectures: arch/llama.cc (llama, mistral, qwen2, qwen3), arch/deepseek.cc (MLA + MoE).
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/attention_metadata.h"
#include "backend/backend.h"
#include "core/status.h"
#include "model/spec.h"

namespace strata {

class WeightStore;
struct TpRank;

// One forward step over a ragged batch (prefill chunks and decodes mixed).
struct ForwardBatch {
  const int32_t* token_ids = nullptr;  // host [attn.num_tokens]
  AttentionMetadata attn;
  // Rows of the batch that need logits (e.g. the last new token of each sequence).
  const int32_t* logit_rows = nullptr;  // host [num_logit_rows]
  int num_logit_rows = 0;
  // Hidden-state capture (Model::set_capture): when set, the forward copies the captured states
  // of every token into the model's fixed device buffer and downloads them here once, as
  // [attn.num_tokens, capture_width()] of capture_dtype() (rank 0 only; a worker rank passes null).
  void* captured = nullptr;
};

// Which hidden states a forward captures (the model runner's production path for layer outputs;
// the Tracer stays a test hook). Column blocks of the captured rows, in this order:
//   layers[i]:  the output of decoder layer layers[i] (the residual stream after it, what enters
//               layer layers[i] + 1) = Hugging Face's output_hidden_states[layers[i] + 1]
//   final_norm: the final norm's output (what lm_head reads) = output_hidden_states[-1]
// Under tensor parallelism these are full hidden size (the residual stream after the all-reduce).
struct CaptureSpec {
  std::vector<int> layers;
  bool final_norm = false;
  int num_states() const { return int(layers.size()) + (final_norm ? 1 : 0); }
  bool empty() const { return num_states() == 0; }
};

// What Model::forward_sample does with the logit rows: each is changed by the edits (penalties,
// logit_bias) and sampled where the logits are (Backend::edit_logits, Backend::sample; on CUDA
// only the ids come back), and the rows a caller needs in full (top logprobs) are also downloaded,
// as the model computed them (before the edits).
struct SampleArgs {
  const SampleRowParams* params = nullptr;  // host [num_logit_rows]
  int32_t* token_ids = nullptr;             // host [num_logit_rows], written
  const int32_t* keep_rows = nullptr;       // host [num_keep]: indices into the logit rows
  int num_keep = 0;
  float* kept_logits = nullptr;      // host [num_keep, vocab_size] float32, written
  const LogitEdit* edits = nullptr;  // host [num_edits]; rows index the logit rows
  int64_t num_edits = 0;
};

class Model {
 public:
  virtual ~Model() = default;
  const ModelSpec& spec() const { return spec_; }
  Backend& backend() const { return *backend_; }

  // K/V widths per token per layer (num_pages, page_size and dtype are the caller's).
  virtual KvLayout kv_layout() const = 0;

  // Runs the batch, writes the new tokens' K/V into `kv`, and writes float32 logits
  // [num_logit_rows, vocab_size] to host memory `logits`. Engine thread only. A tensor-parallel
  // worker rank (dist/tp_driver.cc) passes null: its forward only joins the group's collectives.
  virtual void forward(const ForwardBatch& batch, KvStorage& kv, float* logits) = 0;
  // Runs the batch like forward() and samples its logit rows by `args` (SampleArgs) instead of
  // handing back all logits. Engine thread only.
  virtual void forward_sample(const ForwardBatch& batch, KvStorage& kv, const SampleArgs& args) = 0;
  // Runs the batch like forward() and hands its logit rows [num_logit_rows, vocab_size] to
  // `consumer` where they are (a tensor of backend(), its activation dtype, alive during the call)
  // instead of downloading them: eval-kv reduces them to statistics on the device
  // (Backend::logit_stats). Default: forward() to host memory, uploaded. Engine thread only.
  using LogitsConsumer = std::function<void(const Tensor& logits)>;
  virtual void forward_logits(const ForwardBatch& batch, KvStorage& kv,
                              const LogitsConsumer& consumer);

  // Moves KV rows within `kv` (Backend::kv_move_rows: slot from[i] to slot to[i], in order; the
  // accepted nodes of draft trees, engine/spec/tree_verify.h). Virtual: a tensor-parallel
  // group's model (dist/tp_driver.cc) moves them in every rank's pool. Engine thread only.
  virtual void move_kv_rows(KvStorage& kv, std::span<const int32_t> from,
                            std::span<const int32_t> to);

  // Allocates the capture buffer [max_tokens, capture_width()] once (fixed device memory, so a
  // CUDA graph that writes it replays), for ForwardBatch::captured. An empty spec turns it off.
  // Errors: a layer out of range, or the same layer twice. Virtual: a tensor-parallel group's
  // model (dist/tp_driver.cc) hands it to rank 0's model, whose residual stream is whole.
  virtual Status set_capture(const CaptureSpec& spec, int64_t max_tokens);
  const CaptureSpec& capture_spec() const { return capture_; }
  int64_t capture_width() const { return int64_t(capture_.num_states()) * spec_.hidden_size; }
  // The captured rows' dtype: the activations' (bf16 on the GPU, float32 on the CPU reference).
  DType capture_dtype() const { return backend_->activation_dtype(); }

  // Receives every named intermediate (design.md §7) when set: tests diff layer by layer.
  using Tracer = std::function<void(std::string_view name, int layer, const Tensor& t)>;
  void set_tracer(Tracer tracer) { tracer_ = std::move(tracer); }

 protected:
  Model(ModelSpec spec, Backend& backend) : spec_(std::move(spec)), backend_(&backend) {}
  void trace(const Tensor& t, std::string_view name, int layer = -1) const {
    if (tracer_) tracer_(name, layer, t);
  }

  // Checks `spec` and records it (capture_spec(), capture_width()) without a buffer.
  Status set_capture_spec(const CaptureSpec& spec);
  // The column block of layer `layer`'s output in the capture buffer, or -1 when not captured.
  int capture_block(int layer) const {
    return layer < int(capture_block_.size()) ? capture_block_[size_t(layer)] : -1;
  }

  ModelSpec spec_;
  Backend* backend_;
  Tracer tracer_;
  CaptureSpec capture_;
  std::vector<int> capture_block_;  // per layer: its column block, -1 when not captured
  DeviceTensorPtr capture_buf_;     // [max_tokens, capture_width()], activation dtype
  int64_t capture_max_tokens_ = 0;
};

// Reads config.json and the safetensors weights of `dir` and builds the model on `backend`.
StatusOr<std::unique_ptr<Model>> load_model(const std::string& dir, Backend& backend);
// Same with an already-parsed spec and opened weights.
StatusOr<std::unique_ptr<Model>> create_model(const ModelSpec& spec, const WeightStore& weights,
                                              Backend& backend);
// Rank tp.rank() of a tensor-parallel group (arch/tp.h): loads only that rank's weight slices and
// runs its part of every forward with the group. Thread-safe across ranks (one thread each).
StatusOr<std::unique_ptr<Model>> create_model(const ModelSpec& spec, const WeightStore& weights,
                                              Backend& backend, const TpRank& tp);

// Per-architecture factories (arch/llama.cc, arch/deepseek.cc).
StatusOr<std::unique_ptr<Model>> create_llama_model(const ModelSpec& spec,
                                                    const WeightStore& weights, Backend& backend,
                                                    const TpRank& tp);
StatusOr<std::unique_ptr<Model>> create_deepseek_model(const ModelSpec& spec,
                                                       const WeightStore& weights, Backend& backend,
                                                       const TpRank& tp);
// The expert routing a DeepSeek-family spec asks for (arch/deepseek.cc): what its MoE layers pass
// to Backend::moe_route (tests and benchmarks route the same way).
MoeRouteArgs route_args_from(const ModelSpec& spec);

// Helpers shared by the architectures' loaders.
// Loads `name` with `shape` as float32 and uploads it in the backend's weight dtype.
StatusOr<DeviceTensorPtr> load_weight(const WeightStore& weights, Backend& backend,
                                      const std::string& name, const Shape& shape);
// Loads several [out_i, in] matrices (and optional biases) and stacks them along the output
// dimension into one fused linear weight (QKV, gate/up).
struct LinearPart {
  std::string name;  // without ".weight"
  int64_t out_features;
};
StatusOr<LinearWeight> load_fused_linear(const WeightStore& weights, Backend& backend,
                                         const std::vector<LinearPart>& parts, int64_t in_features,
                                         bool with_bias);

}  // namespace strata
