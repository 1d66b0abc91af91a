// The op interface every architecture is written against (design.md §2, §4). A backend knows
// tensors and page tables, never models or requests. Implementations: cpu/ (the float32
// reference, plain loops plus BLAS) and cuda/ (the product).
//
// Conventions: activations are row-major [tokens, features] tensors in the backend's
// activation dtype (f32 on CPU). Weights of linear layers are [out_features, in_features] as in
// Hugging Face checkpoints. Calls are made from the one engine thread; a backend is not
// thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backend/attention_metadata.h"
#include "core/status.h"
#include "core/tensor.h"
#include "core/weight_format.h"

namespace strata {

// Memory owned by a backend (host memory on CPU, device memory on CUDA). Frees on destruction.
class DeviceTensor {
 public:
  virtual ~DeviceTensor() = default;
  const Tensor& view() const { return view_; }
  operator const Tensor&() const { return view_; }  // NOLINT: pass where a Tensor is expected

 protected:
  Tensor view_;
};
using DeviceTensorPtr = std::unique_ptr<DeviceTensor>;

// A view of memory another DeviceTensor owns (a tied lm_head reading the embedding table): the
// owner must outlive it.
class BorrowedTensor : public DeviceTensor {
 public:
  explicit BorrowedTensor(const Tensor& view) { view_ = view; }
};

// A linear layer's parameters on the device. y = x · weightᵀ + bias. `stack` > 1 holds that
// many matrices along a leading dim (a MoE layer's routed experts).
// Formats (core/weight_format.h): a backend keeps the weight in a format it computes with, at
// the bytes linear_weight_bytes says (the planner's figure); the CPU reference dequantizes
// everything to float32 at upload. `format` says what `weight` and `scales` hold.
struct LinearWeight {
  DeviceTensorPtr weight;  // kDense: [out, in] or [stack, out, in] in the backend's weight dtype;
                           // packed formats: the backend's bytes of the values
  DeviceTensorPtr scales;  // packed formats: the backend's bytes of the scales; else null
  DeviceTensorPtr bias;    // [out] float32, or null
  LinearFormat format;     // as kept on this backend (kDense unless the backend keeps packing)
  int64_t stack = 1;
  int64_t out = 0;  // 0: read from a dense weight's shape (weights uploaded without upload_linear)
  int64_t in = 0;
  int64_t out_features() const { return out > 0 ? out : weight->view().dim(-2); }
  int64_t in_features() const { return in > 0 ? in : weight->view().dim(-1); }
  bool is_dense() const { return format.format == WeightFormat::kDense; }
};

// How the K rows of a layer whose dtype is fp8 are laid out (V rows are always plain).
enum class KvFormat : uint8_t {
  kPlain,  // k_dim values in the layer's dtype, one per-layer scale (the rope split below aside)
  // DeepSeek FlashMLA's FP8 MLA row: the latent (k_dim - rope_dim values) as fp8 e4m3 in
  // 128-wide tiles, then one float32 scale per tile (tile amax / 448, set at write time), then
  // the rope part in bf16. 656 bytes per token per layer for DeepSeek-V3 (512 + 4·4 + 64·2).
  kFlashMlaFp8,
};
constexpr int kFlashMlaTile = 128;

// Paged KV storage for all layers. Each token of each layer stores `k_dim` K values and `v_dim`
// V values (GQA: both kv_heads × head_dim; MLA: k_dim = kv_lora_rank + rope dim, v_dim = 0).
struct KvLayout {
  int num_layers = 0;
  int64_t num_pages = 0;
  int page_size = 1;
  int k_dim = 0;
  int v_dim = 0;
  DType dtype = DType::kF32;
  // Per-layer dtype override (mixed precision); empty = `dtype` everywhere.
  std::vector<DType> layer_dtypes;
  // MLA: the last `rope_dim` values of each K row are the rope part (0: no split).
  int rope_dim = 0;
  // MLA: the rope part's dtype in layers whose dtype is fp8 (unset: the layer's dtype). bf16 rope
  // values are stored unscaled.
  std::optional<DType> rope_dtype;
  KvFormat format = KvFormat::kPlain;  // applies to fp8 layers only

