// MLA on the GPU (backend/cuda/mla_attention.h) against the CPU reference (issue 22), through the
// kernels' launchers on raw device buffers laid out as KvLayout says (the backend wiring is tested
// with the models).
//
// What must hold and the bounds:
//  - the latent KV write stores the CPU's bytes (backend/kv_format.cc encode_k_row) for every row
//    format: bf16, fp8 e4m3 / e5m2 plain rows with unit and non-unit scales, rope-split rows (bf16,
//    fp8 and f32 rope parts), FlashMLA rows (tile scales computed on the device), for the three
//    built dims (512 + 64, 128 + 32, 32 + 8), with values that saturate, underflow and zero tiles;
//  - absorbed attention over identical caches (each side's write, equal bytes as above) against
//    CpuBackend::mla_attention: NMSE < 1e-4 for every layout. Both read the same stored values; the
//    GPU rounds P to bf16 (relative 2^-9 a weight) and its output to bf16, and FlashMLA values
//    times their tile scale, and f32 rope values, to bf16 (the per-layer scales stay in float32):
//    each ~1e-6-1e-5 of NMSE. Odd shapes: page sizes 1, 3, 16, 64; contexts off page bounds; 1, 5,
//    8, 16, 128 heads; 1..5 new tokens a sequence (causal among them), ragged batches, chunks of
//    64-200 new tokens (the prefill path); forced split counts (with empty splits) and the
//    automatic plan; the decode kernel where it applies (512 + 64 rows but f32 rope parts; 8 and
//    16 rows a block; its three e4m3 conversions; L2 prefetch 0, 1, 2 (default) and 6 chunks ahead;
//    f16 Q, K, V and P over fp8 rows: P rounded to f16, relative 2^-11), the mma.sync kernel
//    everywhere (both bf16 pipelines: 48-key chunks in 3 stages, 64 in 2) and the wgmma kernel
//    where it applies. Outputs start as NaN: a row not written fails the bound;
//  - a launch captured into a CUDA graph and replayed gives the eager launch's bits.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/mla_attention.h"
#include "core/check.h"
#include "core/dtype.h"
#include "tree_masks.h"

