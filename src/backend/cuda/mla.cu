// MLA on the GPU, the host side (issue 22): CudaBackend::mla_attention and the latent KV write
// that kv_write hands MLA layouts to, over the kernels of mla_attention.h. Both read the step's
// device metadata (device_meta: one upload a step, shared with every layer and op), and neither
// allocates anything but split-KV scratch from the device pool, so a decode step records into a
// CUDA graph like any other.
//
// Graph replay: the launch parameters must not change while a decode batch only grows its
// contexts. The plan (mla_attention.h plan_mla_attention) depends on the batch's shape only, and
// its longest context enters as a power-of-two bucket (at least 256 keys, as paged decode's
// split count does in attention.cc): splits past a sequence's keys are empty, which the merge
// allows. The scratch (num_splits > 1) is a pool block of a size fixed by the plan, so the same
// step shape gets the same block back (device_memory.h).
//
// (kv_lora_rank, rope) pairs the kernels are not built for (mla_attention_supported), and rows
// the kernels cannot copy (not 4-byte aligned; bf16 rows not 16-byte aligned), run on the CPU
// reference through host copies (cpu_twin.cc), counted as "mla_attention". Decode context
// parallelism's partial attention (mla_dcp.cu) launches through the same mla_attention_gpu.
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/mla_attention.h"

