// The home of MLA attention on the GPU (absorbed latent attention over the paged latent cache:
// decode and prefill kernels and CudaBackend::mla_attention's host entry), not written yet:
// issue 22. Until then CudaBackend::mla_attention runs on the CPU reference through host copies,
// declared and counted in cpu_twin.cc's table.
