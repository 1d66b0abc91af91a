// Sampling on the GPU (backend.h SampleRowParams; the reference is backend/cpu/sampling.cc): one
// block per row of logits, only the token id leaves the device.
//
// Greedy rows: one pass, (value, id) max with ties to the lowest id, NaN skipped, and element 0
// wins when it is NaN (std::max_element's result).
//
// Sampling rows (bf16 logits) need the order the reference sorts into, (value descending, id
// ascending), without sorting: a bf16 value has 65,536 possible bit patterns, so a count per
// value (a histogram over the order-preserving 16-bit key, in global memory, one row's 256 KB
// per block) gives that order group by group: a group is every id with one value, each of the
// same weight w = float(exp(double(v - max) / temperature)) computed as the reference does. One
// scan over the 65,536 groups (64 per thread, descending) then finds the top-k cut (a count
// crossing), the total, the min-p cut (w < min_p, a suffix), the top-p cut and the inverse-CDF
// draw (weight crossings). Inside the group a crossing falls in, the reference's sequential
// sums are replayed from the group's start (so they are exact where the sum before the group
// is: always for the top group); the sums of the groups before come from a block scan in a
// different order than the reference's, so a draw or top-p cut within rounding of a boundary
// (relative ~1e-16 per term; u = 1 - 2^-53 at the very end of the sum) can differ
// (tests/parity/sampling_parity_test.cc measures it). Last, one ordered pass finds the j-th
// lowest id of the chosen value. Cost at 1,000 rows x 128,256 on the H200: greedy 0.12 ms,
// sampled 3.5 ms (the histogram's atomics on flat rows).
#include <cfloat>
#include <cstddef>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/sampling.h"

namespace strata::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kBins = 65536;
constexpr int kBinsPerThread = kBins / kThreads;  // 64, thread t owns keys 65535 - 64t down
constexpr int kMaxReplay = 1 << 17;               // longer tie groups use the closed form instead

static_assert(sizeof(SampleRowDev) == 24, "SampleRowDev must match SampleRowParams");

// The order-preserving key of a bf16 value (as float): NaN sorts as -inf and -0 as +0, as the
// reference compares them.
__device__ __forceinline__ uint32_t key_of(float v) {
  if (isnan(v)) v = -INFINITY;
  if (v == 0.0f) v = 0.0f;
  const uint32_t b = __float_as_uint(v) >> 16;
  return (b & 0x8000u) ? (~b & 0xffffu) : (b | 0x8000u);
}
__device__ __forceinline__ float value_of(uint32_t key) {
  const uint32_t b = (key & 0x8000u) ? (key & 0x7fffu) : (~key & 0xffffu);
  return __uint_as_float(b << 16);
}

// Block-wide exclusive scan of one value per thread; `total` gets the sum. Every thread calls.
template <typename T>
__device__ T block_exclusive_scan(T v, T* shared, T* total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  T incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const T up = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += up;
  }
  if (lane == 31) shared[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    T w = lane < kWarps ? shared[lane] : T(0);
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const T up = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += up;
    }
    if (lane < kWarps) shared[lane] = w;  // inclusive per warp
  }
  __syncthreads();
  const T before = (warp > 0 ? shared[warp - 1] : T(0)) + incl - v;
  *total = shared[kWarps - 1];
  __syncthreads();  // shared is reused by the next scan
  return before;
}

struct Best {
  float v;
  int32_t id;  // -1: nothing but NaN seen
};
__device__ __forceinline__ Best better(Best a, Best b) {
  if (a.id < 0) return b;
  if (b.id < 0) return a;
  return (b.v > a.v || (b.v == a.v && b.id < a.id)) ? b : a;
}
__device__ __forceinline__ void take(Best& best, float v, int32_t id) {
  if (!isnan(v) && (best.id < 0 || v > best.v)) best = {v, id};  // ids rise within a thread
}

template <bool kF32>
__device__ __forceinline__ float load(const void* row, int64_t i) {
  if constexpr (kF32) return static_cast<const float*>(row)[i];
  return bf16_to_float(static_cast<const bf16_bits*>(row)[i]);
}

