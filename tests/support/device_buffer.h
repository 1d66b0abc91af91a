// Raw device buffers for the code that launches kernels directly, the kernel parity tests (the MoE
// kernels' tests/parity/moe_device.h, linear_int4_parity_test.cc) and the kernel benchmarks
// (bench/cuda/moe_bench_common.h, int4_linear_bench.cc): an allocation freed at scope exit, a
// stream, copies to and from host vectors, and bf16 outputs with a poisoned guard after them.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/cuda/launch.h"

namespace strata::testing {

inline constexpr int64_t kGuard = 256;  // poisoned bf16 values after every output

class Dev {  // a device allocation, freed at scope exit
 public:
  explicit Dev(size_t bytes) : bytes_(bytes) { CUDA_CHECK(cudaMalloc(&p_, bytes ? bytes : 16)); }
  ~Dev() { cudaFree(p_); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_;
};

class Stream {
 public:
  Stream() { CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(s_); }
  cudaStream_t get() const { return s_; }
  void sync() const { CUDA_CHECK(cudaStreamSynchronize(s_)); }

 private:
  cudaStream_t s_;
};

template <class T>
std::unique_ptr<Dev> upload(const std::vector<T>& v, const Stream& s) {
  auto d = std::make_unique<Dev>(v.size() * sizeof(T));
  CUDA_CHECK(cudaMemcpyAsync(d->template as<void>(), v.data(), v.size() * sizeof(T),
                             cudaMemcpyHostToDevice, s.get()));
  s.sync();
  return d;
}
// `count` T's from device memory, once the stream's work is done.
template <class T>
std::vector<T> download(const void* d, size_t count, const Stream& s) {
  std::vector<T> v(count);
  s.sync();
  CUDA_CHECK(cudaMemcpyAsync(v.data(), d, count * sizeof(T), cudaMemcpyDeviceToHost, s.get()));
  s.sync();
  return v;
}
template <class T>
std::vector<T> download(const Dev& d, size_t count, const Stream& s) {
  return download<T>(d.as<void>(), count, s);
}

// An output buffer of `count` bf16 values plus the guard, poisoned (0xff bytes: bf16 NaN).
inline std::unique_ptr<Dev> poisoned_output(int64_t count, const Stream& s) {
  auto d = std::make_unique<Dev>(size_t(count + kGuard) * 2);
  CUDA_CHECK(cudaMemsetAsync(d->as<void>(), 0xff, d->bytes(), s.get()));
  return d;
}
// The output's `count` bf16 values; *guard_ok: the kGuard values after them still hold the
// poison (nothing was written past the output).
inline std::vector<uint16_t> read_output(const Dev& d, int64_t count, const Stream& s,
                                         bool* guard_ok) {
  auto all = download<uint16_t>(d, size_t(count + kGuard), s);
  *guard_ok = true;
  for (int64_t i = count; i < count + kGuard; ++i) *guard_ok &= all[size_t(i)] == 0xffff;
  all.resize(size_t(count));
  return all;
}

}  // namespace strata::testing
