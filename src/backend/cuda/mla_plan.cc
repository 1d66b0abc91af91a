// Host side of the MLA kernels (mla_attention.h): the row format of a KvLayout layer, what the
// kernels support, and the grid / split / scratch plan of one call.
#include <algorithm>

#include "backend/backend.h"
#include "backend/cuda/mla_attention.h"
#include "core/check.h"

namespace strata::cuda {
namespace {

int mla_elem_of(DType dt) {
  switch (dt) {
    case DType::kBF16:
      return kMlaBf16;
    case DType::kFP8E4M3:
      return kMlaE4M3;
    case DType::kFP8E5M2:
      return kMlaE5M2;
    case DType::kF32:
      return kMlaF32;
    default:
      CHECK_MSG(false, "MLA KV rows of dtype {}", dtype_name(dt));
  }
  return kMlaBf16;
}

bool is_fp8_elem(int e) { return e == kMlaE4M3 || e == kMlaE5M2; }

}  // namespace

MlaRowFormat mla_row_format(const KvLayout& lay, int layer, float k_scale) {
  const DType dt = lay.layer_dtype(layer);
  MlaRowFormat f{};
  f.row_bytes = lay.k_row_bytes(layer);
  f.rope = lay.rope_dim;
  f.latent = lay.k_dim - lay.rope_dim;
  f.latent_elem = mla_elem_of(dt);
  f.latent_scale = k_scale;
  if (!lay.k_row_is_split(layer)) {  // one dtype, one scale for the whole row
    f.rope_elem = f.latent_elem;
    f.rope_offset = int(dtype_bytes_for(dt, f.latent));
    f.rope_scale = k_scale;
  } else if (lay.format == KvFormat::kFlashMlaFp8) {
    f.flashmla = 1;
    f.latent_elem = kMlaE4M3;
    f.latent_scale = 1.0f;
    f.rope_elem = kMlaBf16;
    f.rope_offset = f.latent + 4 * ((f.latent + kMlaFlashTile - 1) / kMlaFlashTile);
    f.rope_scale = 1.0f;
  } else {  // fp8 latent, the rope part in its own dtype: scaled only when it is fp8 too
    f.rope_elem = mla_elem_of(*lay.rope_dtype);
    f.rope_offset = int(dtype_bytes_for(dt, f.latent));
    f.rope_scale = is_fp8_elem(f.rope_elem) ? k_scale : 1.0f;
  }
  CHECK_EQ(int64_t(f.rope_offset) + int64_t(f.rope) * mla_elem_bytes(f.rope_elem), f.row_bytes);
  return f;
}

MlaRowFormat mla_layer_row_format(const KvLayout& lay, int layer, int rope, float k_scale) {
  if (lay.rope_dim == rope) return mla_row_format(lay, layer, k_scale);
  CHECK_MSG(lay.rope_dim == 0, "MLA attention: the KV layout's rope dim {} is not the model's {}",
            lay.rope_dim, rope);
  KvLayout plain;
  plain.num_layers = 1;
  plain.k_dim = lay.k_dim;
  plain.rope_dim = rope;
  plain.dtype = lay.layer_dtype(layer);
  return mla_row_format(plain, 0, k_scale);
}

bool mla_attention_supported(int latent, int rope) {
  return (latent == 512 && rope == 64) || (latent == 128 && rope == 32) ||
         (latent == 32 && rope == 8);
}

int mla_decode_l2_prefetch(const MlaRowFormat& f) {
  return f.latent_elem == kMlaBf16 ? kMlaDecodeL2Prefetch : 0;
}

bool mla_wgmma_supported(const MlaRowFormat& f) {
  return f.latent == 512 && f.rope == 64 && mla_mma_direct(f) && f.latent_scale == f.rope_scale;
}

int mla_copy_width(const void* cache, int64_t row_bytes) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(cache) | uintptr_t(row_bytes);
  return a % 16 == 0 ? 16 : a % 8 == 0 ? 8 : a % 4 == 0 ? 4 : 0;
}

