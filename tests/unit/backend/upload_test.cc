// Backend::upload of host tensors as a checkpoint stores them (bf16, f16) on the CPU reference:
// the same device tensor as uploading their exact float32 widening, for every target dtype.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "backend/backend.h"

namespace strata {
namespace {

TEST(Upload, StoredDtypesEqualTheirFloat32Widening) {
  auto be = make_cpu_backend();
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  const Shape shape{7, 33};
  std::vector<float> values(size_t(shape_numel(shape)));
  for (float& v : values) v = u(rng);
  for (DType stored : {DType::kBF16, DType::kF16, DType::kF32}) {
    std::vector<uint8_t> bytes(size_t(dtype_bytes_for(stored, shape_numel(shape))));
    from_f32(stored, values.data(), bytes.data(), shape_numel(shape));
    std::vector<float> wide(values.size());
    to_f32(stored, bytes.data(), wide.data(), shape_numel(shape));
    for (DType target : {DType::kF32, DType::kBF16, DType::kF16}) {
      DeviceTensorPtr got = be->upload(Tensor::make(bytes.data(), stored, shape), target);
      DeviceTensorPtr want = be->upload(Tensor::make(wide.data(), DType::kF32, shape), target);
      ASSERT_EQ(got->view().dtype, target);
      ASSERT_EQ(got->view().shape, shape);
      EXPECT_EQ(std::memcmp(got->view().data, want->view().data, size_t(want->view().nbytes())), 0)
          << dtype_name(stored) << " -> " << dtype_name(target);
    }
  }
}

}  // namespace
}  // namespace strata
