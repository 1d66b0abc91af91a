// The CPU twin: the ops the CUDA backend does not run on the GPU yet, and the shapes its MoE
// kernels refuse (moe.cu), declared in one table and run on the CPU reference backend through
// host copies: each downloads its inputs, runs the CPU op and uploads the result, ending the
// current step (so it never runs inside a CUDA graph).
// Correct but slow: every call is counted (CudaBackend::cpu_fallback_counts, exported as
// strata_cpu_fallback_ops_total and in the engine's exit line) and the first one of each op is
// logged as a warning. This is the one file of the CUDA backend that uses backend/cpu/.
#include <string_view>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/log.h"

namespace strata::cuda {

// An op leaves this table when its GPU version lands in its home file; one whose GPU version
// covers only some shapes keeps its row, counting the calls of the others.
constexpr CpuTwinOp kCpuTwinOps[] = {
    {"mla_attention",
     "the MLA kernels are built for (kv_lora_rank, rope dims) (512, 64), (128, 32) and (32, 8) "
     "over aligned rows, not this layer's (home: mla.cu)"},
    // The MoE ops run on the GPU (moe.cu); these rows count only the shapes its kernels refuse,
    // so that strata_cpu_fallback_ops_total shows them (0 on every supported MoE model).
    {"moe_route", "a routing shape the GPU kernel refuses (moe.cu says which)"},
    {"moe_experts", "an expert shape or layout the GPU kernels refuse (moe.cu says which)"},
    {"linear_f32_out", "a float32-output linear (router) the GPU path refuses (moe.cu says which)"},
    {"sample_f32_logits",
     "sampling (not greedy) of float32 logits, which this backend's models never produce: the "
     "reference on the host"},
};
constexpr int kNumCpuTwinOps = int(sizeof kCpuTwinOps / sizeof kCpuTwinOps[0]);

namespace {

// The table index of an op, checked at compile time.
consteval int twin_index(std::string_view name) {
  for (int i = 0; i < kNumCpuTwinOps; ++i)
    if (name == kCpuTwinOps[i].name) return i;
  throw "not an op of kCpuTwinOps";
}

// A float32 (or int32, for I32 tensors) host copy of a device tensor.
HostTensor to_host(Backend& be, const Tensor& t) {
  if (t.dtype == DType::kI32) {
    HostTensor h(DType::kI32, t.shape);
    CUDA_CHECK(cudaMemcpy(h.view.data, t.data, size_t(t.nbytes()), cudaMemcpyDeviceToHost));
    return h;
  }
  HostTensor h(DType::kF32, t.shape);
  be.download_f32(t, h.f32());
  return h;
}

// Writes a float32 / int32 host tensor into an existing device tensor of any supported dtype.
void to_device(const HostTensor& h, const Tensor& dst) {
  CHECK_EQ(h.numel(), dst.numel());
  if (dst.dtype == DType::kI32 || dst.dtype == DType::kF32) {
    CHECK(h.view.dtype == dst.dtype);
    CUDA_CHECK(cudaMemcpy(dst.data, h.view.data, size_t(dst.nbytes()), cudaMemcpyHostToDevice));
    return;
  }
  std::vector<char> bytes(size_t(dst.nbytes()));
  from_f32(dst.dtype, h.f32(), bytes.data(), h.numel());
  CUDA_CHECK(cudaMemcpy(dst.data, bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
}

}  // namespace

void CudaBackend::count_cpu_twin(int i, const char* why) {
  if (cpu_twin_calls_[size_t(i)]++ == 0)
    LOG_WARN("CUDA backend: {} runs on the CPU reference through host copies, slowly: {}{}{}",
             kCpuTwinOps[i].name, kCpuTwinOps[i].reason, why ? ": " : "", why ? why : "");
}

std::vector<std::pair<std::string, int64_t>> CudaBackend::cpu_fallback_counts() const {
  std::vector<std::pair<std::string, int64_t>> out;
  for (int i = 0; i < kNumCpuTwinOps; ++i)
    out.emplace_back(kCpuTwinOps[i].name, cpu_twin_calls_[size_t(i)]);
  return out;
}

void CudaBackend::mla_attention_cpu_twin(const Tensor& q_latent, const KvStorage& kv, int layer,
                                         const AttentionMetadata& meta, const MlaArgs& args,
                                         const Tensor& out) {
  count_cpu_twin(twin_index("mla_attention"));
  end_step();
  cpu::CpuBackend cpu;
  HostTensor q = to_host(*this, q_latent);
  HostTensor o(DType::kF32, out.shape);
  cpu::CpuKvStorage host_kv(kv.layout());
  host_kv.set_scales(layer, kv.k_scale(layer), kv.v_scale(layer));
  const Tensor dk = kv.k(layer), hk = host_kv.k(layer);
  CUDA_CHECK(cudaMemcpy(hk.data, dk.data, size_t(dk.nbytes()), cudaMemcpyDeviceToHost));
  cpu.mla_attention(q.view, host_kv, layer, meta, args, o.view);
  to_device(o, out);
}

void CudaBackend::mla_attention_partial_cpu_twin(const Tensor& q_latent, const KvStorage& kv,
                                                 int layer, const AttentionMetadata& meta,
                                                 const MlaArgs& args, DcpShard shard,
                                                 const Tensor& out) {
  count_cpu_twin(twin_index("mla_attention"));
  end_step();
  cpu::CpuBackend cpu;
  HostTensor q = to_host(*this, q_latent);
  HostTensor o(DType::kF32, out.shape);
  cpu::CpuKvStorage host_kv(kv.layout());
  host_kv.set_scales(layer, kv.k_scale(layer), kv.v_scale(layer));
  const Tensor dk = kv.k(layer), hk = host_kv.k(layer);
  CUDA_CHECK(cudaMemcpy(hk.data, dk.data, size_t(dk.nbytes()), cudaMemcpyDeviceToHost));
  cpu.mla_attention_partial(q.view, host_kv, layer, meta, args, shard, o.view);
  to_device(o, out);
}

void CudaBackend::moe_route_twin(const Tensor& router_logits, const Tensor& correction_bias,
                                 const MoeRouteArgs& args, const Tensor& topk_ids,
                                 const Tensor& topk_weights, const char* why) {
  count_cpu_twin(twin_index("moe_route"), why);
  end_step();
  cpu::CpuBackend cpu;
  HostTensor logits = to_host(*this, router_logits);
  HostTensor bias;
  if (!correction_bias.empty()) bias = to_host(*this, correction_bias);
  HostTensor ids(DType::kI32, topk_ids.shape), weights(DType::kF32, topk_weights.shape);
  cpu.moe_route(logits.view, bias.view, args, ids.view, weights.view);
  to_device(ids, topk_ids);
  to_device(weights, topk_weights);
}

void CudaBackend::moe_experts_twin(const Tensor& x, const MoeExpertWeights& experts,
                                   const Tensor& topk_ids, const Tensor& topk_weights,
                                   const Tensor& out, const char* why) {
  count_cpu_twin(twin_index("moe_experts"), why);
  end_step();
  cpu::CpuBackend cpu;
  HostTensor hx = to_host(*this, x), ids = to_host(*this, topk_ids);
  HostTensor w = to_host(*this, topk_weights);
  // Host float32 copies of the expert weights, wrapped as CPU "device" tensors.
  MoeExpertWeights host_experts;
  // Experts are dequantized (INT4, FP8 blocks) or untiled (moe_weights.h) on the device first:
  // the same bf16 values the CPU reference dequantizes to.
  for (auto [src, dst] : {std::pair{&experts.gate_up, &host_experts.gate_up},
                          std::pair{&experts.down, &host_experts.down}}) {
    DeviceTensorPtr dense = dequantize_bf16(*src);
    dst->weight = cpu.alloc(DType::kF32, dense->view().shape);
    dst->stack = src->stack;
    download_f32(dense->view(), dst->weight->view().ptr<float>());
  }
  HostTensor o(DType::kF32, out.shape);
  cpu.moe_experts(hx.view, host_experts, ids.view, w.view, o.view);
  to_device(o, out);
}

void CudaBackend::linear_f32_out_twin(const Tensor& x, const LinearWeight& w, const Tensor& out,
                                      const char* why) {
  count_cpu_twin(twin_index("linear_f32_out"), why);
  end_step();
  cpu::CpuBackend cpu;
  HostTensor hx = to_host(*this, x);
  LinearWeight host_w;
  DeviceTensorPtr dense = dequantize_bf16(w);  // a packed weight's values, as the reference's
  host_w.weight = cpu.alloc(DType::kF32, {w.out_features(), w.in_features()});
  CHECK_EQ(w.stack, 1);
  download_f32(dense->view(), host_w.weight->view().ptr<float>());
  if (w.bias) {
    host_w.bias = cpu.alloc(DType::kF32, w.bias->view().shape);
    download_f32(w.bias->view(), host_w.bias->view().ptr<float>());
  }
  HostTensor o(DType::kF32, out.shape);
  cpu.linear(hx.view, host_w, o.view);
  to_device(o, out);
}

void CudaBackend::sample_f32_logits(const Tensor& logits, const SampleRowParams* params,
                                    int32_t* out_ids) {
  count_cpu_twin(twin_index("sample_f32_logits"));
  const int64_t rows = logits.dim(0), vocab = logits.dim(-1);
  std::vector<float> host(size_t(rows * vocab));
  download_f32(logits, host.data());
  std::vector<std::pair<float, int32_t>> scratch;
  for (int64_t r = 0; r < rows; ++r)
    out_ids[r] = sample_row_reference(host.data() + r * vocab, vocab, params[r], scratch);
}

}  // namespace strata::cuda
