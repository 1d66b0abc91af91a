// MLA attention kernels (backend/cuda/mla_attention.h) on one GPU, against ceilings measured in
// the same run (issue 22's acceptance shapes):
//   ceilings  device-to-device copy bandwidth (read + write bytes / s, 4 GiB) and the cuBLAS bf16
//             GEMM rate (8192³), as bench/cuda/llama_bench.cc measures them
//   decode    batch 64 × 4,096-token contexts, one new token a sequence, 16 heads (Moonlight /
//             V2-Lite at tp 1), 8 (Kimi-K2.5 at tp 8), 128 (DeepSeek-V3 at tp 1); bf16, fp8_e4m3
//             and fp8_flashmla rows; GB/s of latent rows read (batch · context · row bytes) and %
//             of copy bandwidth; TFLOP/s (2 · heads · context · (R + P + R) a sequence) and % of
//             the GEMM rate; the plan's kernel (the decode kernel for 8 / 16 heads and fp8 rows at
//             128 heads, wgmma for bf16 at 128 heads) and, for comparison, the mma kernel; the
//             decode kernel's three e4m3 conversions (cvt 0 integer, 1 the conversion unit in the
//             S warps, 2 in both) over fp8 rows; one 32K-token sequence (split-KV + merge)
//   prefill   8,192 new tokens causal (the absorbed kernel as the prefill path), 16 and 128 heads:
//             TFLOP/s over the causal FLOPs and % of the GEMM rate
// Pages of 64 tokens in a shuffled order; the rows written by the MLA write kernel from random
// bf16 values. Timing: CUDA events around 8 calls enqueued back to back over two copies of the
// cache (median of 10), and beside it one synced call (median of 20; it also times the host's
// launch latency). Compare with bench/cuda/mla_torch_baseline.py (PyTorch bmm + softmax of the
// same decode).
//
// variants  (with --what variants) the decode kernel before its bandwidth pass ("old": one row a
//           copy, no L2 prefetch) against the product's ("new": groups of 4 rows a copy, L2
//           prefetch), each change alone and other prefetch distances, at 16 and 8 heads over
//           bf16, fp8_flashmla and fp8_e4m3 rows (and fp8_flashmla at 128), a summary line each
// acceptance (with --what acceptance) issue 22's decode rows with the product's plans: bf16 and
//           fp8_flashmla at 16, 8 and 128 heads
// scaling   (with --what scaling) bf16 decode at other batches, contexts and split counts, loads
//           alone, pages shuffled and in pool order (what limits the acceptance shape);
//           fp8split (--what fp8split) the same over fp8_flashmla rows
// merge     (with --what merge) the decode kernel's own split merge against the merge kernel
// batch1    (with --what batch1) batch-1 decode (a Kimi-K2.5 rank, Moonlight): profile, loads
//           alone, math alone, split counts; the mma kernel beside it
// sgroups   (with --what sgroups) the decode kernel's 16-row blocks with two groups of S warps
//           (MlaPlanOptions::s_groups: by rows, and over fp8_flashmla by dims) against one, bf16
//           and fp8_flashmla rows, as the acceptance rows run (three rounds, alternating), with
//           their wait profiles; the outputs compared; then each form with L2 prefetch 1 / 2 / 4
// Usage: strata_bench_mla_bench [--what ceilings,variants,acceptance,scaling,fp8split,merge,
//                                       decode,prefill]
//                               [--batch 64] [--context 4096] [--pages sequential]
//                               [--fused-merge 2] [--early-kv 0|1]
//                               [--decode-kernel 0] [--wgmma-pipe 0]  (0: never the decode
//                               kernel / the pipelined wgmma kernel, e.g. after their parity tests
//                               failed) [--row-groups 0] [--l2-prefetch 0]  (the acceptance
//                               rows' decode kernel without that change, e.g. after its parity
//                               cases failed) [--vtile 0]  (no V-tile variants)
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/mla_attention.h"
#include "backend/cuda/tunables.h"
#include "bench_timing.h"
#include "core/check.h"
#include "core/dtype.h"

