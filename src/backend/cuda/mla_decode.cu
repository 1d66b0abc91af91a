// The MLA decode kernel (mla_decode.cuh): bf16 and e5m2 rows, what it supports, and the dispatch
// of every row kind (e4m3 and FlashMLA rows are instantiated in mla_decode_fp8.cu).
#include <algorithm>

#include "backend/cuda/mla_decode.cuh"

namespace strata::cuda {
namespace mla_decode {

void launch_bf16(const MlaAttentionParams& p, cudaStream_t stream) {
  if (p.tile_rows == 8) return launch<1, kBf16, kCvtInt>(p, stream);
  if (p.s_groups == kSRows) return launch<2, kBf16, kCvtInt, kSRows>(p, stream);
  launch<2, kBf16, kCvtInt>(p, stream);
}
void launch_e5m2(const MlaAttentionParams& p, cudaStream_t stream) {
  if (p.tile_rows == 8) return launch<1, kE5M2, kCvtInt>(p, stream);
  launch<2, kE5M2, kCvtInt>(p, stream);
}
void init_bf16_e5m2() {
  set_limit<1, kBf16, kCvtInt>();
  set_limit<2, kBf16, kCvtInt>();
  set_limit<2, kBf16, kCvtInt, kSRows>();
  set_limit<1, kE5M2, kCvtInt>();
  set_limit<2, kE5M2, kCvtInt>();
}

}  // namespace mla_decode

bool mla_decode_supported(const MlaRowFormat& f) {
  if (f.latent != mla_decode::kR || f.rope != mla_decode::kP) return false;
  if (f.row_bytes % 16 != 0 || f.rope_offset % 16 != 0) return false;  // bulk copies, ldmatrix
  if (f.flashmla) return f.latent_elem == kMlaE4M3 && f.rope_elem == kMlaBf16;
  if (f.latent_elem == kMlaBf16) return mla_mma_direct(f);
  return f.rope_elem != kMlaF32;  // fp8 latent, bf16 or fp8 rope
}

int mla_decode_stages(const MlaRowFormat& f, int cvt) {  // what fits every layout
  using mla_decode::StageLayout;
  const int stage = std::max({StageLayout(f.row_bytes, 0).stage_bytes(),
                              StageLayout(f.row_bytes, 2).stage_bytes(),
                              StageLayout(f.row_bytes, 3).stage_bytes()});
  const int fixed = mla_decode::kStageOff +
                    (mla_decode::uses_vtile(f.latent_elem, cvt) ? mla_decode::kVTileAreaBytes : 0);
  return std::min(mla_decode::kMaxStages, (kMlaMaxSmem - fixed) / stage);
}

void init_mla_decode_kernels() {
  mla_decode::init_bf16_e5m2();
  mla_decode::init_fp8();
}

void launch_mla_decode(const MlaAttentionParams& p, cudaStream_t stream) {
  CHECK_MSG(mla_decode_supported(p.fmt) && p.copy_width == 16 && p.chunk == mla_decode::kChunk &&
                (p.tile_rows == 8 || p.tile_rows == 16) && p.stages >= 2 &&
                p.stages <= mla_decode_stages(p.fmt, p.cvt),
            "MLA decode kernel: rows of {} bytes (16-byte aligned), chunk {}, {} rows, {} stages",
            p.fmt.row_bytes, p.chunk, p.tile_rows, p.stages);
  // The S forms the kernels are instantiated for (plan_mla_attention picks only these).
  const bool vtile = mla_decode::uses_vtile(p.fmt.latent_elem, p.cvt);
  const bool form_ok =
      p.s_groups <= mla_decode::kSOne ||
      (p.tile_rows == 16 && ((p.s_groups == mla_decode::kSRows &&
                              (vtile || (!p.fmt.flashmla && p.fmt.latent_elem == kMlaBf16))) ||
                             (p.s_groups == mla_decode::kSDims && vtile)));
  CHECK_MSG(form_ok && mla_decode::smem_bytes(p) <= kMlaMaxSmem,
            "MLA decode kernel: S form {} at {} rows, {} bytes of shared memory", p.s_groups,
            p.tile_rows, mla_decode::smem_bytes(p));
  if (p.fmt.flashmla) return mla_decode::launch_flash(p, stream);
  if (p.fmt.latent_elem == kMlaBf16) return mla_decode::launch_bf16(p, stream);
  if (p.fmt.latent_elem == kMlaE5M2) return mla_decode::launch_e5m2(p, stream);
  mla_decode::launch_e4m3(p, stream);
}

}  // namespace strata::cuda
