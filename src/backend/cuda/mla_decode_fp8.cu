// The MLA decode kernel (mla_decode.cuh) over e4m3 and FlashMLA rows: the default e4m3 conversion
// and the V tile for 8 and 16 rows (16 also with two S groups, either form), the other two (the
// bench's comparison) for 16 rows.
#include "backend/cuda/mla_decode.cuh"

namespace strata::cuda::mla_decode {
namespace {

template <int LK>
void launch_kind(const MlaAttentionParams& p, cudaStream_t stream) {
  if (p.tile_rows == 8)
    return p.cvt == kCvtTile ? launch<1, LK, kCvtTile>(p, stream)
                             : launch<1, LK, kDefaultCvt>(p, stream);
  switch (p.cvt) {
    case kCvtTile:
      if (p.s_groups == kSRows) return launch<2, LK, kCvtTile, kSRows>(p, stream);
      if (p.s_groups == kSDims) return launch<2, LK, kCvtTile, kSDims>(p, stream);
      return launch<2, LK, kCvtTile>(p, stream);
    case kCvtInt:
      return launch<2, LK, kCvtInt>(p, stream);
    case kCvtHw:
      return launch<2, LK, kCvtHw>(p, stream);
    default:
      return launch<2, LK, kCvtHwS>(p, stream);
  }
}
template <int LK>
void init_kind() {
  set_limit<1, LK, kDefaultCvt>();
  set_limit<1, LK, kCvtTile>();
  set_limit<2, LK, kCvtTile>();
  set_limit<2, LK, kCvtTile, kSRows>();
  set_limit<2, LK, kCvtTile, kSDims>();
  set_limit<2, LK, kCvtInt>();
  set_limit<2, LK, kCvtHwS>();
  set_limit<2, LK, kCvtHw>();
}

}  // namespace

void launch_e4m3(const MlaAttentionParams& p, cudaStream_t stream) {
  launch_kind<kE4M3>(p, stream);
}
void launch_flash(const MlaAttentionParams& p, cudaStream_t stream) {
  launch_kind<kFlash>(p, stream);
}
void init_fp8() {
  init_kind<kE4M3>();
  init_kind<kFlash>();
}

}  // namespace strata::cuda::mla_decode
