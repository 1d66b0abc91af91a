// The CUDA backend's weight uploads through pinned staging (backend/cuda/weight_upload.h): the
// bytes on the device are exactly what the host gave, for dense bf16 linears (kept as stored, no
// float32 round trip), bf16 tables (Backend::upload of a stored bf16 tensor), float32 tables
// rounded to bf16 (as the host's round-to-nearest-even would), and uploads larger than the
// staging ring (several chunks through both buffers).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_memory.h"

namespace strata::testing {
namespace {

std::vector<uint8_t> device_bytes(const Tensor& t) {
  std::vector<uint8_t> out(size_t(t.nbytes()));
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaMemcpy(out.data(), t.data, out.size(), cudaMemcpyDeviceToHost));
  return out;
}

// Random finite bf16 values (never a NaN: the float32 round trip the old path took changed NaN
// payloads; real weights have none).
HostBytes random_bf16(std::mt19937& rng, int64_t n) {
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  HostBytes b(size_t(n * 2));
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = f32_to_bf16(u(rng));
    std::memcpy(b.data() + i * 2, &h, 2);
  }
  return b;
}

TEST(WeightUpload, DenseBf16LinearIsTheStoredBytes) {
  auto be = make_cuda_backend();
  std::mt19937 rng(3);
  // 8200 x 8192 bf16 = 134 MB: three chunks of the 64 MiB staging ring.
  for (const auto& [out, in] : {std::pair<int64_t, int64_t>{96, 160}, {8200, 8192}}) {
    HostLinearWeight w;
    w.format = LinearFormat{.format = WeightFormat::kDense, .dense_dtype = DType::kBF16};
    w.out = out;
    w.in = in;
    w.values = random_bf16(rng, out * in);
    std::vector<float> bias(size_t(out), 0.25f);
    const LinearWeight lw = be->upload_linear(w, Tensor::make(bias.data(), DType::kF32, {out}));
    EXPECT_EQ(lw.format, w.format);
    ASSERT_EQ(lw.weight->view().dtype, DType::kBF16);
    ASSERT_EQ(lw.weight->view().shape, (Shape{out, in}));
    EXPECT_TRUE(device_bytes(lw.weight->view()) ==
                std::vector<uint8_t>(w.values.begin(), w.values.end()))
        << out << " x " << in;
    ASSERT_NE(lw.bias, nullptr);
    std::vector<uint8_t> want(bias.size() * 4);
    std::memcpy(want.data(), bias.data(), want.size());
    EXPECT_TRUE(device_bytes(lw.bias->view()) == want);
  }
}

TEST(WeightUpload, TablesAsStoredAndFromFloat32) {
  auto be = make_cuda_backend();
  std::mt19937 rng(4);
  const Shape shape{5000, 7168};  // 72 MB as bf16, 143 MB as float32: both cross a chunk
  const int64_t n = shape_numel(shape);
  const HostBytes bf16 = random_bf16(rng, n);
  DeviceTensorPtr t = be->upload(
      Tensor::make(const_cast<uint8_t*>(bf16.data()), DType::kBF16, shape), DType::kBF16);
  EXPECT_TRUE(device_bytes(t->view()) == std::vector<uint8_t>(bf16.begin(), bf16.end()));
  // float32 (not bf16-representable) rounded on the device = the host's rounding.
  std::vector<float> f32(static_cast<size_t>(n));
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  for (float& v : f32) v = u(rng);
  DeviceTensorPtr r = be->upload(Tensor::make(f32.data(), DType::kF32, shape), DType::kBF16);
  std::vector<uint8_t> want(size_t(n * 2));
  from_f32(DType::kBF16, f32.data(), want.data(), n);
  EXPECT_TRUE(device_bytes(r->view()) == want);
  // bf16 as stored into a float32 table: widened exactly.
  DeviceTensorPtr w =
      be->upload(Tensor::make(const_cast<uint8_t*>(bf16.data()), DType::kBF16, shape), DType::kF32);
  std::vector<float> wide(static_cast<size_t>(n));
  to_f32(DType::kBF16, bf16.data(), wide.data(), n);
  std::vector<uint8_t> wide_bytes(wide.size() * 4);
  std::memcpy(wide_bytes.data(), wide.data(), wide_bytes.size());
  EXPECT_TRUE(device_bytes(w->view()) == wide_bytes);
}

// Weights and tables (Lifetime::kResident) take their exact size, rounded to 256 bytes, and go
// back to the driver when freed; transient blocks take a size class and stay cached until trim.
TEST(DevicePool, ResidentBlocksTakeTheirExactSizeTransientOnesASizeClass) {
  auto pool = std::make_shared<cuda::DevicePool>();
  const size_t bytes = (size_t(5) << 20) + 1000;  // its size class is 6 MiB
  const size_t exact = (bytes + 255) / 256 * 256;
  {
    cuda::CudaTensor t(pool, DType::kU8, {int64_t(bytes)}, cuda::Lifetime::kResident);
    EXPECT_EQ(pool->bytes_reserved(), exact);
  }
  EXPECT_EQ(pool->bytes_reserved(), 0u);
  EXPECT_EQ(pool->bytes_cached(), 0u);
  {
    cuda::CudaTensor t(pool, DType::kU8, {int64_t(bytes)});
    EXPECT_EQ(pool->bytes_reserved(), cuda::DevicePool::size_class(bytes));
    EXPECT_EQ(cuda::DevicePool::size_class(bytes), size_t(6) << 20);
  }
  EXPECT_EQ(pool->bytes_cached(), size_t(6) << 20);
  pool->trim();
  EXPECT_EQ(pool->bytes_reserved(), 0u);
  EXPECT_EQ(pool->bytes_cached(), 0u);
}

}  // namespace
}  // namespace strata::testing
