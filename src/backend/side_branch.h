// Side branches: ops that a backend may run concurrently with the ops recorded after them until
// a join. The CUDA backend implements SideBranches beside Backend (a second stream, forked and
// joined through events: backend/cuda/side_branch.cc); side_branches() finds them. A backend
// without them runs every op in order, with the same results.
//
// The caller's contract: the ops between begin_side_branch and end_side_branch read only
// tensors made before the branch, and write only tensors (or columns of them) that nothing
// touches before the join; the ops after end_side_branch do not write what the branch reads. The
// join is join_side_branch, or Backend::moe_experts_add, which joins an ended branch before it
// reads `add` (the shared experts of a MoE layer beside its router, route and routed experts:
// arch/deepseek.cc). A step ends joined.
#pragma once

#include <cstdint>

#include "backend/backend.h"

namespace strata {

class SideBranches {
 public:
  virtual ~SideBranches() = default;
  // `rows`: the rows the branch's ops take (a backend may branch only at some sizes).
  virtual void begin_side_branch(int64_t rows) = 0;
  virtual void end_side_branch() = 0;
  virtual void join_side_branch() = 0;
};

// `backend`'s side branches, or null when it has none.
inline SideBranches* side_branches(Backend& backend) {
  return dynamic_cast<SideBranches*>(&backend);
}

}  // namespace strata