// (max over non-NaN values, lowest id of it) of one row, broadcast to every thread.
template <bool kF32>
__device__ Best row_max(const void* row, int64_t vocab, bool vec, Best* shared) {
  Best best{-INFINITY, -1};
  constexpr int kPer = kF32 ? 4 : 8;  // elements per 16-byte load
  int64_t done = 0;
  if (vec) {
    const uint4* v4 = static_cast<const uint4*>(row);
    const int64_t n4 = vocab / kPer;
    for (int64_t i = threadIdx.x; i < n4; i += kThreads) {
      const uint4 u = v4[i];
      float f[8];
      if constexpr (kF32) {
        f[0] = __uint_as_float(u.x), f[1] = __uint_as_float(u.y);
        f[2] = __uint_as_float(u.z), f[3] = __uint_as_float(u.w);
      } else {
        unpack8(u, f);
      }
#pragma unroll
      for (int e = 0; e < kPer; ++e) take(best, f[e], int32_t(i * kPer + e));
    }
    done = n4 * kPer;
  }
  for (int64_t i = done + threadIdx.x; i < vocab; i += kThreads)
    take(best, load<kF32>(row, i), int32_t(i));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    Best other{__shfl_xor_sync(0xffffffffu, best.v, o), __shfl_xor_sync(0xffffffffu, best.id, o)};
    best = better(best, other);
  }
  if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = best;
  __syncthreads();
  Best all{-INFINITY, -1};
  for (int w = 0; w < kWarps; ++w) all = better(all, shared[w]);
  __syncthreads();
  return all;
}

// The reference's weight of value v under max m.
__device__ __forceinline__ float weight_of(float v, float m, float temperature) {
  return __double2float_rn(exp(double(__fsub_rn(v, m)) / double(temperature)));
}

struct Shared {
  Best best[kWarps];
  int64_t scan_i[kWarps];
  double scan_d[kWarps];
  int winner;         // lowest thread that found a crossing
  uint32_t key;       // its group
  int64_t j;          // 1-based rank inside the group
  double kept;        // top-p: the kept mass
  uint32_t last_key;  // lowest key still kept (the reference's fallback: its last element)
  int32_t token;
};

// The j-th (1-based) lowest id whose key is `key`.
__device__ int32_t nth_id_with_key(const bf16_bits* row, int64_t vocab, uint32_t key, int64_t j,
                                   Shared& sh) {
  constexpr int kPer = 8;
  int64_t seen = 0;
  if (threadIdx.x == 0) sh.token = 0;
  for (int64_t base = 0; base < vocab; base += int64_t(kThreads) * kPer) {
    const int64_t first = base + int64_t(threadIdx.x) * kPer;
    int64_t mine = 0;
    for (int e = 0; e < kPer; ++e)
      if (first + e < vocab && key_of(bf16_to_float(row[first + e])) == key) ++mine;
    int64_t tile_total = 0;
    const int64_t before = block_exclusive_scan<int64_t>(mine, sh.scan_i, &tile_total);
    if (seen + before < j && j <= seen + before + mine) {
      int64_t c = seen + before;
      for (int e = 0; e < kPer; ++e)
        if (first + e < vocab && key_of(bf16_to_float(row[first + e])) == key && ++c == j)
          sh.token = int32_t(first + e);
    }
    seen += tile_total;
    if (seen >= j) break;  // the same on every thread
  }
  __syncthreads();
  return sh.token;
}