namespace strata {
namespace {

using bench::Ceilings;
using bench::measure_ceilings;
using bench::time_ms;

bool g_decode_kernel = true;  // --decode-kernel 0: plans without the decode kernel
bool g_wgmma_pipe = true;     // --wgmma-pipe 0: the wgmma kernel instead of the pipelined one
int g_row_groups = -1;   // --row-groups 0: the acceptance rows' decode kernel copies single rows
int g_l2_prefetch = -1;  // --l2-prefetch N: and prefetches N chunks ahead
bool g_vtile = true;     // --vtile 0: no V-tile variants (e.g. after their parity tests failed)
bool g_shuffle = true;   // --pages sequential: each sequence's pages in pool order (scaling rows)
int g_early_kv = -1;     // --early-kv 0|1: the decode kernel's copies of old keys before its PDL
                         // wait (MlaAttentionParams::early_kv; -1: the product's default)
int g_fused_merge = 2;   // --fused-merge N: the acceptance rows' decode kernel merges up to N
                         // splits itself (the product's default: 2; 0 never)

#define BENCH_CUDA(expr)                                                          \
  do {                                                                            \
    const cudaError_t e_ = (expr);                                                \
    CHECK_MSG(e_ == cudaSuccess, "CUDA: {} ({})", cudaGetErrorString(e_), #expr); \
  } while (0)

struct Buf {
  void* p = nullptr;
  explicit Buf(size_t n) { BENCH_CUDA(cudaMalloc(&p, std::max<size_t>(n, 16))); }
  ~Buf() { cudaFree(p); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};
template <typename T>
std::unique_ptr<Buf> upload(const std::vector<T>& v) {
  auto b = std::make_unique<Buf>(v.size() * sizeof(T));
  BENCH_CUDA(cudaMemcpy(b->p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return b;
}

// Uniform random bf16 bits in [-1, 1) (a cheap LCG per element on the host is too slow for GiBs:
// a pattern of 1 MiB repeated).
void fill_random(void* p, size_t bytes, uint32_t seed) {
  std::vector<uint16_t> pat(1 << 19);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto& x : pat) x = f32_to_bf16(u(rng));
  for (size_t at = 0; at < bytes; at += pat.size() * 2)
    BENCH_CUDA(cudaMemcpy(static_cast<char*>(p) + at, pat.data(),
                          std::min(bytes - at, pat.size() * 2), cudaMemcpyHostToDevice));
}

struct Layout {
  const char* name;
  DType dtype;
  bool flashmla;
};

// Where the decode kernel's warps wait (MlaAttentionParams::prof): one more launch with the
// clock64 sums on, printed as cycles a chunk of one warp (the block's 4 PV warps, or its 4 or 8 S
// warps, averaged) and as % of that role's whole run.
void print_profile(cudaStream_t s, cuda::MlaAttentionParams p, const cuda::MlaPlan& plan,
                   const char* what, const char* layout, int heads) {
  Buf prof(cuda::kMlaDecodeProfSlots * 8);
  BENCH_CUDA(cudaMemset(prof.p, 0, cuda::kMlaDecodeProfSlots * 8));
  p.prof = prof.as<uint64_t>();
  cuda::launch_mla_attention(p, s);
  BENCH_CUDA(cudaStreamSynchronize(s));
  uint64_t v[cuda::kMlaDecodeProfSlots];
  BENCH_CUDA(cudaMemcpy(v, prof.p, sizeof v, cudaMemcpyDeviceToHost));
  const double warps = double(plan.row_tiles) * plan.num_splits * p.num_seqs * 4;
  const double chunks = double(plan.split_len) / plan.chunk;  // a block's (all full here)
  auto per = [&](int k) { return double(v[k]) / warps / chunks; };
  auto per_s = [&](int k) { return per(k) / (plan.s_groups >= 2 ? 2 : 1); };  // two S groups
  auto pct = [&](int k, int total) {
    return v[total] ? 100.0 * double(v[k]) / double(v[total]) : 0;
  };
  std::printf(
      "prof     %-12s %-12s %3d heads, cycles/chunk: S %5.0f (full wait %4.0f = %2.0f%%, max %4.0f "
      "= "
      "%2.0f%%, P free %4.0f = %2.0f%%); PV %5.0f (P ready %4.0f = %2.0f%%, stage %4.0f = %2.0f%%, "
      "produce %4.0f = %2.0f%%)\n",
      what, layout, heads, per_s(cuda::kProfSTotal), per_s(cuda::kProfSFull),
      pct(cuda::kProfSFull, cuda::kProfSTotal), per_s(cuda::kProfSMax),
      pct(cuda::kProfSMax, cuda::kProfSTotal), per_s(cuda::kProfSFree),
      pct(cuda::kProfSFree, cuda::kProfSTotal), per(cuda::kProfPvTotal), per(cuda::kProfPvReady),
      pct(cuda::kProfPvReady, cuda::kProfPvTotal), per(cuda::kProfPvStage),
      pct(cuda::kProfPvStage, cuda::kProfPvTotal), per(cuda::kProfPvProduce),
      pct(cuda::kProfPvProduce, cuda::kProfPvTotal));
}

// Runs `a`, then `b` (the same inputs and output `out`, another form of the kernel), and compares
// their n bf16 outputs: values whose bits differ, and the NMSE of b against a over the pairs where
// both are finite (the benchmark's random FlashMLA rows hold random scale bytes, some not finite).
struct OutputDiff {
  int64_t differ = 0, finite = 0;
  double nmse = 0;
  size_t n = 0;
};
OutputDiff compare_forms(cudaStream_t s, const cuda::MlaAttentionParams& a,
                         const cuda::MlaAttentionParams& b, const Buf& out, size_t n) {
  std::vector<uint16_t> va(n), vb(n);
  for (auto [p, v] : {std::pair{&a, &va}, std::pair{&b, &vb}}) {
    cuda::launch_mla_attention(*p, s);
    BENCH_CUDA(cudaStreamSynchronize(s));
    BENCH_CUDA(cudaMemcpy(v->data(), out.p, n * 2, cudaMemcpyDeviceToHost));
  }
  OutputDiff d;
  d.n = n;
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    d.differ += va[i] != vb[i];
    const double x = bf16_to_f32(va[i]), y = bf16_to_f32(vb[i]);
    if (!std::isfinite(x) || !std::isfinite(y)) continue;
    ++d.finite;
    num += (x - y) * (x - y);
    den += x * x;
  }
  d.nmse = den > 0 ? num / den : 0;
  return d;
}

// One layer's latent cache of `batch` sequences × `ctx` tokens (pages of `page` tokens, shuffled),
// written by the MLA write kernel; then `new_tokens` new tokens a sequence attend over it.
// Returns the % of copy bandwidth.
double bench_case(cudaStream_t s, const Ceilings& c, const Layout& lt, int batch, int ctx,
                  int new_tokens, int heads, const char* what, const cuda::MlaPlanOptions& opt = {},
                  bool profile = false) {
  constexpr int R = 512, P = 64, W = R + P, page = 64;
  const int pages_per_seq = (ctx + page - 1) / page;
  const int64_t num_pages = int64_t(batch) * pages_per_seq;
  KvLayout lay;
  lay.num_layers = 1;
  lay.num_pages = num_pages;
  lay.page_size = page;
  lay.k_dim = W;
  lay.dtype = lt.dtype;
  lay.rope_dim = P;
  if (lt.flashmla) lay.format = KvFormat::kFlashMlaFp8;
  const cuda::MlaRowFormat fmt = cuda::mla_row_format(lay, 0, 1.0f);
  Buf cache(size_t(num_pages * page * fmt.row_bytes));
  std::vector<int32_t> perm(static_cast<size_t>(num_pages));
  std::iota(perm.begin(), perm.end(), 0);
  if (g_shuffle) std::shuffle(perm.begin(), perm.end(), std::mt19937(5));
  {  // every slot written from random bf16 rows (in slabs of 64K tokens)
    const int64_t slots = num_pages * page, slab = 65536;
    Buf src(size_t(slab) * W * 2), dslots(size_t(slab) * 4);
    fill_random(src.p, size_t(slab) * W * 2, 11);
    std::vector<int32_t> idx(static_cast<size_t>(slab));
    for (int64_t at = 0; at < slots; at += slab) {
      const int64_t n = std::min(slab, slots - at);
      std::iota(idx.begin(), idx.begin() + n, int32_t(at));
      BENCH_CUDA(cudaMemcpy(dslots.p, idx.data(), size_t(n) * 4, cudaMemcpyHostToDevice));
      cuda::MlaKvWriteParams wp{};
      wp.src = src.as<uint16_t>();
      wp.cache = cache.p;
      wp.slots = dslots.as<int32_t>();
      wp.tokens = n;
      wp.src_stride = W;
      wp.fmt = fmt;
      cuda::launch_mla_kv_write(wp, s);
    }
    BENCH_CUDA(cudaStreamSynchronize(s));
  }
  std::vector<int32_t> q_indptr{0}, kv_lens, page_indptr{0}, pages;
  for (int b = 0; b < batch; ++b) {
    for (int i = 0; i < pages_per_seq; ++i) pages.push_back(perm[size_t(b * pages_per_seq + i)]);
    page_indptr.push_back(int32_t(pages.size()));
    kv_lens.push_back(ctx);
    q_indptr.push_back(q_indptr.back() + new_tokens);
  }
  const int64_t tokens = int64_t(batch) * new_tokens;
  Buf q(size_t(tokens) * heads * W * 2), out(size_t(tokens) * heads * R * 2);
  fill_random(q.p, size_t(tokens) * heads * W * 2, 3);
  auto d_qi = upload(q_indptr), d_kl = upload(kv_lens), d_pi = upload(page_indptr),
       d_pg = upload(pages);
  cuda::MlaAttentionParams p{};
  p.q = q.as<uint16_t>();
  p.cache = cache.p;
  p.out = out.as<uint16_t>();
  p.q_indptr = d_qi->as<int32_t>();
  p.kv_lens = d_kl->as<int32_t>();
  p.page_indptr = d_pi->as<int32_t>();
  p.page_indices = d_pg->as<int32_t>();
  p.fmt = fmt;
  p.num_seqs = batch;
  p.heads = heads;
  p.q_stride = W;
  p.page_size = page;
  p.scale_log2 = float(1.0 / std::sqrt(192.0) * 1.4426950408889634);
  p.copy_width = cuda::mla_copy_width(cache.p, fmt.row_bytes);
  // As the backend sets it: the calls queued back to back write no key (each waits on the one
  // before it, which triggers after its own wait).
  p.early_kv = g_early_kv >= 0 ? g_early_kv : cuda::CudaTunables{}.mla_early_kv ? 1 : 0;
  int sms = 0;
  BENCH_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cuda::MlaPlanOptions o = opt;
  if (!g_decode_kernel) o.decode = 0;
  if (!g_wgmma_pipe && o.wgmma == 2) o.wgmma = 1;
  const cuda::MlaPlan plan =
      cuda::plan_mla_attention(fmt, batch, tokens, heads, new_tokens, ctx, sms, o);
  Buf scratch(size_t(std::max<int64_t>(plan.scratch_bytes, 16)));
  const size_t counter_bytes = size_t(std::max<int64_t>(plan.merge_counters, 1)) * 4;
  Buf counters(counter_bytes);  // the fused merge's, zero before the first launch
  BENCH_CUDA(cudaMemset(counters.p, 0, counter_bytes));
  cuda::apply_mla_plan(plan, plan.scratch_bytes ? scratch.p : nullptr, &p, counters.as<int32_t>());
  // Two timings. Back to back (the headline, as a decode step's graph runs the kernel and as
  // int4_linear_bench, Triton's do_bench and nvbench time): kQueued calls enqueued at once,
  // alternating between the cache and a copy of it (each call's rows come from DRAM, not from
  // what the previous call left in L2), the mean of a call. One synced call (the figure before
  // 2026-12-03 session 14): events around a single launch on an idle GPU, which also times the
  // host's launch latency (~5 us of a ~90 us call).
  constexpr int kQueued = 8;
  Buf cache2(size_t(num_pages * page * fmt.row_bytes));
  BENCH_CUDA(cudaMemcpy(cache2.p, cache.p, size_t(num_pages * page * fmt.row_bytes),
                        cudaMemcpyDeviceToDevice));
  const double ms_synced = time_ms(s, 3, 20, [&] { cuda::launch_mla_attention(p, s); });
  const double ms = time_ms(s, 1, 10,
                            [&] {
                              for (int i = 0; i < kQueued; ++i) {
                                p.cache = i % 2 ? cache2.p : cache.p;
                                cuda::launch_mla_attention(p, s);
                              }
                              p.cache = cache.p;
                            }) /
                    kQueued;
  BENCH_CUDA(cudaGetLastError());
  if (plan.kernel == cuda::kMlaWgmmaPipe && p.multicast && p.diag == 0 && heads == 128 &&
      new_tokens == 1) {
    // The row-tile pairs (multicast copies) against the plain pipelined kernel: the same bits.
    cuda::MlaAttentionParams r = p;
    r.multicast = 0;
    const OutputDiff d = compare_forms(s, p, r, out, size_t(tokens) * heads * R);
    std::printf(
        "pairs    the row-tile pairs' output against the unpaired kernel's: %lld of %zu bf16 "
        "values differ\n",
        static_cast<long long>(d.differ), d.n);
  }
  if (plan.s_groups >= 2 && p.diag == 0) {
    // Two S groups against one (the same plan otherwise): by rows the same bits, by dims close.
    cuda::MlaAttentionParams r = p;
    r.s_groups = 1;
    const OutputDiff d = compare_forms(s, p, r, out, size_t(tokens) * heads * R);
    std::printf(
        "sgroups  S form %d's output against one group's: %lld of %zu bf16 values differ, NMSE "
        "%.3g over the %lld finite pairs\n",
        plan.s_groups, static_cast<long long>(d.differ), d.n, d.nmse,
        static_cast<long long>(d.finite));
  }
  // Causal among the new tokens: token i sees ctx - new_tokens + i + 1 keys.
  double keys = 0;
  for (int i = 0; i < new_tokens; ++i) keys += ctx - new_tokens + i + 1;
  const double flops = 2.0 * batch * heads * keys * (W + R);
  const double bytes = double(batch) * ctx * fmt.row_bytes;
  const double gbs = bytes / (ms * 1e-3) / 1e9, tflops = flops / (ms * 1e-3) / 1e12;
  const char* kname = plan.kernel == cuda::kMlaWgmma       ? "wgmma"
                      : plan.kernel == cuda::kMlaWgmmaPipe ? "wgmma-pipe"
                      : plan.kernel == cuda::kMlaDecode    ? "decode"
                                                           : "mma";
  char variant[48];
  int at = std::snprintf(variant, sizeof variant, "%s %dx%d", kname, plan.chunk, plan.stages);
  if (plan.kernel == cuda::kMlaDecode && fmt.latent_elem == cuda::kMlaE4M3)
    at += std::snprintf(variant + at, sizeof variant - at, " c%d", plan.cvt);
  if (plan.kernel == cuda::kMlaDecode)
    at += std::snprintf(variant + at, sizeof variant - at, " pf%d%s", plan.l2_prefetch,
                        plan.row_groups >= 2 && page % 8 == 0 ? " g8"
                        : plan.row_groups && page % 4 == 0    ? " g4"
                                                              : "");
  if (plan.evict_first) at += std::snprintf(variant + at, sizeof variant - at, " ef");
  if (plan.kernel == cuda::kMlaDecode && plan.s_groups >= 2)
    at += std::snprintf(variant + at, sizeof variant - at, " sg%d", plan.s_groups);
  if (p.merge_counters) at += std::snprintf(variant + at, sizeof variant - at, " fm");
  if (plan.diag == 1) std::snprintf(variant + at, sizeof variant - at, " LOADS");
  if (plan.diag == 2) std::snprintf(variant + at, sizeof variant - at, " MATH");
  if (plan.diag == 3) std::snprintf(variant + at, sizeof variant - at, " NO-PV-MATH");
  if (plan.diag == 4) std::snprintf(variant + at, sizeof variant - at, " NO-S-MATH");
  if (plan.kernel == cuda::kMlaWgmmaPipe && !plan.multicast)
    std::snprintf(variant + at, sizeof variant - at, " no-pairs");
  const double synced_pct = 100.0 * bytes / (ms_synced * 1e-3) / 1e9 / c.copy_gbs;
  std::printf(
      "mla      %-7s %-12s batch %2d x ctx %5d, %4d new, %3d heads, %-24s %2d rows, %3d split(s): "
      "%8.3f ms, %5.0f GB/s of latent rows = %5.1f%% of copy, %5.0f TFLOP/s = %5.1f%% of GEMM "
      "(one synced call %.3f ms = %.1f%%)\n",
      what, lt.name, batch, ctx, new_tokens, heads, variant, plan.tile_rows, plan.num_splits, ms,
      gbs, 100.0 * gbs / c.copy_gbs, tflops, 100.0 * tflops / c.gemm_tflops, ms_synced, synced_pct);
  if (profile && plan.kernel == cuda::kMlaDecode) print_profile(s, p, plan, what, lt.name, heads);
  return 100.0 * gbs / c.copy_gbs;
}

// The decode kernel's changes of issue 22's bandwidth passes against the kernel before them
// ("old": rows copied one by one, no L2 prefetch): rows copied in groups of 4 (row_groups 1), the
// L2 prefetch (l2_prefetch chunks ahead) alone and with the groups, the product's default
// ("new"), a sweep of prefetch distances, groups of 8 rows (row_groups 2, also with the L2
// evict-first policy) and 4 stages instead of as many as fit, the other e4m3 conversions (cvt 0 and
// 2, 16 heads), the V tile over e4m3 rows (cvt 3, with groups of 4 and 8; loads-only, math-only, no
// PV math), loads-only runs of old, new and groups of 8, a math-only run of new and runs of new
// without the PV warps' or the S warps' math (wrong results: where the time goes). One summary line
// a layout and head count.
void variant_sweep(cudaStream_t s, const Ceilings& c, const Layout& lt, int batch, int ctx,
                   int heads) {
  struct V {
    const char* name;
    cuda::MlaPlanOptions opt;
  };
  const V vs[] = {
      {"old", {.cvt = cuda::kMlaCvtHwS, .l2_prefetch = 0, .row_groups = 0}},
      {"groups", {.l2_prefetch = 0, .row_groups = 1}},
      {"prefetch", {.l2_prefetch = 2, .row_groups = 0}},
      {"new", {}},
      {"groups+pf1", {.l2_prefetch = 1, .row_groups = 1}},
      {"groups+pf4", {.l2_prefetch = 4, .row_groups = 1}},
      {"groups+pf6", {.l2_prefetch = 6, .row_groups = 1}},
      {"groups8", {.l2_prefetch = 0, .row_groups = 2}},
      {"groups8-4st", {.l2_prefetch = 0, .row_groups = 2, .stages = 4}},
      {"groups-4st", {.l2_prefetch = 0, .row_groups = 1, .stages = 4}},
      {"groups8-ef", {.evict_first = 1, .l2_prefetch = 0, .row_groups = 2}},
  };
  double old_pct = 0, new_pct = 0, best = 0;
  const char* best_name = "";
  for (const V& v : vs) {
    const bool profile = std::strcmp(v.name, "new") == 0 || std::strcmp(v.name, "groups8") == 0;
    const double pct = bench_case(s, c, lt, batch, ctx, 1, heads, v.name, v.opt, profile);
    if (std::strcmp(v.name, "old") == 0) old_pct = pct;
    if (std::strcmp(v.name, "new") == 0) new_pct = pct;
    if (pct > best) best = pct, best_name = v.name;
  }
  if (lt.dtype == DType::kFP8E4M3 && heads > 8) {  // the other e4m3 conversions (16-row blocks)
    for (int cvt : {cuda::kMlaCvtInt, cuda::kMlaCvtHwS, cuda::kMlaCvtHw}) {
      const double pct = bench_case(s, c, lt, batch, ctx, 1, heads, "new-cvt", {.cvt = cvt});
      if (pct > best)
        best = pct, best_name = cvt == cuda::kMlaCvtInt   ? "new, cvt 0"
                                : cvt == cuda::kMlaCvtHwS ? "new, cvt 1"
                                                          : "new, cvt 2";
    }
  }
  if (lt.dtype == DType::kFP8E4M3 && g_vtile) {  // the V tile: values converted once
    const int t = cuda::kMlaCvtTile;
    for (const V& v : {V{"tile", {.cvt = t}}, V{"tile-g8", {.cvt = t, .row_groups = 2}}}) {
      const double pct = bench_case(s, c, lt, batch, ctx, 1, heads, v.name, v.opt, true);
      if (pct > best) best = pct, best_name = v.name;
    }
    bench_case(s, c, lt, batch, ctx, 1, heads, "tile-load", {.cvt = t, .diag = 1});
    bench_case(s, c, lt, batch, ctx, 1, heads, "tile-math", {.cvt = t, .diag = 2});
    bench_case(s, c, lt, batch, ctx, 1, heads, "tile-noPV", {.cvt = t, .diag = 3});
  }
  bench_case(s, c, lt, batch, ctx, 1, heads, "old-load",
             {.diag = 1, .l2_prefetch = 0, .row_groups = 0});
  bench_case(s, c, lt, batch, ctx, 1, heads, "new-load", {.diag = 1});
  bench_case(s, c, lt, batch, ctx, 1, heads, "g8-load", {.diag = 1, .row_groups = 2});
  bench_case(s, c, lt, batch, ctx, 1, heads, "new-math", {.diag = 2});
  bench_case(s, c, lt, batch, ctx, 1, heads, "new-noPV", {.diag = 3});
  bench_case(s, c, lt, batch, ctx, 1, heads, "new-noS", {.diag = 4});
  std::printf(
      "summary  %-12s %3d heads: old %5.1f%% -> new %5.1f%% of copy (%.2fx); best %5.1f%% (%s)\n",
      lt.name, heads, old_pct, new_pct, old_pct > 0 ? new_pct / old_pct : 0.0, best, best_name);
}

// Where the decode rows' % of copy comes from (issue 22's 85% over bf16 rows, `scaling`; 80% over
// fp8_flashmla rows, `fp8split`): the acceptance shape against twice the keys a block (batch 128,
// or context 8,192), the same shape without the split-KV merge (one split: 64 blocks) and with
// more splits, loads alone, and pages in pool order against shuffled ones (the TLB: each
// sequence's pages then share 2 MiB mappings). fp8_flashmla rows read at 79% of copy at batch 128
// (one split) against 65% at 64 (two), H100, 2026-12-06: a per-call cost or a per-chunk bound?
void scaling(cudaStream_t s, const Ceilings& c, const Layout& rows) {
  struct Shape {
    int batch, ctx;
  };
  for (const bool shuffled : {true, false}) {
    g_shuffle = shuffled;
    const char* what = shuffled ? "shuffled" : "in-order";
    for (int heads : {16, 8}) {
      for (const Shape sh :
           {Shape{64, 4096}, Shape{128, 4096}, Shape{64, 8192}, Shape{32, 8192}, Shape{256, 1024}})
        bench_case(s, c, rows, sh.batch, sh.ctx, 1, heads, what);
      for (int n : {1, 3, 4, 8})
        bench_case(s, c, rows, 64, 4096, 1, heads, what, cuda::MlaPlanOptions{.splits = n});
      for (int diag : {1, 2}) {  // loads alone, math alone
        bench_case(s, c, rows, 64, 4096, 1, heads, what, cuda::MlaPlanOptions{.diag = diag}, true);
        bench_case(s, c, rows, 128, 4096, 1, heads, what, cuda::MlaPlanOptions{.diag = diag});
      }
    }
  }
  g_shuffle = true;
}

// The decode kernel's own split merge (MlaPlanOptions::fused_merge) against the merge kernel, on
// the split shapes: issue 22's (64 x 4,096), 32 x 8,192, and batch 1 as a Kimi-K2.5 rank (8
// heads, 4,096 keys: 32 splits of 2 chunks, or 64 of one) and Moonlight (16 heads, 768 keys, 8-row
// blocks) run it; bf16 and fp8_flashmla rows.
void fused_merge(cudaStream_t s, const Ceilings& c, const Layout& bf16, const Layout& flash) {
  struct Shape {
    int batch, ctx, heads, min_split_chunks, decode_rows;
  };
  for (const Shape sh :
       {Shape{64, 4096, 16, 1, 0}, Shape{64, 4096, 8, 1, 0}, Shape{32, 8192, 16, 1, 0},
        Shape{1, 4096, 8, 2, -1}, Shape{1, 4096, 8, 1, -1}, Shape{1, 768, 16, 2, -1},
        Shape{4, 4096, 8, 2, -1}})
    for (const Layout* lt : {&bf16, &flash})
      for (int fm : {0, 1})
        bench_case(s, c, *lt, sh.batch, sh.ctx, 1, sh.heads, fm ? "fused" : "kernel",
                   cuda::MlaPlanOptions{.decode_rows = sh.decode_rows,
                                        .min_split_chunks = sh.min_split_chunks,
                                        .fused_merge = fm ? cuda::kMlaFusedMergeMaxSplits : 0});
}

// Batch 1 as a Kimi-K2.5 rank (8 heads, 4,096 keys: the plan's 32 splits of 2 chunks) and
// Moonlight (16 heads, 768 keys) run it, where a step's decode is a latency, not a stream: the
// product's plan with its wait profile, loads alone, math alone, and other split counts.
void batch_one(cudaStream_t s, const Ceilings& c, const Layout& bf16) {
  struct Shape {
    int ctx, heads;
  };
  for (const Shape sh : {Shape{4096, 8}, Shape{768, 16}}) {
    const cuda::MlaPlanOptions plan{.decode_rows = -1, .min_split_chunks = 2};
    bench_case(s, c, bf16, 1, sh.ctx, 1, sh.heads, "batch1", plan, true);
    for (int diag : {1, 2}) {
      cuda::MlaPlanOptions o = plan;
      o.diag = diag;
      bench_case(s, c, bf16, 1, sh.ctx, 1, sh.heads, "batch1", o, true);
    }
    for (int n : {8, 16, 64, 128}) {
      cuda::MlaPlanOptions o = plan;
      o.splits = n;
      bench_case(s, c, bf16, 1, sh.ctx, 1, sh.heads, "batch1", o, true);
    }
    // The mma kernel (mla_decode_min_rows): its plan's splits, then fewer and more.
    for (int n : {0, 16, 64}) {
      cuda::MlaPlanOptions o = plan;
      o.decode = 0;
      o.splits = n;
      bench_case(s, c, bf16, 1, sh.ctx, 1, sh.heads, "batch1", o);
    }
  }
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  using namespace strata;
  std::string what = "ceilings,decode,prefill";
  int batch = 64, ctx = 4096;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--what")
      what = argv[i + 1];
    else if (a == "--batch")
      batch = std::atoi(argv[i + 1]);
    else if (a == "--context")
      ctx = std::atoi(argv[i + 1]);
    else if (a == "--decode-kernel")
      g_decode_kernel = std::atoi(argv[i + 1]) != 0;
    else if (a == "--wgmma-pipe")
      g_wgmma_pipe = std::atoi(argv[i + 1]) != 0;
    else if (a == "--row-groups")
      g_row_groups = std::atoi(argv[i + 1]);
    else if (a == "--l2-prefetch")
      g_l2_prefetch = std::atoi(argv[i + 1]);
    else if (a == "--vtile")
      g_vtile = std::atoi(argv[i + 1]) != 0;
    else if (a == "--pages")
      g_shuffle = std::string(argv[i + 1]) != "sequential";
    else if (a == "--fused-merge")
      g_fused_merge = std::atoi(argv[i + 1]);
    else if (a == "--early-kv")
      g_early_kv = std::atoi(argv[i + 1]);
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  cudaDeviceProp prop{};
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device   %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  cuda::init_mla_attention_kernels();
  cudaStream_t s;
  BENCH_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Ceilings c{1, 1};  // without "ceilings": ratios against 1
  if (what.find("ceilings") != std::string::npos) c = measure_ceilings(s);
  const Layout bf16{"bf16", DType::kBF16, false}, e4m3{"fp8_e4m3", DType::kFP8E4M3, false},
      e5m2{"fp8_e5m2", DType::kFP8E5M2, false}, flash{"fp8_flashmla", DType::kFP8E4M3, true};
  const cuda::MlaPlanOptions mma64{.decode = 0, .bf16_chunk = 64}, mma{.decode = 0};
  auto cvt = [](int v) { return cuda::MlaPlanOptions{.cvt = v}; };
  if (what.find("variants") != std::string::npos) {  // old vs new first
    for (int heads : {16, 8})
      for (const Layout* lt : {&bf16, &flash, &e4m3}) variant_sweep(s, c, *lt, batch, ctx, heads);
    variant_sweep(s, c, flash, batch, ctx, 128);  // (bf16 at 128 heads: the wgmma kernel)
  }
  if (what.find("acceptance") != std::string::npos) {  // issue 22's rows, the product's plans
    cuda::MlaPlanOptions o;
    if (g_row_groups >= 0) o.row_groups = g_row_groups;
    if (g_l2_prefetch >= 0) o.l2_prefetch = g_l2_prefetch;
    o.fused_merge = g_fused_merge;
    for (int heads : {16, 8, 128})
      for (const Layout* lt : {&bf16, &flash})
        bench_case(s, c, *lt, batch, ctx, 1, heads, "accept", o);
  }
  if (what.find("sgroups") != std::string::npos) {  // two S groups against one, 16 heads
    cuda::MlaPlanOptions o;
    o.fused_merge = g_fused_merge;
    const char* names[] = {"", "sgroup1", "sgroup2", "sgroup3"};
    for (int round = 0; round < 3; ++round)
      for (const Layout* lt : {&bf16, &flash})
        for (int sg : {1, 2, 3}) {
          if (sg == 3 && lt == &bf16) continue;  // by dims: fp8 rows through the V tile only
          o.s_groups = sg;
          bench_case(s, c, *lt, batch, ctx, 1, 16, names[sg], o, round == 0);
        }
    for (int sg : {1, 3}) {  // fp8_flashmla at a batch of 128 (one split a sequence, no merge)
      o.s_groups = sg;
      bench_case(s, c, flash, 128, ctx, 1, 16, names[sg], o);
    }
    o.s_groups = 2;  // a batch of 128: one split a sequence, no merge
    bench_case(s, c, bf16, 128, ctx, 1, 16, "sgroup2", o);
    o.s_groups = 1;
    bench_case(s, c, bf16, 128, ctx, 1, 16, "sgroup1", o);
    // The L2 prefetch distance with each form (the S warps wait for stage bytes: fp8_flashmla
    // rows have 2 stages beside the V tile, bf16 rows 3).
    for (const Layout* lt : {&bf16, &flash})
      for (int sg : {1, 2, 3}) {
        if (sg == 3 && lt == &bf16) continue;
        for (int pf : {1, 2, 4}) {
          const std::string name = "sg" + std::to_string(sg) + "-pf" + std::to_string(pf);
          o.s_groups = sg;
          o.l2_prefetch = pf;
          bench_case(s, c, *lt, batch, ctx, 1, 16, name.c_str(), o);
        }
      }
  }
  if (what.find("scaling") != std::string::npos) scaling(s, c, bf16);
  if (what.find("fp8split") != std::string::npos) scaling(s, c, flash);
  if (what.find("merge") != std::string::npos) fused_merge(s, c, bf16, flash);
  if (what.find("batch1") != std::string::npos) batch_one(s, c, bf16);
  if (what.find("decode") != std::string::npos) {
    for (int heads : {16, 8}) {
      bench_case(s, c, bf16, batch, ctx, 1, heads, "decode");
      bench_case(s, c, bf16, batch, ctx, 1, heads, "decode", mma64);
      bench_case(s, c, flash, batch, ctx, 1, heads, "decode");
      bench_case(s, c, e4m3, batch, ctx, 1, heads, "decode");
    }
    for (int v : {cuda::kMlaCvtInt, cuda::kMlaCvtHw}) {  // the other e4m3 conversions, 16 heads
      bench_case(s, c, flash, batch, ctx, 1, 16, "decode", cvt(v));
      bench_case(s, c, e4m3, batch, ctx, 1, 16, "decode", cvt(v));
    }
    bench_case(s, c, e5m2, batch, ctx, 1, 16, "decode");
    // Where the time goes (wrong results): loads without math, math without loads; and the L2
    // evict-first policy for the streamed rows.
    for (const Layout* lt : {&bf16, &flash}) {
      bench_case(s, c, *lt, batch, ctx, 1, 16, "decode", cuda::MlaPlanOptions{.diag = 1});
      bench_case(s, c, *lt, batch, ctx, 1, 16, "decode", cuda::MlaPlanOptions{.diag = 2});
      bench_case(s, c, *lt, batch, ctx, 1, 16, "decode", cuda::MlaPlanOptions{.evict_first = 1});
    }
    bench_case(s, c, flash, batch, ctx, 1, 16, "decode", mma);
    bench_case(s, c, bf16, batch, ctx, 1, 128, "decode");
    bench_case(s, c, bf16, batch, ctx, 1, 128, "decode", cuda::MlaPlanOptions{.wgmma = 1});
    bench_case(s, c, bf16, batch, ctx, 1, 128, "decode", cuda::MlaPlanOptions{.diag = 1});
    bench_case(s, c, bf16, batch, ctx, 1, 128, "decode", cuda::MlaPlanOptions{.diag = 2});
    bench_case(s, c, bf16, batch, ctx, 1, 128, "decode", cuda::MlaPlanOptions{.multicast = 0});
    bench_case(s, c, bf16, batch, ctx, 1, 128, "decode", cuda::MlaPlanOptions{.wgmma = 0});
    bench_case(s, c, flash, batch, ctx, 1, 128, "decode");
    bench_case(s, c, bf16, batch, ctx, 2, 16, "verify");  // speculative verify: 2 tokens
    bench_case(s, c, bf16, 1, 32768, 1, 16, "decode");    // one long sequence: split-KV
    bench_case(s, c, flash, 1, 32768, 1, 16, "decode");
    bench_case(s, c, bf16, 1, 32768, 1, 16, "decode", mma);
  }
  if (what.find("prefill") != std::string::npos) {
    for (int heads : {16, 128}) {
      bench_case(s, c, bf16, 1, 8192, 8192, heads, "prefill");
      bench_case(s, c, bf16, 1, 8192, 8192, heads, "prefill", cuda::MlaPlanOptions{.wgmma = 1});
    }
  }
  BENCH_CUDA(cudaStreamDestroy(s));
  return 0;
}
