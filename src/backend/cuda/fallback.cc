// Ops the CUDA backend does not run on the GPU yet (absorbed MLA attention, MoE routing and
// experts, the router's float32-output linear): correct but slow. Each downloads its inputs, runs the CPU reference twin and uploads
// the result, ending the current step (so they never run inside a CUDA graph). The GPU versions
// belong to the DeepSeek/Kimi work, not to the Llama family.
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/log.h"

namespace strata::cuda {
namespace {

void warn_once(int i, const char* op) {
  static bool warned[4] = {false, false, false, false};
  if (!warned[i]) {
    LOG_WARN("CUDA backend: {} runs on the CPU reference (host copies); slow", op);
    warned[i] = true;
  }
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

void CudaBackend::mla_attention(const Tensor& q_latent, const KvStorage& kv, int layer,
                                const AttentionMetadata& meta, const MlaArgs& args,
                                const Tensor& out) {
  warn_once(0, "mla_attention");
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

void CudaBackend::moe_route(const Tensor& router_logits, const Tensor& correction_bias,
                            const MoeRouteArgs& args, const Tensor& topk_ids,
                            const Tensor& topk_weights) {
  warn_once(1, "moe_route");
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

void CudaBackend::moe_experts(const Tensor& x, const MoeExpertWeights& experts,
                              const Tensor& topk_ids, const Tensor& topk_weights,
                              const Tensor& out) {
  warn_once(2, "moe_experts");
  end_step();
  cpu::CpuBackend cpu;
  HostTensor hx = to_host(*this, x), ids = to_host(*this, topk_ids);
  HostTensor w = to_host(*this, topk_weights);
  // Host float32 copies of the expert weights, wrapped as CPU "device" tensors.
  MoeExpertWeights host_experts;
  CHECK_MSG(experts.gate_up.is_dense() && experts.down.is_dense(),
            "moe_experts on the CPU twin: packed expert weights cannot be downloaded");
  host_experts.gate_up.weight = cpu.alloc(DType::kF32, experts.gate_up.weight->view().shape);
  host_experts.down.weight = cpu.alloc(DType::kF32, experts.down.weight->view().shape);
  host_experts.gate_up.stack = experts.gate_up.stack;
  host_experts.down.stack = experts.down.stack;
  download_f32(experts.gate_up.weight->view(), host_experts.gate_up.weight->view().ptr<float>());
  download_f32(experts.down.weight->view(), host_experts.down.weight->view().ptr<float>());
  HostTensor o(DType::kF32, out.shape);
  cpu.moe_experts(hx.view, host_experts, ids.view, w.view, o.view);
  to_device(o, out);
}

void CudaBackend::linear_f32_out(const Tensor& x, const LinearWeight& w, const Tensor& out) {
  warn_once(3, "linear with a float32 output");
  end_step();
  cpu::CpuBackend cpu;
  HostTensor hx = to_host(*this, x);
  LinearWeight host_w;
  host_w.weight = cpu.alloc(DType::kF32, w.weight->view().shape);
  download_f32(w.weight->view(), host_w.weight->view().ptr<float>());
  if (w.bias) {
    host_w.bias = cpu.alloc(DType::kF32, w.bias->view().shape);
    download_f32(w.bias->view(), host_w.bias->view().ptr<float>());
  }
  HostTensor o(DType::kF32, out.shape);
  cpu.linear(hx.view, host_w, o.view);
  to_device(o, out);
}

}  // namespace strata::cuda
