// The collectives of a tensor-parallel decode step, measured on the GPUs of one host through the
// product's NCCL communicator (backend/cuda/nccl_comm.h): issue 28's "measured NCCL all-reduce /
// all-gather time per decode step", which replaces the sourced estimate in project_tp.py
// (project_tp.py --measured takes this program's output).
//
// One thread a rank, each on its own GPU with its own CUDA backend and stream, as dist/tp_driver.cc
// runs ranks. For every size, on every rank at once:
//  - latency: one collective between two events on the stream, the stream synchronized after each
//    (a decode step's all-reduce sits alone between kernels), the median of --reps;
//  - back to back: --reps collectives enqueued between two events (the pipelined rate), per
//    collective;
// each rank's median, the slowest rank's reported (the group waits for it). The communicator's
// all_gather returns only once complete (it polls the stream: nccl_comm.h), so its times include
// that wait, as a step that gathers its logits sees them. Bus bandwidth as
// nccl-tests defines it (all-reduce: bytes · 2 (N − 1) / N a time; all-gather: bytes · (N − 1)).
//
// Usage: strata_bench_collectives_bench [--tp N (default: every visible GPU)]
//   [--bytes 512,4096,...] [--gather-bytes ...] [--reps 200]
// Output lines (project_tp.py --measured reads them):
//   collective all_reduce tp 8 bytes 14336: latency 6.12 us, back to back 4.80 us, bus 4.1 GB/s
//   collective all_gather tp 8 bytes 81920: latency ...
#include <cstdio>

#ifdef STRATA_HAVE_NCCL
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/nccl_comm.h"
#include "bench_args.h"
#include "bench_timing.h"
#include "core/check.h"