namespace strata::cuda {
namespace {

// The MLA launchers take a bare stream (and always launch with programmatic dependent launch:
// every MLA kernel waits on its predecessor first, so it is safe whatever CudaTunables::pdl says).
void run_mla_attention(const MlaAttentionParams& p, const Launch& l) {
  launch_mla_attention(p, l.stream);
}
void run_mla_kv_write(const MlaKvWriteParams& p, const Launch& l) {
  launch_mla_kv_write(p, l.stream);
}

// The longest context as the plan sees it: a power-of-two bucket, at least 256 keys.
int kv_len_bucket(int max_kv_len) {
  int bucket = 256;
  while (bucket < max_kv_len) bucket *= 2;
  return bucket;
}

}  // namespace

void CudaBackend::mla_attention(const Tensor& q_latent, const KvStorage& kv, int layer,
                                const AttentionMetadata& meta, const MlaArgs& args,
                                const Tensor& out) {
  const int64_t tokens = meta.num_tokens;
  CHECK_EQ(out.numel(), tokens * args.num_heads * args.kv_lora_rank);
  CHECK(out.is_contiguous());
  check_bf16(out, "mla_attention out");
  if (tokens > 0 && !mla_attention_gpu(q_latent, kv, layer, meta, args, out, nullptr))
    mla_attention_cpu_twin(q_latent, kv, layer, meta, args, out);
}

bool CudaBackend::mla_attention_gpu(const Tensor& q_latent, const KvStorage& kv, int layer,
                                    const AttentionMetadata& meta, const MlaArgs& args,
                                    const Tensor& out, const DcpShard* shard) {
  const KvLayout& lay = kv.layout();
  const int heads = args.num_heads, latent = args.kv_lora_rank, rope = args.rope_dim;
  const int width = latent + rope;
  const int64_t tokens = meta.num_tokens;
  CHECK_EQ(lay.k_dim, width);
  CHECK_EQ(q_latent.numel(), tokens * heads * width);
  CHECK(q_latent.is_contiguous());
  check_bf16(q_latent, "mla_attention q_latent");
  const MlaRowFormat fmt = mla_layer_row_format(lay, layer, rope, kv.k_scale(layer));
  const void* cache = kv.k(layer).data;
  const int copy_width = mla_copy_width(cache, fmt.row_bytes);
  // q rows are read 16 bytes at a time: width % 8 (true of every built pair); bf16 rows go
  // straight into the mma kernel's tiles in 16-byte copies (rows of every built pair are).
  if (!mla_attention_supported(latent, rope) || copy_width == 0 || width % 8 != 0 ||
      (mla_mma_direct(fmt) && copy_width != 16))
    return false;
  if (!mla_ready_) {  // shared-memory limits, before the first launch (and any capture)
    init_mla_attention_kernels();
    mla_ready_ = true;
  }
  const DeviceMeta& dm = device_meta(meta);
  auto p = zeroed<MlaAttentionParams>();
  p.q = q_latent.ptr<bf16_bits>();
  p.cache = cache;
  CHECK_MSG(shard == nullptr || meta.tree_mask == nullptr,
            "draft trees with decode context parallelism: not built");
  if (shard == nullptr) {
    check_new_within_kv();
    p.out = out.ptr<bf16_bits>();
  } else {  // rows [output | log-sum-exp] in float32 over the shard (mla_dcp.cu)
    p.lse_out = out.ptr<float>();
    p.positions = dm.positions;
    p.dcp_rank = shard->rank;
    p.dcp_size = shard->size;
  }
  p.q_indptr = dm.q_indptr;
  p.kv_lens = dm.kv_lens;
  p.tree_mask = dm.tree_mask;
  p.page_indptr = dm.page_indptr;
  p.page_indices = dm.page_indices;
  p.fmt = fmt;
  p.num_seqs = meta.num_seqs;
  p.heads = heads;
  p.q_stride = width;
  p.page_size = meta.page_size;
  p.scale_log2 = args.scale * 1.4426950408889634f;
  p.copy_width = copy_width;
  // Deterministic mode: the mma kernel at every batch, keys unsplit (a row's sums then depend
  // on its own keys only; the kernel choice and the split count otherwise follow the batch).
  MlaPlanOptions opt;
  opt.partials = shard != nullptr ? 1 : 0;  // lse_out is written by the merge of the partials
  opt.max_splits = tunables_.mla_max_splits;
  opt.decode_rows = tunables_.mla_decode_rows;
  opt.min_split_chunks = tunables_.mla_min_split_chunks;
  opt.fused_merge = tunables_.mla_fused_merge_max_splits;
  opt.s_groups = tunables_.mla_s_groups;
  opt.l2_prefetch = tunables_.mla_l2_prefetch;
  if (tokens * heads < tunables_.mla_decode_min_rows) opt.decode = 0;
  if (tunables_.deterministic) {
    opt.wgmma = 0;
    opt.decode = 0;
    opt.splits = 1;
  }
  const MlaPlan plan = plan_mla_attention(fmt, meta.num_seqs, tokens, heads, meta_max_q_,
                                          kv_len_bucket(meta_max_kv_), num_sms_, opt);
  DeviceTensorPtr work;  // back to the pool at return: stream order keeps its reuse safe
  if (plan.scratch_bytes > 0) work = scratch(plan.scratch_bytes);
  // The decode kernel's own split merge: counters from the backend's fixed array (zeroed once,
  // left zero by every launch), or the merge kernel where a batch needs more than it holds.
  int32_t* counters =
      plan.merge_counters <= kMlaMergeCounterCapacity ? mla_merge_counters_ : nullptr;
  apply_mla_plan(plan, work ? work->view().data : nullptr, &p, counters);
  // Deterministic mode's draft trees: path tiles (mla_device.cuh BlockWork), one token's heads a
  // block, a tree row's keys in path order, so its sums run as plain decoding of its path runs
  // them (a shared tile would hold its ancestors at their tree slots among masked siblings).
  // Causal rows of the batch give the same bits either way (a row's sums depend on its keys only).
  if (tunables_.deterministic && tunables_.deterministic_tree_paths && meta.tree_mask != nullptr) {
    CHECK_MSG(p.kernel == kMlaMma && p.num_splits == 1 && p.partial_o == nullptr,
              "MLA path tiles: the mma kernel without splits (kernel {}, {} splits)", p.kernel,
              p.num_splits);
    p.tree_paths = 1;
    p.row_tiles = meta_max_q_ * ((heads + p.tile_rows - 1) / p.tile_rows);
  }
  p.early_kv = tunables_.mla_early_kv && !tunables_.pdl_early && shard == nullptr ? 1 : 0;
  record(kOpMlaAttention, p, run_mla_attention);
  return true;
}

void CudaBackend::mla_kv_write(KvStorage& kv, int layer, const Tensor& k,
                               const AttentionMetadata& meta) {
  const KvLayout& lay = kv.layout();
  CHECK_MSG(lay.v_dim == 0, "MLA KV write: the layout has V rows ({} values)", lay.v_dim);
  CHECK(k.is_contiguous());
  const DeviceMeta& dm = device_meta(meta);
  auto p = zeroed<MlaKvWriteParams>();
  p.src = k.ptr<bf16_bits>();
  p.cache = kv.k(layer).data;
  p.slots = dm.slot_mapping;
  p.tokens = meta.num_tokens;
  p.src_stride = lay.k_dim;
  p.fmt = mla_row_format(lay, layer, kv.k_scale(layer));
  record(kOpMlaKvWrite, p, run_mla_kv_write);
}

}  // namespace strata::cuda