  DType layer_dtype(int layer) const {
    return layer_dtypes.empty() ? dtype : layer_dtypes[size_t(layer)];
  }
  // True when layer's K rows are not k_dim values of one dtype (rope split or FlashMLA rows):
  // its storage is then raw bytes [num_pages, page_size, k_row_bytes].
  bool k_row_is_split(int layer) const;
  int64_t k_row_bytes(int layer) const;
  int64_t v_row_bytes(int layer) const { return dtype_bytes_for(layer_dtype(layer), v_dim); }
  int64_t bytes_per_token() const;
  int64_t total_bytes() const { return bytes_per_token() * num_pages * page_size; }
};

class KvStorage {
 public:
  virtual ~KvStorage() = default;
  const KvLayout& layout() const { return layout_; }
  // [num_pages, page_size, k_dim] in layout.layer_dtype(layer); raw bytes (kU8)
  // [num_pages, page_size, k_row_bytes] when layout.k_row_is_split(layer) (backend/kv_format.h).
  virtual Tensor k(int layer) const = 0;
  // [num_pages, page_size, v_dim]; empty when v_dim == 0
  virtual Tensor v(int layer) const = 0;
  // Per-layer dequantization scales (stored = value / scale); 1.0 unless set.
  float k_scale(int layer) const { return k_scales_[size_t(layer)]; }
  float v_scale(int layer) const { return v_scales_[size_t(layer)]; }
  void set_scales(int layer, float k_scale, float v_scale) {
    k_scales_[size_t(layer)] = k_scale;
    v_scales_[size_t(layer)] = v_scale;
  }