namespace strata {
namespace {

struct Args {
  int tp = 0;
  // A step's all-reduces are the hidden state of its tokens in bf16 (a Kimi-K2.5 / DeepSeek-V3
  // rank: 7,168 · 2 = 14,336 bytes a token: batch 1, 32, 128, 256), plus a sweep.
  std::vector<int> bytes{512,    4096,    14336,   32768,   131072, 262144,
                         458752, 1048576, 1835008, 3670016, 8388608};
  // The logits' all-gather: each rank's vocabulary shard in f32 (Kimi-K2.5: 163,840 / 8 · 4 =
  // 81,920 bytes a token at batch 1, 32, 128).
  std::vector<int> gather_bytes{81920, 2621440, 10485760};
  int reps = 200;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--tp")
      a.tp = std::stoi(v);
    else if (k == "--bytes")
      a.bytes = parse_int_list(v);
    else if (k == "--gather-bytes")
      a.gather_bytes = parse_int_list(v);
    else if (k == "--reps")
      a.reps = std::stoi(v);
    else
      CHECK_MSG(false, "unknown flag {}", k);
  }
  for (int b : a.bytes)
    CHECK_MSG(b > 0 && b % 4 == 0, "--bytes: {} is not a positive multiple of 4", b);
  for (int b : a.gather_bytes)
    CHECK_MSG(b > 0 && b % 4 == 0, "--gather-bytes: {} is not a positive multiple of 4", b);
  CHECK_MSG(a.reps >= 5, "--reps {}: at least 5", a.reps);
  return a;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Timing {
  double latency_us = 0, back_to_back_us = 0;
};

// One rank's timing of `run` (enqueues one collective on `stream`): the median latency of one
// between events (bench_timing.h time_ms, after 5 warm-up calls: NCCL's first calls set up its
// channels), then the median over 3 rounds of `reps` enqueued back to back, a collective.
template <typename Run>
Timing time_collective(cudaStream_t stream, int reps, Run&& run) {
  Timing t;
  t.latency_us = 1e3 * bench::time_ms(stream, 5, reps, run);
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<double> batches;
  for (int round = 0; round < 3; ++round) {
    CUDA_CHECK(cudaEventRecord(e0, stream));
    for (int i = 0; i < reps; ++i) run();
    CUDA_CHECK(cudaEventRecord(e1, stream));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    batches.push_back(1e3 * double(ms) / reps);
  }
  t.back_to_back_us = median(batches);
  CUDA_CHECK(cudaEventDestroy(e0));
  CUDA_CHECK(cudaEventDestroy(e1));
  return t;
}

int run(const Args& a) {
  nccl_apply_env_defaults();
  auto visible = cuda_visible_device_count();
  CHECK_MSG(visible.ok(), "{}", visible.status().to_string());
  const int n = a.tp > 0 ? a.tp : *visible;
  CHECK_MSG(n >= 1 && n <= *visible, "--tp {}: {} GPU(s) visible{}", n, *visible,
            nccl_visible_devices_note());
  auto id = nccl_new_id();
  CHECK_MSG(id.ok(), "{}", id.status().to_string());
  std::printf("collectives: %d rank(s), one a GPU, NCCL_NVLS_ENABLE=%s, %d reps\n", n,
              std::getenv("NCCL_NVLS_ENABLE") ? std::getenv("NCCL_NVLS_ENABLE") : "(unset)",
              a.reps);
  // [size index][rank]: each rank's timing; rank 0 prints the slowest after a barrier.
  const size_t sizes = a.bytes.size() + a.gather_bytes.size();
  std::vector<std::vector<Timing>> times(sizes, std::vector<Timing>(size_t(n)));
  std::barrier sync(n);
  std::atomic<bool> give_up{false};
  std::vector<std::thread> ranks;
  for (int r = 0; r < n; ++r) {
    ranks.emplace_back([&, r] {
      CHECK_MSG(cuda_bind_device(r).ok(), "rank {}: cannot bind GPU {}", r, r);
      auto owned = make_cuda_backend();
      auto* backend = static_cast<cuda::CudaBackend*>(owned.get());
      void* stream = cuda_backend_stream(*backend);
      auto comm = make_nccl_comm(*id, r, n, stream, &give_up);
      if (!comm.ok()) give_up = true;
      CHECK_MSG(comm.ok(), "rank {}: {}", r, comm.status().to_string());
      Communicator& c = **comm;
      const cudaStream_t s = static_cast<cudaStream_t>(stream);
      size_t at = 0;
      for (int b : a.bytes) {  // bf16 elements, as a step's hidden states
        auto x = backend->alloc(DType::kBF16, {int64_t(b) / 2});
        backend->fill_random(*x, uint64_t(r + 1), 0.01f);
        times[at++][size_t(r)] = time_collective(s, a.reps, [&] { c.all_reduce_sum(*x); });
        sync.arrive_and_wait();
      }
      for (int b : a.gather_bytes) {  // f32 elements, as the logits' shards
        auto in = backend->alloc(DType::kF32, {int64_t(b) / 4});
        auto out = backend->alloc(DType::kF32, {int64_t(n), int64_t(b) / 4});
        backend->fill_random(*in, uint64_t(r + 1), 1.0f);
        times[at++][size_t(r)] = time_collective(s, a.reps, [&] { c.all_gather(*in, *out); });
        sync.arrive_and_wait();
      }
    });
  }
  for (std::thread& t : ranks) t.join();
  for (size_t i = 0; i < sizes; ++i) {
    const bool reduce = i < a.bytes.size();
    const int b = reduce ? a.bytes[i] : a.gather_bytes[i - a.bytes.size()];
    Timing worst;
    for (const Timing& t : times[i]) {
      worst.latency_us = std::max(worst.latency_us, t.latency_us);
      worst.back_to_back_us = std::max(worst.back_to_back_us, t.back_to_back_us);
    }
    const double moved = reduce ? double(b) * 2.0 * (n - 1) / n : double(b) * (n - 1);
    std::printf(
        "collective %s tp %d bytes %d: latency %.2f us, back to back %.2f us, bus %.1f GB/s\n",
        reduce ? "all_reduce" : "all_gather", n, b, worst.latency_us, worst.back_to_back_us,
        moved / (worst.latency_us * 1e3));
  }
  return 0;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) { return strata::run(strata::parse(argc, argv)); }
#else   // STRATA_HAVE_NCCL
int main() {
  std::fprintf(stderr, "collectives_bench: built without NCCL (CMakeLists.txt: set NCCL_ROOT)\n");
  return 2;
}
#endif  // STRATA_HAVE_NCCL