MlaPlan plan_mla_attention(const MlaRowFormat& fmt, int num_seqs, int64_t num_tokens, int heads,
                           int max_new_tokens, int max_kv_len, int num_sms,
                           const MlaPlanOptions& opt) {
  MlaPlan plan;
  if (num_seqs == 0 || max_new_tokens == 0) return plan;
  const int64_t rows = int64_t(max_new_tokens) * heads;
  if (opt.wgmma && mla_wgmma_supported(fmt) && rows >= 64) {
    plan.kernel = opt.wgmma == 1 ? kMlaWgmma : kMlaWgmmaPipe;
    plan.tile_rows = 64;
    plan.diag = opt.diag;
  } else if (opt.decode && mla_decode_supported(fmt)) {
    plan.kernel = kMlaDecode;
    // 8-row blocks where a sequence has at most 8 rows, or (auto) where even one 64-key chunk a
    // block leaves SMs idle with 16-row blocks: twice the blocks, each half the math, where the
    // batch is too small to fill the GPU (Moonlight's batch 1: 12 blocks of 132 SMs).
    const int64_t chunks16 = int64_t(num_seqs) * ((rows + 15) / 16) *
                             std::max<int64_t>(1, (max_kv_len + plan.chunk - 1) / plan.chunk);
    plan.tile_rows = opt.decode_rows == 8 || opt.decode_rows == 16 ? opt.decode_rows
                     : rows <= 8                                   ? 8
                     : opt.decode_rows < 0 && chunks16 < num_sms   ? 8
                                                                   : 16;
    if (opt.cvt >= 0) plan.cvt = opt.cvt;
    const int most = mla_decode_stages(fmt, plan.cvt);
    plan.stages = opt.stages > 0 ? std::clamp(opt.stages, 2, most) : most;
    plan.evict_first = opt.evict_first;
    plan.diag = opt.diag;
    plan.l2_prefetch = opt.l2_prefetch < 0 ? mla_decode_l2_prefetch(fmt)
                                           : std::min(opt.l2_prefetch, kMlaDecodeMaxL2Prefetch);
    plan.row_groups = opt.row_groups;
    // Two S groups at 16 rows: by rows over bf16 rows or e4m3 rows through the V tile (the
    // kernel's other conversions keep one group); by dims (3) only through the V tile (its
    // exchange does not fit beside three stages of bf16 rows), bf16 rows then by rows. Only where
    // a sequence's rows are one tile: at 128 heads (8 tiles a sequence) fp8_flashmla rows ran
    // 0.561 against 0.528-0.541 ms with them (H100, 2026-12-06).
    const bool vtile = fmt.latent_elem == kMlaE4M3 && plan.cvt == kMlaCvtTile;
    if (opt.s_groups >= 2 && plan.tile_rows == 16 && rows <= 16 &&
        (vtile || fmt.latent_elem == kMlaBf16))
      plan.s_groups = opt.s_groups == 3 && vtile ? 3 : 2;
  } else {
    plan.kernel = kMlaMma;
    plan.tile_rows = 16;
    if (mla_mma_direct(fmt) && opt.bf16_chunk == 48) {
      plan.chunk = 48;
      plan.stages = 3;
    } else if (!mla_mma_direct(fmt)) {
      plan.stages = mla_mma_smem_bytes(fmt, 64, 3) <= kMlaMaxSmem ? 3 : 2;
    }
    CHECK_MSG(mla_mma_smem_bytes(fmt, plan.chunk, plan.stages) <= kMlaMaxSmem,
              "MLA attention: rows of {} bytes do not fit the kernel's shared memory",
              fmt.row_bytes);
  }
  plan.row_tiles = int((rows + plan.tile_rows - 1) / plan.tile_rows);
  plan.multicast = opt.multicast;
  const int64_t max_chunks = std::max<int64_t>(1, (max_kv_len + plan.chunk - 1) / plan.chunk);
  int64_t n = opt.splits;
  if (n <= 0) {
    // One block an SM (every kernel uses most of its shared memory): split the keys only while
    // the rows leave SMs idle, into whole chunks.
    const int64_t blocks = int64_t(num_seqs) * plan.row_tiles;
    n = blocks >= num_sms ? 1 : std::max<int64_t>(1, num_sms / blocks);
    if (opt.max_splits > 0) n = std::min<int64_t>(n, opt.max_splits);
    // Fewer, longer splits only where there are many: the merge then reads fewer partial rows,
    // while short contexts keep one chunk a block (kMlaSplitsKept).
    if (opt.min_split_chunks > 1)
      n = std::min<int64_t>(n,
                            std::max<int64_t>(kMlaSplitsKept, max_chunks / opt.min_split_chunks));
  }
  n = std::clamp<int64_t>(n, 1, max_chunks);
  const int64_t chunks_per_split = (max_chunks + n - 1) / n;
  plan.split_len = int(chunks_per_split * plan.chunk);
  plan.num_splits = int((max_chunks + chunks_per_split - 1) / chunks_per_split);
  if (opt.splits > 0)
    plan.num_splits = std::max(plan.num_splits, int(std::min<int64_t>(opt.splits, max_chunks)));
  if (plan.num_splits > 1 || opt.partials)
    plan.scratch_bytes = num_tokens * heads * plan.num_splits * int64_t(fmt.latent + 2) * 4;
  if (plan.kernel == kMlaDecode && plan.num_splits > 1 && !opt.partials &&
      plan.num_splits <= std::min(opt.fused_merge, kMlaFusedMergeMaxSplits))
    plan.merge_counters = int64_t(num_seqs) * plan.row_tiles;
  return plan;
}

void apply_mla_plan(const MlaPlan& plan, void* scratch, MlaAttentionParams* p,
                    int32_t* merge_counters) {
  p->kernel = plan.kernel;
  p->row_tiles = plan.row_tiles;
  p->num_splits = plan.num_splits;
  p->split_len = plan.split_len;
  p->chunk = plan.chunk;
  p->stages = plan.stages;
  p->tile_rows = plan.tile_rows;
  p->cvt = plan.cvt;
  p->evict_first = plan.evict_first;
  p->diag = plan.diag;
  p->l2_prefetch = plan.l2_prefetch;
  p->row_groups = plan.row_groups;
  p->multicast = plan.multicast;
  p->s_groups = plan.s_groups;
  p->partial_o = nullptr;
  p->partial_ml = nullptr;
  p->merge_counters = plan.merge_counters > 0 ? merge_counters : nullptr;
  if (plan.scratch_bytes > 0) {
    CHECK_MSG(scratch != nullptr, "MLA attention: {} split(s) need scratch", plan.num_splits);
    p->partial_o = static_cast<float*>(scratch);
    const int64_t rows_splits = plan.scratch_bytes / 4 / (p->fmt.latent + 2);
    p->partial_ml = p->partial_o + rows_splits * p->fmt.latent;
  }
}

}  // namespace strata::cuda
