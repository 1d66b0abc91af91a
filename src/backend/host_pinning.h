// Page-locked host memory for downloads (Backend::download): a backend whose device copies
// straight into page-locked memory implements HostPinning beside Backend (the CUDA backend:
// cudaHostRegister); host_pinning() finds it. The capture writer's row blocks
// (engine/capture_block.h) are locked once when they grow, so each step's captured rows land in
// them without the backend's staging copy (issue 25).
#pragma once

#include <cstddef>
#include <memory>

#include "backend/backend.h"

namespace strata {

class HostPinning {
 public:
  virtual ~HostPinning() = default;
  // Page-locks host memory [p, p + bytes). The handle unlocks it when its last copy goes, which
  // must happen before the memory is freed; it needs no backend object then. Null: not locked
  // (failure is logged), and downloads into it are staged as into any host memory. Any thread.
  virtual std::shared_ptr<void> pin_host(void* p, size_t bytes) = 0;
};

// The backend's pinning, or null when it has none (the CPU reference: its memory is the host's).
inline HostPinning* host_pinning(Backend& backend) { return dynamic_cast<HostPinning*>(&backend); }

}  // namespace strata