 protected:
  explicit KvStorage(KvLayout layout)
      : layout_(std::move(layout)),
        k_scales_(size_t(layout_.num_layers), 1.0f),
        v_scales_(size_t(layout_.num_layers), 1.0f) {}
  KvLayout layout_;
  std::vector<float> k_scales_, v_scales_;
};

// How rope is applied to one tensor (see arch/rope.h for how the frequencies are computed).
struct RopeArgs {
  const float* inv_freq = nullptr;  // host [rotary_dim / 2]
  float attention_factor = 1.0f;    // multiplies cos and sin (YaRN)
  int rotary_dim = 0;
  int offset = 0;  // first rotated dim within each head
  bool interleaved = false;
};

struct AttentionArgs {
  float scale = 1.0f;  // softmax scale
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;    // of q and k
  int v_head_dim = 0;  // of v and the output
};

// MLA attention in the absorbed form: the query is already projected into the latent space.
struct MlaArgs {
  float scale = 1.0f;
  int num_heads = 0;
  int kv_lora_rank = 0;  // latent width (also the value width in latent space)
  int rope_dim = 0;
};

// Backend::mla_attention_inputs: the cache row's norm and the rope of both parts.
struct MlaInputsArgs {
  float eps = 1e-6f;      // kv_a_layernorm's
  RopeArgs rope;          // frequencies and rotary_dim (= the rope part P); offset not read
  int q_rope_offset = 0;  // the first rotated dim of each q head (qk_nope_head_dim)
};

// Backend::mla_query: a q_lora layer's query (arch/deepseek.cc) from q_a_proj's output on.
struct MlaQueryOperands {
  const Tensor& q_a;       // [T, q_lora_rank]: q_a_proj's output
  const Tensor& q_a_norm;  // [q_lora_rank]: q_a_layernorm's weight
  float q_a_eps;
  const LinearWeight& q_b;  // [heads · (nope + rope), q_lora_rank]
  const Tensor& w_uk;       // [heads, R, nope]: W_UK_hᵀ (MlaAbsorbedWeights)
  const Tensor& kv_row;     // mla_attention_inputs' operands
  const Tensor& kv_norm;
  const MlaInputsArgs& args;
  const Tensor& q_a_normed;  // [T, q_lora_rank]: out, the norm's rows
  const Tensor& q;           // [T, heads, nope + rope]: out, rope applied
  const Tensor& q_latent;    // [T, heads, R + rope]: out, complete
};

// ---- mixture of experts (DeepSeek / Kimi routing) ----
enum class MoeScoring : uint8_t { kSoftmax, kSigmoid };
// How a group of experts is scored when routing is group-limited.
enum class MoeGroupScore : uint8_t {
  kMax,      // best expert of the group (DeepSeek-V2 group_limited_greedy)
  kTop2Sum,  // sum of the group's two best (biased) scores (DeepSeek-V3 noaux_tc)
};

struct MoeRouteArgs {
  int num_experts = 0;
  int top_k = 0;
  int num_groups = 1;   // experts split into equal contiguous groups; 1 = no group limit
  int topk_groups = 1;  // groups a token may pick experts from
  MoeScoring scoring = MoeScoring::kSoftmax;
  MoeGroupScore group_score = MoeGroupScore::kMax;
  bool normalize = false;       // divide the chosen weights by their sum (norm_topk_prob)
  float scaling_factor = 1.0f;  // multiplies the final weights (routed_scaling_factor)
};

// Routed experts' SwiGLU weights stacked along a leading expert dim, so a backend can run
// grouped GEMMs. Expert e: y = down_e · (silu(gate_e x) ⊙ up_e x).
struct MoeExpertWeights {
  LinearWeight gate_up;  // stack num_experts × [2 · inter, hidden]: gate rows, then up rows
  LinearWeight down;     // stack num_experts × [hidden, inter]
  int64_t num_experts() const { return gate_up.stack; }
  int64_t inter() const { return down.in_features(); }
  int64_t hidden() const { return down.out_features(); }
};

// ---- sampling ----
// How one row of logits becomes a token: greedy at temperature 0 (or top_k 1), else softmax at
// `temperature` over the candidates sorted by (logit descending, id ascending), cut to the top_k,
// to those within min_p of the top probability and to the smallest prefix whose mass reaches
// top_p, then the inverse CDF at `uniform` in that order. The caller draws `uniform` from the
// request's own generator (engine/sampler.h), one draw per non-greedy token, so a seeded request
// gives the same tokens on every backend and in every batch.
// Defined edge cases (every backend): greedy is std::max_element (ties and +-0 to the lowest id;
// NaN never wins unless it is element 0, then 0 wins); when sampling, NaN counts as -inf, and a
// row whose largest logit is not finite (+inf, or nothing above -inf) returns the greedy token.
struct SampleRowParams {
  float temperature = 0.0f;  // <= 0: greedy
  float top_p = 1.0f;        // (0, 1]
  int32_t top_k = 0;         // <= 0 or >= vocab: off; 1: greedy
  float min_p = 0.0f;        // [0, 1)
  double uniform = 0.0;      // [0, 1); unused when greedy
};
inline bool sample_is_greedy(const SampleRowParams& p) {
  return p.temperature <= 0.0f || p.top_k == 1;
}
// One logit changed before sampling: a request's penalties and logit_bias on one token it names
// (the engine computes them, engine/logit_edits.h), in SGLang's order:
//   x = logits[row, token] - subtract;  x = x < 0 ? x * scale : x / scale;  x = x + bias
// each step rounded to float32 (no fused multiply-add), then stored in the logits' dtype. A row
// names a token at most once. Identity: subtract 0, scale 1, bias 0.
struct LogitEdit {
  int32_t row = 0;
  int32_t token = 0;
  float subtract = 0.0f;  // presence + frequency x count
  float scale = 1.0f;     // the repetition penalty (> 0)
  float bias = 0.0f;      // logit_bias
};
// The reference on one float32 value (backend/cpu/sampling.cc, the CPU twin of edit_logits).
float edit_logit_reference(float logit, const LogitEdit& edit);
// The reference (the CPU twin, backend/cpu/sampling.cc): one float32 row. `scratch` is reused
// between calls.
int32_t sample_row_reference(const float* logits, int64_t vocab, const SampleRowParams& p,
                             std::vector<std::pair<float, int32_t>>& scratch);
// std::max_element's index over one float32 row.
int32_t argmax_row_reference(const float* logits, int64_t vocab);

// What eval-kv keeps of one position (eval/kv_metrics.h): a candidate's logits row against the
// reference's row at the same position, whose next token is `target`. Computed in double:
//   p = softmax(ref), m = max ref, S = Σ e^(ref − m), d = ref − cand,
//   kl = Σ p·d + ln Σ p·e^(−d) = A/S + log1p(B/S), A = Σ e^(ref−m)·d, B = Σ e^(ref−m)·expm1(−d)
// (where e^(ref−m) is 0, B gets e^(cand−m): the candidate's mass the reference gives no weight)
// (two small terms instead of two log-sum-exps of the logits' magnitude, so a KL of 1e-9 nats
// survives: bf16-vs-bf16 noise floors are that small), ln-sum-exp(cand) = lse(ref) + log1p(B/S).
struct LogitStatsRow {
  float kl = 0;          // Σ p_ref (ln p_ref − ln p_cand), nats, >= 0
  float top1_agree = 0;  // 1 when the rows' argmaxes (first index of the max) are one token
  float dp = 0;          // p_cand(target) − p_ref(target)
  float nll_ref = 0;     // −ln p_ref(target)
  float nll_cand = 0;    // −ln p_cand(target)
};
// The reference on float32 rows (backend/cpu/logit_stats.cc; the CPU backend's op).
LogitStatsRow logit_stats_reference(const float* ref, const float* cand, int64_t vocab,
                                    int32_t target);

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual std::string name() const = 0;
  // The dtype of activations this backend computes in.
  virtual DType activation_dtype() const = 0;

