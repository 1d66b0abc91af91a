// Side branches (backend/side_branch.h) on a second stream: the fork, the branch's
// launches on the side stream, and the join, each a recorded launch, so that a graph captures
// the fork and the join as edges (stream capture follows the events across the two streams) and
// eager mode runs them as they come.
//
// Why: at batch 1 a MoE layer's shared experts (two GEMVs, ~11 MB on a Kimi-K2.5 rank) wait
// behind the router, the route and the routed experts, and each kernel boundary of the one
// stream costs 2-7 us (the MLA and router fusions measured that much a launch removed); on a
// second stream the shared experts' loads and boundaries overlap the routing's latency-bound
// launches.
//
// Memory: the pool hands out last-freed blocks at once (stream order made that safe), so from the
// fork to the join it defers every release (DevicePool::defer_releases): a block freed by one
// stream's work is never handed to the other's while both may run. Tensors the branch reads were
// made before it.
//
// cuBLAS: a workspace (cublasSetWorkspace) must never serve both streams at once, so the
// branch's GEMMs (batches above gemv_max_rows) run on a handle of their own with its own
// workspace (cublas_handle).
#include "backend/cuda/cuda_backend.h"
#include "core/check.h"

namespace strata::cuda {

namespace {

struct SideEventParams {
  cudaStream_t from;  // the event is recorded here...
  cudaStream_t to;    // ...and waited on here
  cudaEvent_t event;
};

void run_side_event(const SideEventParams& p, const Launch&) {
  CUDA_CHECK(cudaEventRecord(p.event, p.from));
  CUDA_CHECK(cudaStreamWaitEvent(p.to, p.event, 0));
}

// The branch's end on the side stream: its join event, which the joining launch waits on.
void run_side_end(const SideEventParams& p, const Launch&) {
  CUDA_CHECK(cudaEventRecord(p.event, p.from));
}

void run_side_join(const SideEventParams& p, const Launch&) {
  CUDA_CHECK(cudaStreamWaitEvent(p.to, p.event, 0));
}

}  // namespace

void CudaBackend::begin_side_branch(int64_t rows) {
  CHECK_MSG(side_ != SideBranch::kOpen, "begin_side_branch: a side branch is already open");
  join_side_branch();  // an ended branch not yet joined
  if (!tunables_.fusion || rows < 1 || rows > tunables_.side_branch_max_rows ||
      tunables_.deterministic)
    return;  // the branch's ops run in order on the one stream
  begin_op();
  if (side_stream_ == nullptr) {
    CUDA_CHECK(cudaStreamCreateWithFlags(&side_stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&side_fork_, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&side_join_, cudaEventDisableTiming));
    recorder_.set_side_stream(side_stream_);
  }
  record(kOpSideFork, SideEventParams{stream_, side_stream_, side_fork_}, run_side_event);
  side_ = SideBranch::kOpen;
  pool_->defer_releases();
}

void CudaBackend::end_side_branch() {
  if (side_ != SideBranch::kOpen) return;
  record(kOpSideEnd, SideEventParams{side_stream_, stream_, side_join_}, run_side_end);
  side_ = SideBranch::kEnded;
}

cudaEvent_t CudaBackend::take_side_join() {
  CHECK_MSG(side_ != SideBranch::kOpen, "a side branch is still open where its join is needed");
  if (side_ != SideBranch::kEnded) return nullptr;
  side_ = SideBranch::kNone;
  pool_->resume_releases();  // the joining launch is recorded next, on the main stream
  return side_join_;
}

cublasHandle_t CudaBackend::cublas_handle() {
  if (side_ != SideBranch::kOpen) return cublas_;
  if (side_cublas_ == nullptr) {
    CHECK(cublasCreate(&side_cublas_) == CUBLAS_STATUS_SUCCESS);
    CUDA_CHECK(cudaMalloc(&side_cublas_workspace_, kCublasWorkspaceBytes));
    CHECK(cublasSetWorkspace(side_cublas_, side_cublas_workspace_, kCublasWorkspaceBytes) ==
          CUBLAS_STATUS_SUCCESS);
    CHECK(cublasSetStream(side_cublas_, side_stream_) == CUBLAS_STATUS_SUCCESS);
    CHECK(cublasSetSmCountTarget(side_cublas_, gemm_sm_target_) == CUBLAS_STATUS_SUCCESS);
  }
  return side_cublas_;
}

void CudaBackend::join_side_branch() {
  if (cudaEvent_t join = take_side_join())
    record(kOpSideJoin, SideEventParams{side_stream_, stream_, join}, run_side_join);
}

}  // namespace strata::cuda