namespace strata::testing {
namespace {

#define MLA_CUDA(expr)                                                            \
  do {                                                                            \
    const cudaError_t e_ = (expr);                                                \
    CHECK_MSG(e_ == cudaSuccess, "CUDA: {} ({})", cudaGetErrorString(e_), #expr); \
  } while (0)

// A device buffer freed on scope exit.
struct DevBuf {
  void* p = nullptr;
  size_t bytes = 0;
  explicit DevBuf(size_t n) : bytes(n) { MLA_CUDA(cudaMalloc(&p, std::max<size_t>(n, 16))); }
  ~DevBuf() { cudaFree(p); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
  template <typename T>
  static std::unique_ptr<DevBuf> of(const std::vector<T>& v) {
    auto b = std::make_unique<DevBuf>(v.size() * sizeof(T));
    MLA_CUDA(cudaMemcpy(b->p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return b;
  }
};

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = f32_to_bf16(v[i]);
  return out;
}

int num_sms() {
  int dev = 0, n = 0;
  MLA_CUDA(cudaGetDevice(&dev));
  MLA_CUDA(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
  return n;
}

void init_once() {
  static bool done = false;
  if (!done) cuda::init_mla_attention_kernels();
  done = true;
}

// A row format under test: the tested layer's dtype, optional rope dtype, FlashMLA, scale.
struct Fmt {
  const char* name;
  DType dtype;
  std::optional<DType> rope_dtype;
  bool flashmla;
  float scale;
};
const Fmt kFormats[] = {
    {"bf16", DType::kBF16, std::nullopt, false, 1.0f},
    {"e4m3", DType::kFP8E4M3, std::nullopt, false, 1.0f},
    {"e4m3 scale 0.37", DType::kFP8E4M3, std::nullopt, false, 0.37f},
    {"e5m2 scale 2.5", DType::kFP8E5M2, std::nullopt, false, 2.5f},
    {"e4m3 + bf16 rope, scale 0.37", DType::kFP8E4M3, DType::kBF16, false, 0.37f},
    {"e5m2 + e4m3 rope, scale 1.7", DType::kFP8E5M2, DType::kFP8E4M3, false, 1.7f},
    {"e4m3 + f32 rope", DType::kFP8E4M3, DType::kF32, false, 1.0f},
    {"fp8_flashmla", DType::kFP8E4M3, std::nullopt, true, 1.0f},
};

// Layer 1 of a two-layer layout is the one tested (layer 0 stays bf16: per-layer dtypes).
KvLayout make_layout(const Fmt& f, int latent, int rope, int64_t pages, int page_size) {
  KvLayout lay;
  lay.num_layers = 2;
  lay.num_pages = pages;
  lay.page_size = page_size;
  lay.k_dim = latent + rope;
  lay.dtype = f.dtype;
  lay.layer_dtypes = {DType::kBF16, f.dtype};
  lay.rope_dim = rope;
  lay.rope_dtype = f.rope_dtype;
  if (f.flashmla) lay.format = KvFormat::kFlashMlaFp8;
  return lay;
}

// One layer's cache on both sides, written by each side's writer from the same bf16 rows; the
// stored bytes compared.
struct Caches {
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  std::unique_ptr<KvStorage> kc;
  std::unique_ptr<DevBuf> gpu;
  cuda::MlaRowFormat fmt{};
  KvLayout lay;
  int64_t mismatched_bytes = 0;

  Caches(const Fmt& f, int latent, int rope, int64_t pages, int page_size,
         const std::vector<float>& rows, const std::vector<int32_t>& slots)
      : lay(make_layout(f, latent, rope, pages, page_size)) {
    const int64_t n = int64_t(slots.size()), width = latent + rope;
    kc = cpu->alloc_kv(lay);
    kc->set_scales(1, f.scale, 1.0f);
    fmt = cuda::mla_row_format(lay, 1, f.scale);
    EXPECT_EQ(fmt.row_bytes, lay.k_row_bytes(1));
    const int64_t bytes = pages * page_size * fmt.row_bytes;
    gpu = std::make_unique<DevBuf>(size_t(bytes));
    MLA_CUDA(cudaMemset(gpu->p, 0, size_t(bytes)));
    std::vector<int32_t> zeros(size_t(n), 0);
    const int32_t none[1] = {0};
    AttentionMetadata meta{.num_seqs = 0,
                           .num_tokens = int(n),
                           .page_size = page_size,
                           .q_indptr = none,
                           .kv_lens = none,
                           .page_indptr = none,
                           .page_indices = none,
                           .positions = zeros.data(),
                           .slot_mapping = slots.data()};
    Tensor host = Tensor::make(const_cast<float*>(rows.data()), DType::kF32, {n, width});
    auto k_cpu = cpu->upload(host, DType::kF32);
    cpu->kv_write(*kc, 1, *k_cpu, Tensor(), meta);
    auto src = DevBuf::of(to_bf16(rows));
    auto dslots = DevBuf::of(slots);
    cuda::MlaKvWriteParams wp{};
    wp.src = src->as<uint16_t>();
    wp.cache = gpu->p;
    wp.slots = dslots->as<int32_t>();
    wp.tokens = n;
    wp.src_stride = width;
    wp.fmt = fmt;
    cuda::launch_mla_kv_write(wp, nullptr);
    MLA_CUDA(cudaDeviceSynchronize());
    std::vector<char> got(static_cast<size_t>(bytes));
    MLA_CUDA(cudaMemcpy(got.data(), gpu->p, got.size(), cudaMemcpyDeviceToHost));
    const char* want = static_cast<const char*>(kc->k(1).data);
    for (size_t i = 0; i < got.size(); ++i) mismatched_bytes += got[i] != want[i];
  }
};

// Rows of `width` values: N(0, sd) rounded to bf16, with extremes sprinkled in when `extremes`.
std::vector<float> random_rows(int64_t n, int width, float sd, std::mt19937& rng, bool extremes) {
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<float> v(size_t(n * width));
  for (float& x : v) x = round_to_bf16(nd(rng));
  if (!extremes) return v;
  std::uniform_int_distribution<int64_t> pick(0, int64_t(v.size()) - 1);
  const float special[] = {0.0f, -0.0f, 1e4f, -3e5f, 1e-6f, -2e-9f, 448.0f, 57344.0f, 6e4f};
  for (int i = 0; i < int(v.size() / 50); ++i)
    v[size_t(pick(rng))] = round_to_bf16(special[i % 9] * sd);
  for (int64_t r = 0; r < n; r += 7)  // whole zero rows: zero FlashMLA tiles (scale 1)
    std::fill(v.begin() + r * width, v.begin() + r * width + std::min(width, 128), 0.0f);
  return v;
}

TEST(MlaAttention, KvWriteStoresTheCpuBytes) {
  std::mt19937 rng(3);
  const int dims[3][2] = {{512, 64}, {128, 32}, {32, 8}};
  for (const Fmt& f : kFormats) {
    for (const auto& d : dims) {
      const int page = 16, n = 300;
      const int64_t pages = (n + page - 1) / page + 3;
      std::vector<int32_t> slots(size_t(pages * page));
      std::iota(slots.begin(), slots.end(), 0);
      std::shuffle(slots.begin(), slots.end(), rng);
      slots.resize(n);
      auto rows = random_rows(n, d[0] + d[1], f.scale, rng, true);
      Caches c(f, d[0], d[1], pages, page, rows, slots);
      EXPECT_EQ(c.mismatched_bytes, 0) << f.name << " " << d[0] << "+" << d[1];
      std::printf("mla kv_write %-30s %3d+%-2d row %4lld bytes: %lld bytes differ from the CPU's\n",
                  f.name, d[0], d[1], (long long)c.fmt.row_bytes, (long long)c.mismatched_bytes);
    }
  }
  // Every finite bf16 value through the plain fp8 and bf16 encoders (512 + 64 rows).
  std::vector<float> all;
  for (uint32_t b = 0; b < 65536; ++b) {
    const float x = bf16_to_f32(uint16_t(b));
    all.push_back(std::isfinite(x) ? x : 0.0f);
  }
  const int64_t n = int64_t(all.size()) / 576 + 1;
  all.resize(size_t(n * 576), 1.0f);
  std::vector<int32_t> slots(static_cast<size_t>(n));
  std::iota(slots.begin(), slots.end(), 0);
  for (int i : {0, 2, 3, 4}) {
    Caches c(kFormats[i], 512, 64, n, 1, all, slots);
    EXPECT_EQ(c.mismatched_bytes, 0) << kFormats[i].name << " (all bf16 values)";
  }
}

struct Case {
  int latent = 512, rope = 64;
  int heads = 16;
  int page = 16;
  std::vector<std::pair<int, int>> seqs;  // (cached, new) tokens
  int wgmma = 2;                          // 2: the pipelined wgmma kernel, 1: the wgmma kernel
  int splits = 0;                         // 0: the plan's
  int max_splits = 0;                     // the plan's splits capped (CudaTunables::mla_max_splits)
  int decode_rows = 0;                    // the decode kernel's rows a block (0: the plan's)
  bool graph = false;                     // also replay the launch from a captured graph
  int bf16_chunk = 48;                    // the mma kernel's chunk for bf16 rows (48 or 64)
  int decode = 1;                         // allow the decode kernel
  int cvt = -1;                           // the decode kernel's e4m3 conversion (-1: default)
  bool spread = false;                    // rows scaled by e^U(-7, 2): FlashMLA tile scales of
                                          // keys four orders of magnitude apart
  int l2_prefetch = -1;                   // the decode kernel's L2 prefetch distance (-1: default)
  int row_groups = 1;                     // the decode kernel: rows copied in groups of 4 (where
                                          // the page size is a multiple of 4), of 8 (2; where it
                                          // is a multiple of 8) or one by one (0)
  int stages = 0;                         // the decode kernel's stages (0: as many as fit)
  bool trees = false;   // sequences of 2..64 new tokens are draft trees (random parents):
                        // AttentionMetadata::tree_mask
  int fused_merge = 0;  // the decode kernel merges up to this many splits itself (MlaPlanOptions)
  int multicast = 1;    // the pipelined kernel's row-tile pairs where they apply (MlaPlanOptions)
  int s_groups = 0;     // 0: the plan's default S form; 2 / 3: the decode kernel's 16-row blocks
                        // with two S groups by rows / by dims (MlaPlanOptions), and the case then
                        // expects the plan to take them (3: where the rows go through the V tile,
                        // else 2) and the bits of one group (3: its output within an NMSE of 1e-5)
};

// Rows the decode kernel copies at once for a plan and page size (mla_decode_layout.cuh
// row_group_log2).
int decode_group_rows(const cuda::MlaPlan& plan, int page) {
  if (plan.row_groups >= 2 && page % 8 == 0) return 8;
  return plan.row_groups >= 1 && page % 4 == 0 ? 4 : 1;
}

const char* kernel_name(const cuda::MlaPlan& plan) {
  switch (plan.kernel) {
    case cuda::kMlaWgmma:
      return "wgmma";
    case cuda::kMlaWgmmaPipe:
      return "wgmma-pipe";
    case cuda::kMlaDecode:
      return "decode";
    default:
      return "mma";
  }
}

double nmse(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num += double(got[i] - want[i]) * (got[i] - want[i]);
    den += double(want[i]) * want[i];
  }
  return num / den;
}

void run_attention(const Fmt& f, const Case& cs) {
  init_once();
  std::mt19937 rng(uint32_t(cs.heads * 131 + cs.page * 7 + cs.latent + int(cs.seqs.size())));
  const int R = cs.latent, W = cs.latent + cs.rope, H = cs.heads, page = cs.page;
  const int n = int(cs.seqs.size());
  std::vector<int32_t> q_indptr{0}, kv_lens, page_indptr{0}, pages, all_slots;
  int64_t total_pages = 0;
  int max_new = 0, max_kv = 0;
  for (auto [cached, fresh] : cs.seqs) total_pages += (cached + fresh + page - 1) / page;
  std::vector<int32_t> perm(size_t(total_pages + 2));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  int next = 0;
  for (auto [cached, fresh] : cs.seqs) {
    const int len = cached + fresh, np = (len + page - 1) / page;
    const size_t first = pages.size();
    for (int i = 0; i < np; ++i) pages.push_back(perm[size_t(next++)]);
    page_indptr.push_back(int32_t(pages.size()));
    kv_lens.push_back(len);
    q_indptr.push_back(q_indptr.back() + fresh);
    max_new = std::max(max_new, fresh);
    max_kv = std::max(max_kv, len);
    for (int j = 0; j < len; ++j)
      all_slots.push_back(pages[first + size_t(j / page)] * page + j % page);
  }
  const int t_new = q_indptr.back();
  auto rows = random_rows(int64_t(all_slots.size()), W, f.scale, rng, false);
  if (cs.spread) {
    std::uniform_real_distribution<float> u(-7.0f, 2.0f);
    for (size_t r = 0; r < all_slots.size(); ++r) {
      const float k = std::exp(u(rng));
      for (int i = 0; i < W; ++i) rows[r * W + i] = round_to_bf16(rows[r * W + i] * k);
    }
  }
  Caches c(f, cs.latent, cs.rope, int64_t(perm.size()), page, rows, all_slots);
  ASSERT_EQ(c.mismatched_bytes, 0) << f.name;

  // q_latent ~ N(0, 1) against rows of the scale's order; softmax scale of a 192-dim head.
  std::vector<float> q(size_t(t_new) * H * W);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (float& x : q) x = round_to_bf16(nd(rng) / f.scale);
  const float scale = float(1.0 / std::sqrt(192.0));
  std::vector<int32_t> positions(size_t(t_new), 0), slot_mapping(size_t(t_new), 0);
  AttentionMetadata meta{.num_seqs = n,
                         .num_tokens = t_new,
                         .page_size = page,
                         .q_indptr = q_indptr.data(),
                         .kv_lens = kv_lens.data(),
                         .page_indptr = page_indptr.data(),
                         .page_indices = pages.data(),
                         .positions = positions.data(),
                         .slot_mapping = slot_mapping.data()};
  const std::vector<uint64_t> tree =
      cs.trees ? parity::random_tree_mask(q_indptr, rng) : std::vector<uint64_t>();
  if (cs.trees) meta.tree_mask = tree.data();
  std::vector<float> want(size_t(t_new) * H * R);
  {
    Tensor qh = Tensor::make(q.data(), DType::kF32, {t_new, H, W});
    Tensor oh = Tensor::make(want.data(), DType::kF32, {t_new, H, R});
    const MlaArgs args{.scale = scale, .num_heads = H, .kv_lora_rank = R, .rope_dim = cs.rope};
    c.cpu->mla_attention(qh, *c.kc, 1, meta, args, oh);
  }

  auto dq = DevBuf::of(to_bf16(q));
  auto d_qi = DevBuf::of(q_indptr), d_kl = DevBuf::of(kv_lens), d_pi = DevBuf::of(page_indptr);
  auto d_pg = DevBuf::of(pages);
  auto d_tree = DevBuf::of(tree);
  DevBuf dout(size_t(t_new) * H * R * 2);
  cuda::MlaAttentionParams p{};
  p.q = dq->as<uint16_t>();
  p.cache = c.gpu->p;
  p.out = dout.as<uint16_t>();
  p.q_indptr = d_qi->as<int32_t>();
  p.kv_lens = d_kl->as<int32_t>();
  p.page_indptr = d_pi->as<int32_t>();
  p.page_indices = d_pg->as<int32_t>();
  p.tree_mask = cs.trees ? d_tree->as<uint64_t>() : nullptr;
  p.fmt = c.fmt;
  p.num_seqs = n;
  p.heads = H;
  p.q_stride = W;
  p.page_size = page;
  p.scale_log2 = scale * 1.4426950408889634f;
  p.copy_width = cuda::mla_copy_width(c.gpu->p, c.fmt.row_bytes);
  const cuda::MlaPlanOptions opt{
      .wgmma = cs.wgmma,
      .decode = cs.decode,
      .splits = cs.splits,
      .bf16_chunk = cs.bf16_chunk,
      .cvt = cs.cvt,
      .l2_prefetch = cs.l2_prefetch,
      .row_groups = cs.row_groups,
      .stages = cs.stages,
      .max_splits = cs.max_splits,
      .decode_rows = cs.decode_rows,
      .multicast = cs.multicast,
      .fused_merge = cs.fused_merge,
      .s_groups = cs.s_groups > 0 ? cs.s_groups : cuda::MlaPlanOptions{}.s_groups};
  const cuda::MlaPlan plan =
      cuda::plan_mla_attention(c.fmt, n, t_new, H, max_new, max_kv, num_sms(), opt);
  DevBuf scratch(size_t(plan.scratch_bytes));
  // The fused merge's counters start at zero and every launch must leave them so (checked below,
  // after the eager launch and after the graph replay).
  const std::vector<int32_t> zeros(size_t(std::max<int64_t>(plan.merge_counters, 1)), 0);
  auto counters = DevBuf::of(zeros);
  if (cs.fused_merge) {
    ASSERT_GT(plan.merge_counters, 0) << "the case must split its keys";
  }
  cuda::apply_mla_plan(plan, plan.scratch_bytes ? scratch.p : nullptr, &p, counters->as<int32_t>());
  auto counters_zero = [&] {
    std::vector<int32_t> now(zeros.size());
    MLA_CUDA(cudaMemcpy(now.data(), counters->p, now.size() * 4, cudaMemcpyDeviceToHost));
    return now == zeros;
  };
  MLA_CUDA(cudaMemset(dout.p, 0xff, dout.bytes));  // NaN: rows never written fail
  cuda::launch_mla_attention(p, nullptr);
  MLA_CUDA(cudaDeviceSynchronize());
  std::vector<uint16_t> raw(size_t(t_new) * H * R);
  MLA_CUDA(cudaMemcpy(raw.data(), dout.p, raw.size() * 2, cudaMemcpyDeviceToHost));
  std::vector<float> got(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) got[i] = bf16_to_f32(raw[i]);
  const double e = nmse(got, want);
  std::string shape;
  for (auto [cached, fresh] : cs.seqs)
    shape += " " + std::to_string(cached) + "+" + std::to_string(fresh);
  if (cs.trees) shape += " (trees)";
  std::printf(
      "mla attention %-28s %3d+%-2d heads %3d page %2d %-10s kernel (%2d rows, %d-key chunks, %d "
      "stages, cvt %d, prefetch %d, row group %d), %d split(s) of %d:%s: nmse %.3g\n",
      f.name, R, cs.rope, H, page, kernel_name(plan), plan.tile_rows, plan.chunk, plan.stages,
      plan.cvt, plan.l2_prefetch, decode_group_rows(plan, page), plan.num_splits, plan.split_len,
      shape.c_str(), e);
  EXPECT_LT(e, 1e-4) << "kernel " << kernel_name(plan) << " " << f.name << " heads " << H
                     << " page " << page << shape;
  EXPECT_TRUE(counters_zero()) << "the fused merge left a counter set";

  if (cs.s_groups >= 2) {  // two S groups: the plan took them, and one group gives the same bits
    const bool vtile = c.fmt.latent_elem == cuda::kMlaE4M3 && plan.cvt == cuda::kMlaCvtTile;
    EXPECT_EQ(plan.s_groups, cs.s_groups == 3 && vtile ? 3 : 2)
        << f.name << " heads " << H << shape;
    cuda::MlaAttentionParams one = p;
    one.s_groups = 1;
    MLA_CUDA(cudaMemset(dout.p, 0xff, dout.bytes));
    cuda::launch_mla_attention(one, nullptr);
    MLA_CUDA(cudaDeviceSynchronize());
    std::vector<uint16_t> ref(raw.size());
    MLA_CUDA(cudaMemcpy(ref.data(), dout.p, ref.size() * 2, cudaMemcpyDeviceToHost));
    size_t differ = 0;
    std::vector<float> ref_f(raw.size());
    for (size_t i = 0; i < raw.size(); ++i) {
      differ += raw[i] != ref[i];
      ref_f[i] = bf16_to_f32(ref[i]);
    }
    const double e1 = nmse(got, ref_f);
    std::printf(
        "mla attention %-28s S form %d against one group: %zu of %zu bf16 values differ, nmse "
        "%.3g\n",
        f.name, plan.s_groups, differ, raw.size(), e1);
    if (plan.s_groups == 2) EXPECT_EQ(differ, 0u) << f.name << " heads " << H << shape;
    EXPECT_LT(e1, 1e-5) << f.name << " heads " << H << shape;
    EXPECT_TRUE(counters_zero()) << "the fused merge left a counter set (one S group)";
  }

  if (cs.graph) {  // the same launch captured and replayed: the same bits
    cudaStream_t s;
    MLA_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    MLA_CUDA(cudaMemset(dout.p, 0xff, dout.bytes));
    MLA_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    cuda::launch_mla_attention(p, s);
    MLA_CUDA(cudaStreamEndCapture(s, &graph));
    MLA_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    MLA_CUDA(cudaGraphLaunch(exec, s));
    MLA_CUDA(cudaStreamSynchronize(s));
    std::vector<uint16_t> replay(raw.size());
    MLA_CUDA(cudaMemcpy(replay.data(), dout.p, replay.size() * 2, cudaMemcpyDeviceToHost));
    EXPECT_EQ(std::memcmp(replay.data(), raw.data(), raw.size() * 2), 0)
        << "graph replay, kernel " << kernel_name(plan);
    EXPECT_TRUE(counters_zero()) << "the fused merge left a counter set (graph replay)";
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(s);
  }
}

// Decode (one new token a sequence) and speculative-verify shapes over every layout, the real
// dims, the decode kernel where it applies (else the mma kernel): 16 heads (Moonlight / V2-Lite),
// 8 (Kimi tp8: 8-row blocks), 1; split-KV forced and automatic; page sizes 1, 16, 64; then the
// mma kernel on the same shapes.
TEST(MlaAttention, DecodeEveryLayout) {
  for (int decode : {1, 0}) {
    for (const Fmt& f : kFormats) {
      run_attention(f, {.heads = 16,
                        .page = 16,
                        .seqs = {{0, 1}, {16, 1}, {299, 1}, {1000, 1}},
                        .decode = decode});
      run_attention(
          f, {.heads = 8, .page = 64, .seqs = {{2100, 1}, {63, 1}}, .splits = 5, .decode = decode});
      run_attention(
          f, {.heads = 1, .page = 1, .seqs = {{130, 3}, {7, 2}}, .splits = 3, .decode = decode});
      run_attention(
          f, {.heads = 16, .page = 16, .seqs = {{500, 5}, {0, 4}, {77, 1}}, .decode = decode});
    }
  }
}

// The decode kernel's own split merge (MlaPlanOptions::fused_merge): the last split block of a
// tile merges the others' partials. Forced and planned splits (2 to 64: a lane weighs two), 8-
// and 16-row tiles, ragged batches with sequences shorter than their splits (empty splits weigh
// 0), a sequence with no keys before its token, bf16, e4m3 and FlashMLA rows, graph replay (the
// counters must be zero again after every launch).
TEST(MlaAttention, DecodeFusedMerge) {
  for (int i : {0, 2, 7}) {  // bf16, e4m3 with a scale, FlashMLA
    const Fmt& f = kFormats[i];
    run_attention(f, {.heads = 16,
                      .page = 16,
                      .seqs = {{0, 1}, {16, 1}, {299, 1}, {1000, 1}},
                      .graph = true,
                      .fused_merge = cuda::kMlaFusedMergeMaxSplits});
    run_attention(f, {.heads = 8,
                      .page = 64,
                      .seqs = {{2100, 1}, {63, 1}},
                      .splits = 5,
                      .graph = true,
                      .fused_merge = cuda::kMlaFusedMergeMaxSplits});
    run_attention(f, {.heads = 8,
                      .page = 64,
                      .seqs = {{4095, 1}},
                      .splits = 64,
                      .fused_merge = cuda::kMlaFusedMergeMaxSplits});
    run_attention(f, {.heads = 16,
                      .page = 64,
                      .seqs = {{767, 1}},
                      .decode_rows = 8,
                      .graph = true,
                      .fused_merge = cuda::kMlaFusedMergeMaxSplits});
    run_attention(f, {.heads = 16,
                      .page = 16,
                      .seqs = {{500, 5}, {0, 4}, {77, 1}},
                      .wgmma = 0,
                      .splits = 3,
                      .fused_merge = cuda::kMlaFusedMergeMaxSplits});
  }
}

// The plan's splits capped (CudaTunables::mla_max_splits): a Kimi-K2.5 rank's batch 1 (8 heads, a
// 4,096-token context) in 16 splits of 4 chunks instead of 64 of one, and a batch of two.
TEST(MlaAttention, DecodeCappedSplits) {
  const Fmt& bf16 = kFormats[0];
  const cuda::MlaRowFormat fmt = cuda::mla_row_format(make_layout(bf16, 512, 64, 64, 64), 1, 1.0f);
  const cuda::MlaPlan capped =
      cuda::plan_mla_attention(fmt, 1, 1, 8, 1, 4096, 132, {.max_splits = 16});
  EXPECT_EQ(capped.num_splits, 16);
  EXPECT_EQ(capped.split_len, 4 * capped.chunk);
  const cuda::MlaPlan plain = cuda::plan_mla_attention(fmt, 1, 1, 8, 1, 4096, 132);
  EXPECT_EQ(plain.num_splits, 4096 / plain.chunk);
  // CudaTunables::mla_min_split_chunks: two chunks a split (32 splits at 4,096 keys); a shorter
  // context keeps one chunk a split (kMlaSplitsKept); a long one stays split wide (132 blocks).
  const cuda::MlaPlan two =
      cuda::plan_mla_attention(fmt, 1, 1, 8, 1, 4096, 132, {.min_split_chunks = 2});
  EXPECT_EQ(two.num_splits, 32);
  EXPECT_EQ(two.split_len, 2 * two.chunk);
  EXPECT_EQ(cuda::plan_mla_attention(fmt, 1, 1, 8, 1, 768, 132, {.min_split_chunks = 2}).num_splits,
            12);
  EXPECT_GE(
      cuda::plan_mla_attention(fmt, 1, 1, 8, 1, 32768, 132, {.min_split_chunks = 2}).num_splits,
      128);
  for (int cap : {16, 3})
    for (const Fmt* f : {&bf16, &kFormats[std::size(kFormats) - 1]}) {
      run_attention(*f, {.heads = 8, .page = 64, .seqs = {{4095, 1}}, .max_splits = cap});
      run_attention(*f,
                    {.heads = 16, .page = 16, .seqs = {{1000, 1}, {299, 1}}, .max_splits = cap});
    }
}

// The decode kernel in blocks of 8 query rows where the plan would take 16
// (CudaTunables::mla_decode_rows): 16 heads (Moonlight at batch 1) in two row tiles, 5 heads of 4
// new tokens (20 rows: three tiles, the last short), every row layout.
TEST(MlaAttention, DecodeEightRowTiles) {
  const cuda::MlaRowFormat fmt =
      cuda::mla_row_format(make_layout(kFormats[0], 512, 64, 64, 64), 1, 1.0f);
  EXPECT_EQ(cuda::plan_mla_attention(fmt, 1, 1, 16, 1, 768, 132, {.decode_rows = 8}).row_tiles, 2);
  EXPECT_EQ(cuda::plan_mla_attention(fmt, 1, 1, 16, 1, 768, 132).row_tiles, 1);
  // Auto (-1, the tunable's default): 8-row blocks where 16-row ones of one chunk each leave SMs
  // idle (1 x 12 < 132), 16-row ones where they do not (16 x 12 >= 132).
  EXPECT_EQ(cuda::plan_mla_attention(fmt, 1, 1, 16, 1, 768, 132, {.decode_rows = -1}).row_tiles, 2);
  EXPECT_EQ(cuda::plan_mla_attention(fmt, 16, 16, 16, 1, 768, 132, {.decode_rows = -1}).row_tiles,
            1);
  for (const Fmt& f : kFormats) {
    run_attention(f, {.heads = 16, .page = 16, .seqs = {{767, 1}}, .decode_rows = 8});
    run_attention(f, {.heads = 5, .page = 16, .seqs = {{300, 4}, {40, 1}}, .decode_rows = 8});
  }
}

// The decode kernel's three e4m3 conversions (integer ops, the conversion unit in the S warps,
// in both) over plain e4m3 and FlashMLA rows, 16 rows a block (8 rows: the default only), also
// with rows of very different sizes (FlashMLA: tile scales of one chunk's keys far apart, the P
// rescaling by the chunk's largest; plain e4m3: subnormal and saturated codes).
TEST(MlaAttention, DecodeConversions) {
  for (int i : {2, 7}) {
    for (int cvt : {cuda::kMlaCvtInt, cuda::kMlaCvtHwS, cuda::kMlaCvtHw}) {
      run_attention(kFormats[i],
                    {.heads = 16, .page = 16, .seqs = {{700, 1}, {64, 1}, {5, 1}}, .cvt = cvt});
      run_attention(
          kFormats[i],
          {.heads = 4, .page = 3, .seqs = {{300, 4}}, .splits = 2, .cvt = cvt, .spread = true});
    }
    run_attention(kFormats[i], {.heads = 8, .page = 64, .seqs = {{400, 1}}, .spread = true});
  }
}

// The decode kernel's V tile (kMlaCvtTile: each e4m3 value converted once, by the S warps, into a
// shared f16 tile the PV warps read; 2 stages, freed by the S warps): plain e4m3 (scaled, with a
// bf16 rope part) and FlashMLA rows; 16, 8 and 5 heads; the three stage layouts; contexts ending
// inside a group and a chunk; splits ending mid-chunk; several new tokens; rows of very different
// sizes (FlashMLA tile scales four orders of magnitude apart).
TEST(MlaAttention, DecodeVTile) {
  constexpr int kTile = cuda::kMlaCvtTile;
  for (int i : {1, 2, 4, 7}) {
    for (int groups : {2, 1, 0}) {
      run_attention(kFormats[i], {.heads = 16,
                                  .page = 16,
                                  .seqs = {{1001, 1}, {64, 1}, {5, 1}},
                                  .cvt = kTile,
                                  .row_groups = groups});
      run_attention(kFormats[i], {.heads = 8,
                                  .page = 64,
                                  .seqs = {{2047, 1}, {190, 2}},
                                  .splits = 3,
                                  .cvt = kTile,
                                  .row_groups = groups});
    }
    run_attention(kFormats[i], {.heads = 5,
                                .page = 3,
                                .seqs = {{300, 4}, {0, 1}},
                                .splits = 2,
                                .cvt = kTile,
                                .spread = true});
    run_attention(kFormats[i],
                  {.heads = 16, .page = 8, .seqs = {{4100, 1}}, .cvt = kTile, .spread = true});
  }
}

// The decode kernel's 16-row blocks with two groups of S warps (MlaPlanOptions::s_groups, 12 warps
// a block), by rows and by dims, against the CPU twin and against one group (by rows: bit for bit):
// bf16 (by dims: falls back to rows), plain e4m3 through the V tile and FlashMLA rows; 16 heads
// (Moonlight's batch 64 shape), 12 and 9 (the second group's rows partly or mostly past the tile's
// end), several new tokens a sequence (rows of two tokens in one tile), draft trees, the three
// stage layouts, splits with the kernel's own merge (its 384 threads) and with the merge kernel,
// rows of very different sizes, a graph replay. Formats and tile sizes the groups do not apply to
// keep one (the plan says so).
TEST(MlaAttention, DecodeSGroups) {
  for (int sg : {2, 3})
    for (int i : {0, 2, 4, 7}) {
      const Fmt& f = kFormats[i];
      for (int groups : {1, 2, 0})
        run_attention(f, {.heads = 16,
                          .page = 16,
                          .seqs = {{1001, 1}, {64, 1}, {5, 1}, {0, 1}},
                          .row_groups = groups,
                          .s_groups = sg});
      run_attention(f, {.heads = 16,
                        .page = 64,
                        .seqs = {{4095, 1}, {767, 1}},
                        .splits = 4,
                        .graph = true,
                        .fused_merge = cuda::kMlaFusedMergeMaxSplits,
                        .s_groups = sg});
      run_attention(f, {.heads = 16, .page = 16, .seqs = {{2000, 1}}, .splits = 3, .s_groups = sg});
      run_attention(f, {.heads = 12, .page = 3, .seqs = {{300, 1}, {40, 1}}, .s_groups = sg});
      run_attention(f, {.heads = 9,
                        .page = 16,
                        .seqs = {{300, 1}, {0, 1}},
                        .splits = 2,
                        .spread = true,
                        .s_groups = sg});
      run_attention(f, {.heads = 4, .page = 16, .seqs = {{500, 4}, {70, 3}}, .s_groups = sg});
      run_attention(
          f, {.heads = 2, .page = 8, .seqs = {{200, 8}, {33, 6}}, .trees = true, .s_groups = sg});
    }
  // Where they do not apply: 8-row blocks, several row tiles a sequence, e5m2 rows, e4m3 rows
  // without the V tile.
  const cuda::MlaRowFormat bf16 =
      cuda::mla_row_format(make_layout(kFormats[0], 512, 64, 64, 64), 1, 1.0f);
  const cuda::MlaRowFormat e5m2 =
      cuda::mla_row_format(make_layout(kFormats[3], 512, 64, 64, 64), 1, 1.0f);
  const cuda::MlaRowFormat e4m3 =
      cuda::mla_row_format(make_layout(kFormats[1], 512, 64, 64, 64), 1, 1.0f);
  EXPECT_EQ(cuda::plan_mla_attention(bf16, 64, 64, 16, 1, 4096, 132, {.s_groups = 2}).s_groups, 2);
  EXPECT_EQ(cuda::plan_mla_attention(bf16, 64, 64, 16, 1, 4096, 132, {.s_groups = 3}).s_groups, 2);
  EXPECT_EQ(cuda::plan_mla_attention(e4m3, 64, 64, 16, 1, 4096, 132, {.s_groups = 3}).s_groups, 3);
  EXPECT_EQ(cuda::plan_mla_attention(bf16, 64, 64, 16, 1, 4096, 132).s_groups, 2);  // default
  EXPECT_EQ(cuda::plan_mla_attention(bf16, 64, 64, 16, 1, 4096, 132, {.s_groups = 1}).s_groups, 1);
  EXPECT_EQ(cuda::plan_mla_attention(bf16, 64, 64, 8, 1, 4096, 132, {.s_groups = 2}).s_groups, 1);
  // More than one row tile a sequence (fp8_flashmla's 128 heads: the decode kernel) keeps one.
  const cuda::MlaRowFormat flash =
      cuda::mla_row_format(make_layout(kFormats[7], 512, 64, 64, 64), 1, 1.0f);
  EXPECT_EQ(cuda::plan_mla_attention(flash, 64, 64, 16, 1, 4096, 132).s_groups, 2);
  EXPECT_EQ(cuda::plan_mla_attention(flash, 64, 64, 128, 1, 4096, 132).s_groups, 1);
  EXPECT_EQ(cuda::plan_mla_attention(e5m2, 64, 64, 16, 1, 4096, 132, {.s_groups = 2}).s_groups, 1);
  EXPECT_EQ(cuda::plan_mla_attention(e4m3, 64, 64, 16, 1, 4096, 132,
                                     {.cvt = cuda::kMlaCvtHwS, .s_groups = 2})
                .s_groups,
            1);
}

// The pipelined kernel's row-tile pairs (128 heads, one new token a sequence, pages of a multiple
// of 16: a cluster of 2 CTAs fed by multicast TMA copies, boxes of 16 / 32 / 64 slots) against the
// CPU twin, with and without them: contexts that end inside a chunk (the rows past the end
// zeroed in shared memory; the batch's last sequence ends a box before its chunk does, where its
// page table has no entry), a sequence of one key, splits, a graph replay.
TEST(MlaAttention, RowTilePairs) {
  for (int mc : {1, 0}) {
    run_attention(kFormats[0], {.heads = 128,
                                .page = 16,
                                .seqs = {{1500, 1}, {63, 1}, {0, 1}, {127, 1}, {40, 1}},
                                .multicast = mc});
    run_attention(
        kFormats[0],
        {.heads = 128, .page = 64, .seqs = {{700, 1}, {129, 1}}, .splits = 4, .multicast = mc});
    run_attention(
        kFormats[0],
        {.heads = 128, .page = 32, .seqs = {{333, 1}, {64, 1}}, .splits = 3, .multicast = mc});
    run_attention(kFormats[0],
                  {.heads = 128, .page = 48, .seqs = {{200, 1}}, .graph = true, .multicast = mc});
  }
}

// 128 heads (DeepSeek-V3 at tp 1): both wgmma kernels (bf16), the decode kernel (8 row tiles a
// token) and the mma kernel.
TEST(MlaAttention, ManyHeads) {
  for (int wgmma : {2, 1}) {
    run_attention(kFormats[0],
                  {.heads = 128, .page = 16, .seqs = {{1500, 1}, {40, 1}, {0, 2}}, .wgmma = wgmma});
    run_attention(kFormats[0],
                  {.heads = 128, .page = 64, .seqs = {{700, 3}}, .wgmma = wgmma, .splits = 4});
  }
  run_attention(kFormats[0], {.heads = 128, .page = 1, .seqs = {{129, 1}, {300, 2}}, .wgmma = 0});
  run_attention(kFormats[0],
                {.heads = 128, .page = 1, .seqs = {{129, 1}, {300, 2}}, .wgmma = 0, .decode = 0});
  for (int i : {1, 5, 7}) {
    run_attention(kFormats[i], {.heads = 128, .page = 16, .seqs = {{900, 2}, {5, 1}}});
    run_attention(kFormats[i], {.heads = 128, .page = 16, .seqs = {{900, 2}}, .decode = 0});
  }
}

// Long new chunks (the absorbed prefill path), causal over earlier pages: 16, 5 and 3 heads, the
// pipelined wgmma kernel for bf16 (>= 64 rows; the wgmma kernel once), the decode or mma kernel
// for the rest.
TEST(MlaAttention, Chunks) {
  run_attention(kFormats[0], {.heads = 16, .page = 16, .seqs = {{0, 200}, {300, 70}}, .wgmma = 1});
  run_attention(kFormats[0], {.heads = 3, .page = 1, .seqs = {{2000, 50}, {0, 30}}});
  for (int i : {0, 1, 7}) {
    run_attention(kFormats[i], {.heads = 16, .page = 16, .seqs = {{0, 200}, {300, 70}, {5, 1}}});
    run_attention(kFormats[i], {.heads = 16, .page = 64, .seqs = {{1000, 65}}, .splits = 3});
  }
  run_attention(kFormats[0], {.heads = 16, .page = 16, .seqs = {{0, 130}}, .wgmma = 0});
  run_attention(kFormats[0],
                {.heads = 16, .page = 16, .seqs = {{0, 130}}, .wgmma = 0, .decode = 0});
  run_attention(kFormats[7], {.heads = 16, .page = 16, .seqs = {{0, 130}}, .decode = 0});
  run_attention(kFormats[0], {.heads = 5, .page = 3, .seqs = {{10, 90}, {0, 13}}});
}

// The mma kernel's other bf16 pipeline (64-key chunks, 2 stages).
TEST(MlaAttention, Bf16Chunk64) {
  run_attention(kFormats[0], {.heads = 16,
                              .page = 16,
                              .seqs = {{0, 1}, {700, 1}, {90, 3}},
                              .splits = 3,
                              .bf16_chunk = 64,
                              .decode = 0});
  run_attention(
      kFormats[0],
      {.latent = 128, .rope = 32, .heads = 5, .page = 1, .seqs = {{200, 2}}, .bf16_chunk = 64});
  run_attention(
      kFormats[0],
      {.heads = 128, .page = 64, .seqs = {{300, 1}}, .wgmma = 0, .bf16_chunk = 64, .decode = 0});
}

// The small dims: house-mla (128 + 32, 5 heads) and the tiny fixtures (32 + 8, 4 heads).
TEST(MlaAttention, SmallDims) {
  for (const Fmt& f : kFormats) {
    run_attention(
        f, {.latent = 128, .rope = 32, .heads = 5, .page = 3, .seqs = {{40, 1}, {0, 5}, {333, 2}}});
    run_attention(f, {.latent = 32,
                      .rope = 8,
                      .heads = 4,
                      .page = 1,
                      .seqs = {{70, 1}, {0, 9}, {128, 3}},
                      .splits = 2});
  }
}

// The decode kernel's L2 prefetch (every other test runs the default distance): none (the kernel
// before it), one chunk, and farther than most splits have chunks; page sizes whose runs start
// inside a chunk (3), end the chunk (64) and are single rows (1), splits ending mid-chunk. The
// prefetch changes no value: the same bound; a bad prefetch address would fault the launch.
TEST(MlaAttention, DecodeL2Prefetch) {
  for (int i : {0, 2, 7}) {
    for (int d : {0, 1, 6}) {
      run_attention(kFormats[i], {.heads = 16,
                                  .page = 3,
                                  .seqs = {{1000, 1}, {130, 1}, {0, 1}},
                                  .splits = 3,
                                  .l2_prefetch = d});
      run_attention(kFormats[i],
                    {.heads = 8, .page = 64, .seqs = {{2100, 1}, {640, 2}}, .l2_prefetch = d});
      run_attention(kFormats[i], {.heads = 16, .page = 1, .seqs = {{700, 1}}, .l2_prefetch = d});
    }
  }
}

// The decode kernel's three stage layouts (mla_decode_layout.cuh StageLayout): rows copied in
// groups of 8 consecutive slots (row_groups 2, tile t taking keys 8 (m % 8) + 4 (m / 8) + t) or of
// 4 (row_groups 1, keys 4m + t; every other test with a page size that is a multiple of 4), and
// one row a copy (keys 16 t + m; page sizes 1 and 3 elsewhere; here forced). Page sizes 4, 12 (3
// groups of 4 a page; groups of 8 fall back to 4), 8, 16, 24 (3 groups of 8 a page), 64; contexts
// ending inside a group, inside a chunk, on a page bound; splits that end mid-chunk; 5, 8 and 16
// heads; 2 and 3 stages (the stage ring wrapping at other chunks).
TEST(MlaAttention, DecodeRowGroups) {
  for (int i : {0, 1, 4, 7}) {
    for (int groups : {2, 1, 0}) {
      run_attention(kFormats[i], {.heads = 16,
                                  .page = 4,
                                  .seqs = {{1001, 1}, {130, 1}, {2, 1}, {63, 1}},
                                  .row_groups = groups});
      run_attention(
          kFormats[i],
          {.heads = 5, .page = 12, .seqs = {{777, 3}, {0, 2}}, .splits = 4, .row_groups = groups});
      run_attention(kFormats[i],
                    {.heads = 16, .page = 16, .seqs = {{4095, 1}, {66, 1}}, .row_groups = groups});
      run_attention(kFormats[i], {.heads = 8,
                                  .page = 64,
                                  .seqs = {{2047, 1}, {64, 1}, {190, 2}},
                                  .splits = 3,
                                  .row_groups = groups});
      run_attention(kFormats[i], {.heads = 16,
                                  .page = 8,
                                  .seqs = {{1003, 1}, {7, 1}, {72, 1}},
                                  .row_groups = groups,
                                  .stages = 2});
      run_attention(kFormats[i], {.heads = 5,
                                  .page = 24,
                                  .seqs = {{599, 2}, {23, 1}},
                                  .splits = 3,
                                  .row_groups = groups,
                                  .stages = 3});
    }
  }
}

// Draft trees (speculative verify with EAGLE topk > 1): each tree row sees the committed keys and
// its ancestors only. Every layout on the decode kernel (few rows) and the mma kernel; bf16 on both
// wgmma kernels (>= 64 rows); split-KV forced, so splits inside the new tokens see no key of a row.
TEST(MlaAttention, DraftTrees) {
  for (int decode : {1, 0}) {
    for (const Fmt& f : kFormats) {
      run_attention(f, {.heads = 16,
                        .page = 16,
                        .seqs = {{300, 8}, {0, 1}, {40, 5}, {1000, 1}},
                        .decode = decode,
                        .trees = true});
      run_attention(f, {.heads = 8,
                        .page = 1,
                        .seqs = {{130, 9}, {7, 2}},
                        .splits = 3,
                        .decode = decode,
                        .trees = true});
    }
  }
  for (int wgmma : {2, 1}) {
    run_attention(kFormats[0], {.heads = 16,
                                .page = 16,
                                .seqs = {{700, 64}, {3, 10}, {0, 70}},
                                .wgmma = wgmma,
                                .trees = true});
    run_attention(kFormats[0], {.heads = 128,
                                .page = 64,
                                .seqs = {{900, 6}, {50, 16}},
                                .wgmma = wgmma,
                                .splits = 4,
                                .trees = true});
  }
  run_attention(kFormats[0], {.heads = 16,
                              .page = 16,
                              .seqs = {{700, 64}, {3, 10}},
                              .wgmma = 0,
                              .decode = 0,
                              .trees = true});
}

TEST(MlaAttention, GraphReplay) {
  run_attention(kFormats[0], {.heads = 16, .page = 16, .seqs = {{600, 1}, {30, 1}}, .graph = true});
  run_attention(kFormats[0],
                {.heads = 16, .page = 16, .seqs = {{600, 1}}, .graph = true, .decode = 0});
  run_attention(kFormats[7],
                {.heads = 8, .page = 64, .seqs = {{600, 2}}, .splits = 4, .graph = true});
  run_attention(kFormats[0], {.heads = 128, .page = 16, .seqs = {{300, 1}}, .graph = true});
  run_attention(kFormats[0],
                {.heads = 128, .page = 16, .seqs = {{300, 1}}, .wgmma = 1, .graph = true});
}

}  // namespace
}  // namespace strata::testing
