// Decode context parallelism's CUDA ops (backend/dcp_attention.h, backend/cuda/mla_dcp.cu) against
// the CPU reference's, with the N ranks of a DCP group simulated on one GPU: each rank's own KV
// storage holds its shard (arch/dcp.h's layout, written through DcpLocalBatch as the model does:
// token t on rank t mod N at local index t div N of the same page ids), and one storage beside
// them holds every token (the non-DCP cache of the same pages).
//
// What must hold, for N = 2, 4, 8, every KV layout below and the tiny fixtures' (32 + 8, 4
// heads), house-mla's (128 + 32, 5 heads) and the real models' (512 + 64, 16 heads) dims, decode
// (one new token over contexts of 1-1,000 keys: split-KV, empty splits), prefill (37-64 new
// tokens over 0-130 cached ones: the first tokens of a fresh sequence see nothing on ranks past
// their position, causal by absolute position) and a long prefill (2 x 400 fresh tokens: rows
// enough for one key split, the partials kept only for the log-sum-exp):
//  - each rank's partial (CudaBackend::mla_attention_partial) against the CPU's for the same
//    shard: outputs NMSE < 1e-4 (the MLA kernels' bound: bf16 P and q), log-sum-exps within 4e-3
//    absolute (P rounded to bf16 changes a row's sum by at most 2^-9 relative, ln of that < 2e-3;
//    the scores themselves agree to float32 rounding where the kernels read exact values), 1.5e-2
//    for FlashMLA rows (the mma kernel rounds latent x tile scale to bf16: 2^-9 relative a value,
//    which moves a score of 128 latent dims by ~1e-3 rms, and a row that sees one key has that
//    score as its log-sum-exp), and -inf exactly where the CPU's is (a row that sees no key of
//    the shard);
//  - the merge kernel alone (the CPU's partials merged on the GPU into float32) against the CPU's
//    merge (double): NMSE < 1e-10 (float32 sums of a handful of parts), into fewer heads than
//    the parts have (the padded heads of an uneven split);
//  - the GPU merge of the GPU partials (bf16, as the model runs it) against full CUDA attention
//    over all tokens (CudaBackend::mla_attention on the non-DCP cache) and against the CPU's:
//    NMSE < 1e-4 each;
//  - none of it runs on the CPU twin (mla_attention fallbacks stay 0).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "arch/dcp.h"
#include "parity/mla_sequences.h"
#include "parity/op_pair.h"
#include "support/golden.h"

namespace strata::testing {
namespace {

using parity::Pair;

struct Format {
  const char* name;
  DType dtype;
  std::optional<DType> rope_dtype;
  bool flashmla;
  float scale;
  double lse_bound;  // the partials' log-sum-exps against the CPU's (see above)
};
const Format kFormats[] = {
    {"bf16", DType::kBF16, std::nullopt, false, 1.0f, 4e-3},
    {"e4m3 scale 0.37", DType::kFP8E4M3, std::nullopt, false, 0.37f, 4e-3},
    {"e4m3 + bf16 rope, scale 0.5", DType::kFP8E4M3, DType::kBF16, false, 0.5f, 4e-3},
    {"fp8_flashmla", DType::kFP8E4M3, std::nullopt, true, 1.0f, 1.5e-2},
};

// Sequences on N simulated ranks and one full cache, on both backends. The engine's page holds
// page · N tokens (the pool's page is `page` on every rank), the same page ids on every rank.
class DcpShards {
 public:
  DcpShards(Pair& p, const Format& f, const MlaDims& d, int n, int page,
            const std::vector<int>& capacity)
      : p_(p), f_(f), d_(d), n_(n), page_(page), seqs_(p.rng(), page * n, capacity) {
    const int engine_page = page * n;
    KvLayout lay;
    lay.num_layers = 1;
    lay.num_pages = seqs_.num_pages();
    lay.page_size = page;
    lay.k_dim = d.latent + d.rope;
    lay.dtype = f.dtype;
    lay.rope_dim = d.rope;
    lay.rope_dtype = f.rope_dtype;
    if (f.flashmla) lay.format = KvFormat::kFlashMlaFp8;
    const Status st = p.gpu_->check_kv_layout(lay);
    EXPECT_TRUE(st.ok()) << f.name << ": " << st.message();
    for (int r = 0; r < n; ++r) {
      cpu_.push_back(p.cpu_->alloc_kv(lay));
      gpu_.push_back(p.gpu_->alloc_kv(lay));
    }
    KvLayout full = lay;
    full.page_size = engine_page;
    cpu_full_ = p.cpu_->alloc_kv(full);
    gpu_full_ = p.gpu_->alloc_kv(full);
    for (auto* kv : {&cpu_, &gpu_})
      for (auto& s : *kv) s->set_scales(0, f.scale, 1.0f);
    cpu_full_->set_scales(0, f.scale, 1.0f);
    gpu_full_->set_scales(0, f.scale, 1.0f);
  }