// kSampling false: every row is greedy (a lighter kernel, two blocks per SM).
template <bool kF32, bool kSampling>
__global__ void __launch_bounds__(kThreads) sample_kernel(SampleParams p) {
  __shared__ Shared sh;
  const int row = blockIdx.x;
  const SampleRowDev prm = p.params[row];
  const void* x = static_cast<const char*>(p.logits) + int64_t(row) * p.vocab * (kF32 ? 4 : 2);
  const Best best = row_max<kF32>(x, p.vocab, p.vec != 0, sh.best);
  const float first = load<kF32>(x, 0);
  const int32_t greedy = isnan(first) || best.id < 0 ? 0 : best.id;
  const bool is_greedy = prm.temperature <= 0.0f || prm.top_k == 1;
  if (is_greedy || isinf(best.v) || best.id < 0) {
    if (threadIdx.x == 0) p.out[row] = greedy;
    return;
  }
  if constexpr (!kF32 && kSampling) {
    const bf16_bits* xb = static_cast<const bf16_bits*>(x);
    const float m = best.v;
    uint32_t* hist = p.hist + int64_t(row) * kBins;
    uint4* h4 = reinterpret_cast<uint4*>(hist);
    for (int i = threadIdx.x; i < kBins / 4; i += kThreads) h4[i] = make_uint4(0, 0, 0, 0);
    __threadfence();  // the zeros reach L2, where the atomics below run
    __syncthreads();
    for (int64_t i = threadIdx.x; i < p.vocab; i += kThreads)
      atomicAdd(&hist[key_of(bf16_to_float(xb[i]))], 1u);
    __syncthreads();
    const uint32_t hi = uint32_t(kBins - 1 - threadIdx.x * kBinsPerThread);  // my first key
    auto count = [&](int b) { return int64_t(__ldcg(&hist[hi - b])); };

    // Top-k: the key of the k-th candidate and how many of its ids are kept.
    const int64_t k = (prm.top_k > 0 && prm.top_k < p.vocab) ? prm.top_k : p.vocab;
    int64_t mine = 0;
    for (int b = 0; b < kBinsPerThread; ++b) mine += count(b);
    int64_t n_all = 0;
    int64_t cum = block_exclusive_scan<int64_t>(mine, sh.scan_i, &n_all);
    if (threadIdx.x == 0) sh.key = 0, sh.j = 0;
    __syncthreads();
    if (cum < k && k <= cum + mine) {
      for (int b = 0; b < kBinsPerThread; ++b) {
        const int64_t c = count(b);
        if (cum < k && k <= cum + c) sh.key = hi - b, sh.j = k - cum;
        cum += c;
      }
    }
    __syncthreads();
    const uint32_t k_key = sh.key;
    const int64_t k_ties = sh.j;
    __syncthreads();
    // Candidates of group `key` (c of them in the row) after the top-k cut.
    auto topk_count = [&](uint32_t key, int64_t c) {
      return key > k_key ? c : key == k_key ? k_ties : int64_t(0);
    };

    // Weights: the total over the top-k candidates (the reference's `total`), and the mass
    // that min-p keeps (w >= min_p; the reference's floor is 1 · min_p, the top weight being 1).
    double my_w = 0, my_minp = 0;
    uint32_t my_last = 0xffffffffu;
    for (int b = 0; b < kBinsPerThread; ++b) {
      const int64_t c = topk_count(hi - b, count(b));
      if (c == 0) continue;
      const float w = weight_of(value_of(hi - b), m, prm.temperature);
      my_w += double(c) * double(w);
      if (!(prm.min_p > 0.0f && w < prm.min_p)) my_minp += double(c) * double(w), my_last = hi - b;
    }
    double total = 0, minp_total = 0;
    const double w_before = block_exclusive_scan<double>(my_w, sh.scan_d, &total);
    block_exclusive_scan<double>(my_minp, sh.scan_d, &minp_total);
    if (threadIdx.x == 0) sh.last_key = 0xffffffffu;
    __syncthreads();
    if (my_last != 0xffffffffu) atomicMin(&sh.last_key, my_last);
    __syncthreads();

    // Top-p: the first candidate (in order) at which the running mass reaches top_p.
    uint32_t p_key = sh.last_key;  // the lowest kept key (all of its top-k ids kept)
    int64_t p_ties = -1;           // -1: all of them
    double kept = minp_total;
    if (p_key == 0xffffffffu) {
      // min_p >= 1 keeps nothing; the reference keeps its first candidate.
      p_key = key_of(m), p_ties = 1, kept = 1.0;
    } else if (prm.top_p < 1.0f) {
      if (threadIdx.x == 0) sh.winner = kThreads;
      __syncthreads();
      double acc = w_before;
      bool found = false;
      uint32_t my_key = 0;
      int64_t my_j = 0;
      double my_kept = 0;
      for (int b = 0; b < kBinsPerThread && !found; ++b) {
        const uint32_t key = hi - b;
        const int64_t c = topk_count(key, count(b));
        if (c == 0) continue;
        const float w = weight_of(value_of(key), m, prm.temperature);
        if (prm.min_p > 0.0f && w < prm.min_p) break;  // min-p ends the candidates
        if ((acc + double(c) * double(w)) / total >= double(prm.top_p) * (1 - 1e-9)) {
          // Replay the reference's running mass through the group.
          const double q = double(w) / total;
          double mass = acc / total;
          int64_t j = 1;
          if (c <= kMaxReplay) {
            for (; j <= c; ++j) {
              mass += q;
              if (mass >= double(prm.top_p)) break;
            }
          } else {
            j = int64_t(ceil((double(prm.top_p) - mass) / q));
            j = j < 1 ? 1 : j;
          }
          if (j <= c) found = true, my_key = key, my_j = j, my_kept = acc + double(j) * double(w);
        }
        if (!found) acc += double(c) * double(w);
      }
      if (found) atomicMin(&sh.winner, int(threadIdx.x));
      __syncthreads();
      if (found && sh.winner == int(threadIdx.x)) sh.key = my_key, sh.j = my_j, sh.kept = my_kept;
      __syncthreads();
      if (sh.winner < kThreads) p_key = sh.key, p_ties = sh.j, kept = sh.kept;
      __syncthreads();
    }
    // The kept candidates of group `key`.
    auto kept_count = [&](uint32_t key, int64_t c) {
      c = topk_count(key, c);
      if (key < p_key) return int64_t(0);
      return key == p_key && p_ties >= 0 ? (p_ties < c ? p_ties : c) : c;
    };

    // The draw: the first kept candidate at which the running mass exceeds uniform · kept.
    const double r = prm.uniform * kept;
    if (threadIdx.x == 0) sh.winner = kThreads;
    __syncthreads();
    {
      double acc = w_before;
      uint32_t my_key = 0;
      int64_t my_j = 0;
      bool found = false;
      for (int b = 0; b < kBinsPerThread && !found; ++b) {
        const uint32_t key = hi - b;
        const int64_t c = kept_count(key, count(b));
        if (c == 0) continue;
        const float w = weight_of(value_of(key), m, prm.temperature);
        if (acc + double(c) * double(w) > r * (1 - 1e-9)) {
          // Replay the reference's subtractions through the group.
          int64_t j = 1;
          if (c <= kMaxReplay) {
            double rr = r - acc;
            for (; j <= c; ++j) {
              rr -= double(w);
              if (rr < 0) break;
            }
          } else {
            j = int64_t(floor((r - acc) / double(w))) + 1;
            j = j < 1 ? 1 : j;
          }
          found = j <= c;
          if (found) my_key = key, my_j = j;
        }
        if (!found) acc += double(c) * double(w);
      }
      if (found) atomicMin(&sh.winner, int(threadIdx.x));
      __syncthreads();
      if (found && sh.winner == int(threadIdx.x)) sh.key = my_key, sh.j = my_j;
      __syncthreads();
      if (sh.winner == kThreads && threadIdx.x == 0) {
        // No crossing (rounding at the very end): the reference's last kept candidate.
        const uint32_t key = p_key;
        sh.key = key;
        sh.j = kept_count(key, int64_t(__ldcg(&hist[key])));
      }
      __syncthreads();
    }
    const int32_t token = nth_id_with_key(xb, p.vocab, sh.key, sh.j, sh);
    if (threadIdx.x == 0) p.out[row] = token;
  }
}

