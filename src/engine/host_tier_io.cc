#include "engine/host_tier_io.h"

namespace strata {

const std::vector<KvPageCopy>& KvHostIoCopier::convert(std::span<const PageCopy> c) {
  buf_.resize(c.size());
  for (size_t i = 0; i < c.size(); ++i) buf_[i] = KvPageCopy{c[i].device_page, c[i].host_page};
  return buf_;
}

}  // namespace strata