  // ---- memory ----
  virtual DeviceTensorPtr alloc(DType dtype, const Shape& shape) = 0;
  // Copies a host tensor (float32, or bf16 / f16 as a checkpoint stores it) to a new device tensor
  // of `dtype` (weights, tables), converting exactly as float32 would (bf16 and f16 widen
  // exactly, then round to `dtype`).
  virtual DeviceTensorPtr upload(const Tensor& host, DType dtype) = 0;
  // Copies a host tensor into an existing device tensor of the same element count (converting
  // as upload does), outside any step: the buffers a caller keeps across steps (a drafter's
  // inputs) keep their addresses, so the graphs recorded over them replay with the new values.
  // Asynchronous on an asynchronous backend: `host` may be reused on return.
  virtual void upload_to(const Tensor& host, const Tensor& dst) = 0;
  // A linear weight from its stored bytes (core/weight_format.h) and an optional float32 bias
  // [out] (an empty Tensor: none). The default dequantizes to float32 and uploads a dense weight
  // in weight_dtype() (the CPU reference's way); a backend with kernels for a packed format
  // overrides it and keeps the bytes packed.
  virtual LinearWeight upload_linear(const HostLinearWeight& w, const Tensor& bias_f32);
  // Copies a device tensor to float32 host memory (logits, tests, traces).
  virtual void download_f32(const Tensor& src, float* dst) = 0;
  // Copies a contiguous device tensor to host memory as it is stored (src.dtype's bytes): the
  // model runner's captured hidden states, bf16 on the GPU, with no conversion on either side.
  // Default: download_f32, then converted back to src.dtype.
  virtual void download(const Tensor& src, void* dst);
  // Waits for the queued work and ends the current step (an asynchronous backend keeps a step's
  // staged host inputs until it ends, which a download otherwise does). Default: nothing queued.
  virtual void synchronize() {}
  // Graph mode: a step's launches are recorded and replayed as one captured graph whenever the
  // same step shape comes again (CUDA: cuda_backend.h). A backend without graphs ignores it.
  virtual void set_graph_mode(bool /*on*/) {}
  // A collective of this rank's tensor-parallel group sits here in the op stream, skipped (the
  // one-rank benchmark mode, backend/solo_comm.h): a backend that merges consecutive ops (CUDA
  // graph mode: a MoE combine with the next norm) must not merge across it, as it could not
  // across the real collective, so that one rank alone runs a real rank's kernels. `bytes`: its
  // payload. Default: nothing (no merges).
  virtual void skipped_collective(int64_t /*bytes*/) {}
  virtual std::unique_ptr<KvStorage> alloc_kv(const KvLayout& layout) = 0;
  // Whether this backend implements `layout` (dtypes, row formats); alloc_kv CHECK-fails on a
  // layout this refuses, so callers that take a layout from users ask first. Default: all.
  virtual Status check_kv_layout(const KvLayout& layout) const { return Status(); }
  // The dtype weights are stored in on this backend.
  virtual DType weight_dtype() const = 0;
  // Which stored weight formats this backend keeps packed (upload_linear); the planner sizes a
  // model's weights with it. Default: everything dequantized to weight_dtype().
  virtual WeightPolicy weight_policy() const { return WeightPolicy{.dense_dtype = weight_dtype()}; }
  // Total bytes of this backend's device memory (what the planner plans against, as SGLang
  // does: CUDA, the current device's). 0: no device memory of its own (the CPU reference; the
  // caller gives a budget).
  virtual int64_t device_memory_bytes() const { return 0; }

