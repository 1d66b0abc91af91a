// Eight-lane float vectors for the CPU reference kernels (GCC/Clang vector extensions: AVX2 where
// the function is compiled for it, two SSE registers otherwise), and the one fixed reduction tree
// every dot product of the CPU backend uses.
//
// Why fixed: the engine's batch-invariance guarantee needs each output element to be summed in an
// order that depends only on K. A lane-wise multiply-add over 8 lanes followed by this tree is
// that order, whatever kernel (tile shape, clone, thread) computes it. Keep every kernel on it.
#pragma once

#include <cstdint>
#include <cstring>

// Kernels pass 32-byte vectors by value only between always-inlined functions, so the AVX/non-AVX
// calling-convention difference GCC warns about (-Wpsabi) never reaches an ABI. Left off for the
// files that include this header (the warning fires where the helpers are inlined).
#pragma GCC diagnostic ignored "-Wpsabi"

// The AVX2 + default clones of a hot kernel. A clone is picked by an ifunc resolver that the
// dynamic loader runs before any runtime is initialised; ThreadSanitizer instruments the resolver,
// which then crashes at load time, so TSan builds keep only the default clone.
#if defined(__SANITIZE_THREAD__)
#define STRATA_CPU_CLONES
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define STRATA_CPU_CLONES
#endif
#endif
#ifndef STRATA_CPU_CLONES
#define STRATA_CPU_CLONES __attribute__((target_clones("avx2", "default")))
#endif

namespace strata::cpu {

typedef float V8 __attribute__((vector_size(32)));
constexpr int kLanes = 8;

__attribute__((always_inline)) inline V8 load8(const float* p) {
  V8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

__attribute__((always_inline)) inline void store8(float* p, V8 v) { std::memcpy(p, &v, sizeof(v)); }

// ((a0+a1)+(a2+a3)) + ((a4+a5)+(a6+a7)): the reduction of the lane partial sums.
__attribute__((always_inline)) inline float reduce8(V8 a) {
  return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

// Σ a[i]·b[i] in the fixed order: lane partial sums over whole groups of 8, the tree, then a
// sequential tail.
__attribute__((always_inline)) inline float dot8(const float* a, const float* b, int64_t k) {
  V8 acc = {};
  int64_t i = 0;
  for (; i + kLanes <= k; i += kLanes) acc += load8(a + i) * load8(b + i);
  float tail = 0;
  for (; i < k; ++i) tail += a[i] * b[i];
  return reduce8(acc) + tail;
}

}  // namespace strata::cpu
