// An in-process tensor-parallel group: N ranks as N threads of one process sharing host memory.
// The CPU backend's --tp-size path and the fake communicator of the TP tests (no GPU needed).
//
// Deterministic: all_reduce_sum adds the ranks' values in rank order 0, 1, …, N-1 in float32 on
// every rank, so the result does not depend on which thread arrives first and is bit-identical
// on all ranks. Data collectives read host pointers (Device::kCpu tensors only).
//
// Cost: each collective is two rendezvous (arrive, then leave once every rank has read), so
// every rank waits for the slowest; fine for tests and for the CPU reference.
#pragma once

#include <memory>
#include <vector>

#include "backend/comm.h"

namespace strata {

// One communicator per rank of a new group of `size` ranks; give communicator r to rank r's
// thread. The group lives as long as any of its communicators.
std::vector<std::unique_ptr<Communicator>> make_local_comm_group(int size);

}  // namespace strata
