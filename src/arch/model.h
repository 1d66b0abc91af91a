// A loaded model: its forward pass written once against the Backend op interface.
// Architectures: arch/llama.cc (llama, mistral, qwen2, qwen3), arch/deepseek.cc (MLA + MoE).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

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
  float* kept_logits = nullptr;             // host [num_keep, vocab_size] float32, written
  const LogitEdit* edits = nullptr;         // host [num_edits]; rows index the logit rows
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

  // Receives every named intermediate (design.md §7) when set: tests diff layer by layer.
  using Tracer = std::function<void(std::string_view name, int layer, const Tensor& t)>;
  void set_tracer(Tracer tracer) { tracer_ = std::move(tracer); }

 protected:
  Model(ModelSpec spec, Backend& backend) : spec_(std::move(spec)), backend_(&backend) {}
  void trace(const Tensor& t, std::string_view name, int layer = -1) const {
    if (tracer_) tracer_(name, layer, t);
  }

  ModelSpec spec_;
  Backend* backend_;
  Tracer tracer_;
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
                                                       const WeightStore& weights,
                                                       Backend& backend, const TpRank& tp);
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
