// A fixed pool of worker threads for data-parallel loops on the CPU backend.
#pragma once

#include <cstdint>
#include <functional>

namespace strata {

// Runs fn(begin, end) over [0, n) split into contiguous chunks across the pool's threads and
// the caller. Blocks until all chunks finish. Safe to call from one thread at a time per pool;
// nested calls run serially. Chunks smaller than `min_chunk` are not split further.
void parallel_for(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& fn);

// Number of threads parallel_for uses (STRATA_NUM_THREADS or hardware concurrency).
int num_threads();

}  // namespace strata