  // ---- ops ----
  // out[t] = table[ids[t]]; ids: host int32 [T]; table [V, H]; out [T, H]
  virtual void embedding(const int32_t* ids, int num_tokens, const Tensor& table,
                         const Tensor& out) = 0;
  // out = x · wᵀ (+ bias); x [T, in], out [T, out]
  virtual void linear(const Tensor& x, const LinearWeight& w, const Tensor& out) = 0;
  // out[r] = x[r] / rms(x[r]) * weight; x, out [R, D]; weight [D]. out may alias x.
  virtual void rms_norm(const Tensor& x, const Tensor& weight, float eps, const Tensor& out) = 0;
  // residual += x; out = rms_norm(residual). x, residual, out [T, H].
  virtual void add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight,
                            float eps, const Tensor& out) = 0;
  // out = a + b (same shapes). out may alias a.
  virtual void add(const Tensor& a, const Tensor& b, const Tensor& out) = 0;
  // out[t, i] = silu(x[t, i]) * x[t, I + i]; x [T, 2I], out [T, I]
  virtual void silu_mul(const Tensor& x, const Tensor& out) = 0;
  // Rotates, in place, dims [offset, offset + rotary_dim) of each head; x [T, heads, head_stride];
  // positions host int32 [T].
  virtual void rope(const Tensor& x, const int32_t* positions, const RopeArgs& args) = 0;
  // Writes the new tokens' K and V (k [T, k_dim], v [T, v_dim] or empty) into `layer` at
  // meta.slot_mapping, quantizing to the layer's KV dtype with its scales.
  virtual void kv_write(KvStorage& kv, int layer, const Tensor& k, const Tensor& v,
                        const AttentionMetadata& meta) = 0;
  // Copies KV rows within `kv`, in every layer, K and V as stored (whatever the dtype): slot
  // from_slots[i] to slot to_slots[i], for i = 0, 1, ... as if one after another (a copy reads
  // what an earlier one wrote; engine/spec/tree_verify.h's accepted_kv_moves never needs it).
  // Speculative decoding with draft trees moves the accepted nodes' rows into place with it
  // (engine/spec/tree_verify.h). from_slots, to_slots host int32 [n]. O(n · layers · row bytes).
  virtual void kv_move_rows(KvStorage& kv, const int32_t* from_slots, const int32_t* to_slots,
                            int n) = 0;
  // Causal paged attention of the new tokens over each sequence's whole context
  // (meta.tree_mask: draft trees).
  // q [T, num_heads, head_dim]; out [T, num_heads, v_head_dim].
  virtual void paged_attention(const Tensor& q, const KvStorage& kv, int layer,
                               const AttentionMetadata& meta, const AttentionArgs& args,
                               const Tensor& out) = 0;
  // Absorbed MLA: q_latent [T, heads, kv_lora_rank + rope_dim] against the cached latent
  // [.., kv_lora_rank + rope_dim]; out [T, heads, kv_lora_rank] (values are the latent part).
  virtual void mla_attention(const Tensor& q_latent, const KvStorage& kv, int layer,
                             const AttentionMetadata& meta, const MlaArgs& args,
                             const Tensor& out) = 0;
  // out[i] = x[rows[i]]; rows host int32 [n]; x [T, H]; out [n, H]
  virtual void gather_rows(const Tensor& x, const int32_t* rows, int n, const Tensor& out) = 0;
  // out = x[:, begin:end]; x [R, C]; out [R, end - begin] (splits fused projections).
  virtual void slice_columns(const Tensor& x, int64_t begin, int64_t end, const Tensor& out) = 0;

  // ---- fused ops (a backend may run them as one launch; the defaults call the ops above) ----
  // SwiGLU after the fused gate-up projection: out[t, i] = silu(g[t, i]) · u[t, i] where
  // [g | u] = x · wᵀ (+ bias), rounded to the activation dtype as linear then silu_mul would.
  // x [T, in]; w [2 · I, in]; out [T, I].
  virtual void linear_silu_mul(const Tensor& x, const LinearWeight& w, const Tensor& out);
  // The attention inputs of a fused QKV projection: qkv [T, (heads + 2 · kv_heads) · head_dim]
  // holds each token's Q, K and V heads. q [T, heads, head_dim] receives rope(Q); rope(K) and V
  // are written to `layer` of `kv` at meta.slot_mapping, rope at meta.positions. The same values
  // as slice_columns, rope(q), rope(k), kv_write (the default).
  virtual void qkv_rope_kv_write(const Tensor& qkv, int heads, int kv_heads, int head_dim,
                                 const RopeArgs& rope, KvStorage& kv, int layer,
                                 const AttentionMetadata& meta, const Tensor& q);
  // A MoE layer's output: out = add + moe_experts(x, experts, topk_ids, topk_weights), `add` the
  // shared experts' output [T, hidden]; out may alias add. The default runs moe_experts then
  // add; a backend may add inside its combine, before the output's one rounding.
  virtual void moe_experts_add(const Tensor& x, const MoeExpertWeights& experts,
                               const Tensor& topk_ids, const Tensor& topk_weights,
                               const Tensor& add, const Tensor& out);
  // In place: RMSNorm of each row's first weight.numel() columns of x [T, C], the other columns
  // untouched (MLA's latent inside its cache row [latent | rope]). The same values as
  // slice_columns, rms_norm, copy_columns (the default).
  virtual void rms_norm_columns(const Tensor& x, const Tensor& weight, float eps);
  // MLA's attention inputs after its q and kv_a projections (arch/mla.h), in place. kv_row
  // [T, R + P], kv_a_proj_with_mqa's output, becomes the cache row: RMSNorm (weight `norm` [R],
  // args.eps) of its latent (the first R columns), rope of its last P = args.rope.rotary_dim
  // columns; q [T, heads, Dq]: rope of each head's dims [args.q_rope_offset, + P), which are also
  // copied into q_latent [T, heads, R + P]'s columns [R, R + P) (its other columns untouched);
  // then kv_row is written into `layer` of `kv` at meta.slot_mapping. Rope at meta.positions
  // with args.rope's frequencies (its offset is not read). The same values as rms_norm_columns,
  // rope (cache row), rope (q), copy_columns, kv_write (the default); the CUDA backend runs
  // them as one launch.
  virtual void mla_attention_inputs(const Tensor& kv_row, const Tensor& norm, const Tensor& q,
                                    const Tensor& q_latent, const MlaInputsArgs& args,
                                    KvStorage& kv, int layer, const AttentionMetadata& meta);
  // A q_lora layer's MLA query in one op where the backend has one: q_a_normed =
  // rms_norm(q_a), q = q_b · q_a_normed, mla_attention_inputs (the cache rows written, q's
  // rope, q_latent's rope columns) and q_latent's first R columns of each head = W_UK_hᵀ q_nope
  // (per_head_linear). Returns false, having done nothing, where it has none (the default, and
  // shapes a backend's fused op does not take): the caller then runs those ops one by one, whose
  // values a true return gives as well.
  virtual bool mla_query(const MlaQueryOperands& o, KvStorage& kv, int layer,
                         const AttentionMetadata& meta) {
    (void)o, (void)kv, (void)layer, (void)meta;
    return false;
  }

  // ---- MLA helpers (absorbed attention: arch/mla.h) ----
  // Writes x's columns [begin, end) into out's columns [out_begin, out_begin + end - begin),
  // leaving out's other columns as they are. Rows are over the last dim: x [.., Cx] and
  // out [.., Co] with the same number of rows.
  virtual void copy_columns(const Tensor& x, int64_t begin, int64_t end, const Tensor& out,
                            int64_t out_begin) = 0;
  // A different linear map per head: out[t, h, out_begin + n] = Σ_k x[t, h, x_begin + k] · w[h, n,
  // k]. x [T, heads, Dx]; w [heads, N, K]; out [T, heads, Do]; out's other columns untouched.
  virtual void per_head_linear(const Tensor& x, int64_t x_begin, const Tensor& w, const Tensor& out,
                               int64_t out_begin) = 0;

  // ---- mixture of experts ----
  // Picks each token's experts. router_logits float32 [T, num_experts]; correction_bias float32
  // [num_experts] or an empty Tensor (added to the scores for the choice only, never to the
  // weights); topk_ids int32 [T, top_k]; topk_weights float32 [T, top_k].
  virtual void moe_route(const Tensor& router_logits, const Tensor& correction_bias,
                         const MoeRouteArgs& args, const Tensor& topk_ids,
                         const Tensor& topk_weights) = 0;
  // out[t] = Σ_j topk_weights[t, j] · expert_{topk_ids[t, j]}(x[t]); x, out [T, hidden].
  virtual void moe_experts(const Tensor& x, const MoeExpertWeights& experts, const Tensor& topk_ids,
                           const Tensor& topk_weights, const Tensor& out) = 0;

  // ---- sampling ----
  // One token per row of `logits` [rows, vocab] (a tensor of this backend, float dtype) into host
  // out_ids [rows], by SampleRowParams' rules with params[r] (host [rows]); only the ids leave the
  // device. Ends the backend's step (waits for the work queued before it).
  virtual void sample(const Tensor& logits, const SampleRowParams* params, int32_t* out_ids) = 0;
  // Changes logits [rows, vocab] (a tensor of this backend, float dtype) in place by `edits` (host
  // [num_edits], LogitEdit's rules), before sample(). Cost: one read-modify-write per edit.
  virtual void edit_logits(const Tensor& logits, const LogitEdit* edits, int64_t num_edits) = 0;
  // Per row r of `ref` and `cand` [rows, vocab] (tensors of this backend, float dtypes, one
  // shape; the rows may be views into larger tensors): LogitStatsRow predicting host targets[r],
  // into host out [rows]. Only the statistics leave the device (eval-kv's scale: no
  // full-vocabulary row is copied per position). Ends the backend's step.
  virtual void logit_stats(const Tensor& ref, const Tensor& cand, const int32_t* targets,
                           LogitStatsRow* out) = 0;

  // ---- fallbacks ----
  // The ops this backend runs on the CPU reference through host copies because it has no kernel
  // for them yet (CUDA: backend/cuda/cpu_twin.cc's table), each with its calls so far, zeros
  // included; empty for a backend without such a table. Engine thread only, like the ops.
  virtual std::vector<std::pair<std::string, int64_t>> cpu_fallback_counts() const { return {}; }
};

// The CPU reference backend.
std::unique_ptr<Backend> make_cpu_backend();

#ifdef STRATA_CUDA
// The CUDA backend (backend/cuda/): bf16 weights and activations on the current device.
std::unique_ptr<Backend> make_cuda_backend();
#endif

}  // namespace strata