// backend.h's LogitEdit rule with each step rounded on its own (no contraction into an FMA), as
// the reference (backend/cpu/sampling.cc edit_logit_reference) computes it.
__global__ void edit_logits_kernel(EditLogitsParams p) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.num_edits) return;
  const LogitEditDev e = p.edits[i];
  const int64_t at = int64_t(e.row) * p.vocab + e.token;
  float x = p.f32 ? static_cast<const float*>(p.logits)[at]
                  : bf16_to_float(static_cast<const bf16_bits*>(p.logits)[at]);
  x = __fsub_rn(x, e.subtract);
  x = x < 0.0f ? __fmul_rn(x, e.scale) : __fdiv_rn(x, e.scale);
  x = __fadd_rn(x, e.bias);
  if (p.f32) {
    static_cast<float*>(p.logits)[at] = x;
  } else {
    static_cast<bf16_bits*>(p.logits)[at] = float_to_bf16(x);
  }
}

}  // namespace

void launch_edit_logits(const EditLogitsParams& p, const Launch& launch) {
  if (p.num_edits == 0) return;
  constexpr int kEditThreads = 256;
  const int64_t blocks = (p.num_edits + kEditThreads - 1) / kEditThreads;
  edit_logits_kernel<<<unsigned(blocks), kEditThreads, 0, launch.stream>>>(p);
  CUDA_LAUNCH_CHECK();
}