  struct Errors {
    double partial_nmse = 0, lse_abs = 0;  // worst over the ranks
    int64_t lse_inf_mismatch = 0, empty_rows = 0;
    double merge_kernel_nmse = 0, merged_vs_gpu_full = 0, merged_vs_cpu_full = 0;
  };

  // Appends fresh[s] tokens to sequence s on every rank (each its own) and the full caches; with
  // `attend`, then the ops on the new tokens.
  Errors step(const std::vector<int>& fresh, bool attend) {
    const int width = d_.latent + d_.rope, heads = d_.heads, R = d_.latent;
    const AttentionMetadata& meta = seqs_.grow(fresh);
    const int t = meta.num_tokens;
    const std::vector<float> rows = p_.random(int64_t(t) * width, f_.scale);
    {
      auto all = p_.make(rows, {t, width});
      p_.cpu_->kv_write(*cpu_full_, 0, *all.cpu, Tensor(), meta);
      p_.gpu_->kv_write(*gpu_full_, 0, *all.gpu, Tensor(), meta);
    }
    std::vector<DcpLocalBatch> local(static_cast<size_t>(n_));
    for (int r = 0; r < n_; ++r) {
      DcpLocalBatch& l = local[size_t(r)];
      l.build(meta, DcpShard{.rank = r, .size = n_}, page_);
      if (l.owned_rows.empty()) continue;
      std::vector<float> mine;
      for (int32_t row : l.owned_rows)
        mine.insert(mine.end(), rows.begin() + int64_t(row) * width,
                    rows.begin() + int64_t(row + 1) * width);
      auto owned = p_.make(mine, {int64_t(l.owned_rows.size()), width});
      p_.cpu_->kv_write(*cpu_[size_t(r)], 0, *owned.cpu, Tensor(), l.write);
      p_.gpu_->kv_write(*gpu_[size_t(r)], 0, *owned.gpu, Tensor(), l.write);
    }
    Errors e;
    if (!attend) return e;

    const MlaArgs args{.scale = float(1.0 / std::sqrt(192.0)),
                       .num_heads = heads,
                       .kv_lora_rank = R,
                       .rope_dim = d_.rope};
    auto q = p_.make(p_.random(int64_t(t) * heads * width, 1.0f / f_.scale), {t, heads, width});
    const Shape parts_shape{n_, t, heads, R + 1};
    std::vector<float> nan(size_t(shape_numel(parts_shape)), NAN);
    auto parts = p_.make(nan, parts_shape, DType::kF32);
    for (int r = 0; r < n_; ++r) {
      const DcpShard shard{.rank = r, .size = n_};
      auto slice = [&](const DeviceTensorPtr& x) {
        return x->view().slice_rows(r, r + 1).reshape({t, heads, R + 1});
      };
      dcp_ops(*p_.cpu_).mla_attention_partial(*q.cpu, *cpu_[size_t(r)], 0, local[size_t(r)].attn,
                                              args, shard, slice(parts.cpu));
      dcp_ops(*p_.gpu_).mla_attention_partial(*q.gpu, *gpu_[size_t(r)], 0, local[size_t(r)].attn,
                                              args, shard, slice(parts.gpu));
    }
    const std::vector<float> pc = p_.get(*parts.cpu, false), pg = p_.get(*parts.gpu, true);
    // Per rank: the outputs' NMSE and the log-sum-exps.
    const int64_t rows_per_rank = int64_t(t) * heads;
    for (int r = 0; r < n_; ++r) {
      std::vector<float> oc, og;
      for (int64_t i = 0; i < rows_per_rank; ++i) {
        const int64_t at = (r * rows_per_rank + i) * (R + 1);
        oc.insert(oc.end(), pc.begin() + at, pc.begin() + at + R);
        og.insert(og.end(), pg.begin() + at, pg.begin() + at + R);
        const float lc = pc[size_t(at + R)], lg = pg[size_t(at + R)];
        if (lc == -INFINITY || lg == -INFINITY) {
          e.empty_rows += lc == -INFINITY;
          e.lse_inf_mismatch += lc != lg;
        } else {
          e.lse_abs = std::max(e.lse_abs, std::isfinite(lg) ? double(std::fabs(lg - lc)) : 1e30);
        }
      }
      e.partial_nmse = std::max(e.partial_nmse, nmse(og, oc));
    }
    // The merge kernel alone: the CPU's partials on the GPU, into float32, one head fewer.
    const int out_heads = std::max(1, heads - 1);
    {
      auto cpu_parts = p_.gpu_->upload(parts.cpu->view(), DType::kF32);
      auto got = p_.gpu_->alloc(DType::kF32, {t, out_heads, R});
      auto want = p_.cpu_->alloc(DType::kF32, {t, out_heads, R});
      dcp_ops(*p_.gpu_).merge_attention_partials(*cpu_parts, *got);
      dcp_ops(*p_.cpu_).merge_attention_partials(*parts.cpu, *want);
      e.merge_kernel_nmse = nmse(p_.get(*got, true), p_.get(*want, false));
    }
    // The model's path: the GPU partials merged into bf16, against full attention.
    auto merged = p_.gpu_->alloc(DType::kBF16, {t, heads, R});
    dcp_ops(*p_.gpu_).merge_attention_partials(*parts.gpu, *merged);
    auto full = p_.out({t, heads, R});
    p_.cpu_->mla_attention(*q.cpu, *cpu_full_, 0, meta, args, *full.cpu);
    p_.gpu_->mla_attention(*q.gpu, *gpu_full_, 0, meta, args, *full.gpu);
    const std::vector<float> m = p_.get(*merged, true);
    e.merged_vs_gpu_full = nmse(m, p_.get(*full.gpu, true));
    e.merged_vs_cpu_full = nmse(m, p_.get(*full.cpu, false));
    return e;
  }

