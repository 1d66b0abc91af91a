// A backend that counts the bytes of the weights a model loads onto it: every upload (norms,
// embeddings, absorbed MLA matrices, router biases) and every upload_linear (what the backend
// kept: values, scales, bias), each counted once. Tests compare the total with the planner's
// figure (model/inventory.h device_bytes), which must be the same number.
#pragma once

#include <cstdint>

#include "backend/backend.h"

namespace strata::testing {

template <typename Base>
class CountingBackend : public Base {
 public:
  DeviceTensorPtr upload(const Tensor& host, DType dtype) override {
    DeviceTensorPtr t = Base::upload(host, dtype);
    if (!in_linear_) bytes_ += t->view().nbytes();
    return t;
  }
  LinearWeight upload_linear(const HostLinearWeight& w, const Tensor& bias_f32) override {
    in_linear_ = true;
    LinearWeight lw = Base::upload_linear(w, bias_f32);
    in_linear_ = false;
    for (const DeviceTensorPtr* t : {&lw.weight, &lw.scales, &lw.bias})
      if (*t) bytes_ += (*t)->view().nbytes();
    return lw;
  }
  int64_t weight_bytes() const { return bytes_; }

 private:
  int64_t bytes_ = 0;
  bool in_linear_ = false;
};

}  // namespace strata::testing
