// The MLA attention parity tests' shared pieces (mla_attention_cases.h).
#include "mla_attention_cases.h"

namespace strata::testing::mla_parity {

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

Caches::Caches(const Fmt& f, int latent, int rope, int64_t pages, int page_size,
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

}  // namespace strata::testing::mla_parity