 private:
  static DcpAttention& dcp_ops(Backend& b) {
    DcpAttention* ops = dcp_attention(b);
    CHECK_MSG(ops != nullptr, "{} has no DCP ops", b.name());
    return *ops;
  }

  Pair& p_;
  const Format& f_;
  const MlaDims d_;
  const int n_, page_;
  GrowingSequences seqs_;  // pages of page_ · n_ tokens (the engine's)
  std::vector<std::unique_ptr<KvStorage>> cpu_, gpu_;
  std::unique_ptr<KvStorage> cpu_full_, gpu_full_;
};

void check(const char* what, const Format& f, const MlaDims& d, int n, const DcpShards::Errors& e) {
  std::printf(
      "mla dcp %-7s N %d %-28s %3d+%-2d heads %2d: partial nmse %.3g, lse max abs %.3g (%lld "
      "empty rows), merge kernel nmse %.3g, merged vs full: cuda %.3g cpu %.3g\n",
      what, n, f.name, d.latent, d.rope, d.heads, e.partial_nmse, e.lse_abs,
      (long long)e.empty_rows, e.merge_kernel_nmse, e.merged_vs_gpu_full, e.merged_vs_cpu_full);
  EXPECT_LT(e.partial_nmse, 1e-4);
  EXPECT_LT(e.lse_abs, f.lse_bound);
  EXPECT_EQ(e.lse_inf_mismatch, 0);
  EXPECT_LT(e.merge_kernel_nmse, 1e-10);
  EXPECT_LT(e.merged_vs_gpu_full, 1e-4);
  EXPECT_LT(e.merged_vs_cpu_full, 1e-4);
}

TEST(MlaDcp, ShardPartialsAndMergeMatchTheCpuAndFullAttention) {
  Pair p;
  for (int n : {2, 4, 8}) {
    for (const MlaDims& d : kMlaDims) {
      for (const Format& f : kFormats) {
        SCOPED_TRACE(std::string(f.name) + " " + std::to_string(d.latent) + "+" +
                     std::to_string(d.rope) + " N " + std::to_string(n));
        {  // decode: one new token each, contexts 1 to 1,000
          DcpShards s(p, f, d, n, 16, {1, 18, 301, 1001});
          s.step({0, 17, 300, 1000}, false);
          check("decode", f, d, n, s.step({1, 1, 1, 1}, true));
        }
        {  // prefill chunks over cached tokens (one sequence fresh: its first tokens see
           // nothing on the ranks past them), then a decode step
          DcpShards s(p, f, d, n, 3, {38, 66, 195});
          s.step({0, 45, 130}, false);
          const DcpShards::Errors e = s.step({37, 20, 64}, true);
          check("prefill", f, d, n, e);
          EXPECT_GT(e.empty_rows, 0) << "the fresh sequence's first tokens see no key on some rank";
          check("decode", f, d, n, s.step({1, 1, 1}, true));
        }
        {  // a long prefill: 200+ blocks of rows (H200: 132 SMs), so one key split, where the
           // kernels leave their partials only because lse_out asks for them
          DcpShards s(p, f, d, n, 16, {400, 400});
          check("long", f, d, n, s.step({400, 400}, true));
        }
      }
    }
  }
  EXPECT_EQ(mla_fallbacks(*p.gpu_), 0);
}

}  // namespace
}  // namespace strata::testing
