// The home of mixture-of-experts on the GPU (routing, the router's float32-output linear, the
// grouped expert GEMMs, and CudaBackend::moe_route / moe_experts' host entries), not written yet:
// issue 23. Until then those ops run on the CPU reference through host copies, declared and
// counted in cpu_twin.cc's table.