void launch_sample(const SampleParams& p, const Launch& launch) {
  if (p.rows == 0) return;
  if (p.f32) {
    CHECK_MSG(!p.any_sampling, "GPU sampling of float32 logits is not implemented (greedy only)");
    sample_kernel<true, false><<<p.rows, kThreads, 0, launch.stream>>>(p);
  } else if (p.any_sampling) {
    sample_kernel<false, true><<<p.rows, kThreads, 0, launch.stream>>>(p);
  } else {
    sample_kernel<false, false><<<p.rows, kThreads, 0, launch.stream>>>(p);
  }
  CUDA_LAUNCH_CHECK();
}

// ---- host entries ----
void CudaBackend::sample(const Tensor& logits, const SampleRowParams* params, int32_t* out_ids) {
  static_assert(sizeof(SampleRowDev) == sizeof(SampleRowParams) &&
                offsetof(SampleRowParams, uniform) == offsetof(SampleRowDev, uniform) &&
                offsetof(SampleRowParams, min_p) == offsetof(SampleRowDev, min_p));
  CHECK(logits.is_contiguous());
  CHECK_MSG(logits.dtype == DType::kBF16 || logits.dtype == DType::kF32,
            "sample: logits must be bf16 or f32, got {}", dtype_name(logits.dtype));
  const int64_t rows = logits.numel() == 0 ? 0 : logits.dim(0), vocab = logits.dim(-1);
  if (rows == 0) return;
  CHECK_MSG(vocab < (int64_t(1) << 31), "sample: vocab {} too large", vocab);
  bool any_sampling = false;
  for (int64_t r = 0; r < rows; ++r) any_sampling |= !sample_is_greedy(params[r]);
  if (logits.dtype == DType::kF32 && any_sampling) {
    // Float32 logits (not produced by this backend's models): the reference on the host.
    return sample_f32_logits(logits, params, out_ids);
  }
  // The row parameters travel through staging as raw 32-bit words (24 bytes a row).
  const int32_t* dev_params = stage_i32(reinterpret_cast<const int32_t*>(params),
                                        rows * int64_t(sizeof(SampleRowParams) / 4));
  auto out = alloc(DType::kI32, {rows});
  DeviceTensorPtr hist;
  if (any_sampling) hist = scratch(rows * 65536 * 4);
  auto p = zeroed<SampleParams>();
  p.logits = logits.data;
  p.params = reinterpret_cast<const SampleRowDev*>(dev_params);
  p.out = static_cast<int32_t*>(out->view().data);
  p.hist = hist ? static_cast<uint32_t*>(hist->view().data) : nullptr;
  p.vocab = vocab;
  p.rows = int(rows);
  p.f32 = logits.dtype == DType::kF32;
  const int64_t row_bytes = vocab * dtype_size(logits.dtype);
  p.vec = row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(logits.data) % 16 == 0;
  p.any_sampling = any_sampling;
  record(kOpSample, p, launch_sample);
  end_step();
  CUDA_CHECK(cudaMemcpy(out_ids, out->view().data, size_t(rows) * 4, cudaMemcpyDeviceToHost));
}

void CudaBackend::edit_logits(const Tensor& logits, const LogitEdit* edits, int64_t num_edits) {
  static_assert(sizeof(LogitEditDev) == sizeof(LogitEdit) &&
                offsetof(LogitEdit, bias) == offsetof(LogitEditDev, bias));
  CHECK(logits.is_contiguous());
  CHECK_MSG(logits.dtype == DType::kBF16 || logits.dtype == DType::kF32,
            "edit_logits: logits must be bf16 or f32, got {}", dtype_name(logits.dtype));
  if (num_edits == 0) return;
  const int64_t rows = logits.dim(0), vocab = logits.dim(-1);
  for (int64_t i = 0; i < num_edits; ++i)
    CHECK_MSG(
        edits[i].row >= 0 && edits[i].row < rows && edits[i].token >= 0 && edits[i].token < vocab,
        "edit_logits: edit {} at row {} token {} outside [{}, {}]", i, edits[i].row, edits[i].token,
        rows, vocab);
  // The edits travel through staging as raw 32-bit words (20 bytes each).
  const int32_t* dev = stage_i32(reinterpret_cast<const int32_t*>(edits),
                                 num_edits * int64_t(sizeof(LogitEdit) / 4));
  auto p = zeroed<EditLogitsParams>();
  p.logits = logits.data;
  p.edits = reinterpret_cast<const LogitEditDev*>(dev);
  p.vocab = vocab;
  p.num_edits = num_edits;
  p.f32 = logits.dtype == DType::kF32;
  record(kOpEditLogits, p, launch_edit_logits);
}

}  // namespace strata::cuda
