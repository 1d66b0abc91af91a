// NCCL communicator smoke test on one GPU (the lent single-H200 machine): a 1-rank group runs
// every collective on the CUDA backend's stream with the results a group of one must give, the
// environment default for NVLink multicast is applied, and asking the engine for more ranks
// than visible GPUs fails with a clear error instead of clamping. The tp 2/4/8 acceptance
// (logits vs tp 1) needs a multi-GPU machine: see tests/golden/tp for the CPU twin.
#include <gtest/gtest.h>

#ifdef STRATA_HAVE_NCCL
#include <cuda_runtime.h>

#include <cstdlib>

#include "backend/cuda/nccl_comm.h"
#include "dist/tensor_parallel.h"
#include "engine/engine.h"
#include "support/golden.h"

namespace strata::testing {
namespace {

TEST(NcclComm, OneRankCollectives) {
  ASSERT_TRUE(cuda_bind_device(0).ok());
  auto backend = make_cuda_backend();
  auto id = nccl_new_id();
  ASSERT_TRUE(id.ok()) << id.status().to_string();
  EXPECT_NE(std::getenv("NCCL_NVLS_ENABLE"), nullptr);
  auto comm = make_nccl_comm(*id, 0, 1, cuda_backend_stream(*backend));
  ASSERT_TRUE(comm.ok()) << comm.status().to_string();
  Communicator& c = **comm;
  EXPECT_EQ(c.size(), 1);
  // all_reduce over one rank is the identity, in bf16 (the backend's dtype) and f32.
  HostTensor host(DType::kF32, {3, 5});
  for (int i = 0; i < 15; ++i) host.f32()[i] = 0.25f * float(i) - 1.0f;
  for (DType dt : {DType::kBF16, DType::kF32}) {
    auto x = backend->upload(host.view, dt);
    c.all_reduce_sum(*x);
    std::vector<float> back(15);
    backend->download_f32(*x, back.data());
    for (int i = 0; i < 15; ++i) EXPECT_EQ(back[size_t(i)], host.f32()[i]) << dtype_name(dt);
    auto gathered = backend->alloc(dt, {1, 3, 5});
    c.all_gather(*x, *gathered);
    backend->download_f32(*gathered, back.data());
    for (int i = 0; i < 15; ++i) EXPECT_EQ(back[size_t(i)], host.f32()[i]) << dtype_name(dt);
  }
  std::vector<uint8_t> bytes = {1, 2, 3};
  ASSERT_TRUE(c.broadcast_bytes(bytes, 0).ok());
  EXPECT_EQ(bytes, (std::vector<uint8_t>{1, 2, 3}));
  ASSERT_TRUE(c.barrier().ok());
  EXPECT_TRUE(c.status().ok());
  c.abort(unavailable("test abort"));
  EXPECT_FALSE(c.barrier().ok());
}

TEST(NcclComm, MoreRanksThanGpusIsAnError) {
  int gpus = 0;
  ASSERT_EQ(cudaGetDeviceCount(&gpus), cudaSuccess);
  EngineConfig c;
  c.model_path = shared_dir() + "/models/house-llama";
  c.device = Device::kCuda;
  c.tp_size = gpus + 1;
  c.tp_allow_uneven = true;
  auto e = Engine::create(c, &tensor_parallel_runtime());
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("one rank per GPU"), std::string::npos)
      << e.status().to_string();
}

}  // namespace
}  // namespace strata::testing
#endif  // STRATA_HAVE_NCCL
