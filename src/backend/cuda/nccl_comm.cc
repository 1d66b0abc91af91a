#include "backend/cuda/nccl_comm.h"

#ifdef STRATA_HAVE_NCCL  // CMakeLists.txt: NCCL found

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <thread>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/tunables.h"
#include "core/check.h"
#include "core/log.h"

namespace strata {
namespace {

static_assert(sizeof(ncclUniqueId) == sizeof(NcclId::bytes), "NCCL unique id size changed");

Status nccl_error(ncclResult_t r, const char* what) {
  return unavailable("NCCL {}: {} ({})", what, ncclGetErrorString(r), ncclGetLastError(nullptr));
}

class NcclComm : public Communicator {
 public:
  NcclComm(ncclComm_t comm, int rank, int size, cudaStream_t stream, double timeout_s,
           const std::atomic<bool>* give_up)
      : comm_(comm),
        rank_(rank),
        size_(size),
        stream_(stream),
        timeout_s_(timeout_s),
        give_up_(give_up) {}
  ~NcclComm() override {
    if (scratch_ != nullptr) cudaFree(scratch_);
    if (aborted_.load()) return;  // ncclCommAbort already freed it
    ncclCommDestroy(comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum(const Tensor& x) override {
    if (!status().ok()) return;
    ncclDataType_t t;
    if (!nccl_type(x.dtype, &t))
      return fail(invalid_argument("all_reduce: {} not supported", dtype_name(x.dtype)));
    check(ncclAllReduce(x.data, x.data, size_t(x.numel()), t, ncclSum, comm_, stream_),
          "all_reduce");
  }

  void all_gather(const Tensor& in, const Tensor& out) override {
    if (!status().ok()) return;
    CHECK_EQ(out.nbytes(), in.nbytes() * size_);
    ncclDataType_t t;
    if (!nccl_type(in.dtype, &t))
      return fail(invalid_argument("all_gather: {} not supported", dtype_name(in.dtype)));
    if (!check(ncclAllGather(in.data, out.data, size_t(in.numel()), t, comm_, stream_),
               "all_gather"))
      return;
    (void)wait("all_gather");
  }

  // Point to point in one NCCL group: chunk k of `in` to rank k, rank k's chunk into out[k].
  void all_to_all(const Tensor& in, const Tensor& out) override {
    if (!status().ok()) return;
    CHECK_EQ(out.nbytes(), in.nbytes());
    CHECK_EQ(in.numel() % size_, 0);
    ncclDataType_t t;
    if (!nccl_type(in.dtype, &t))
      return fail(invalid_argument("all_to_all: {} not supported", dtype_name(in.dtype)));
    const size_t count = size_t(in.numel() / size_), chunk = size_t(in.nbytes() / size_);
    if (!check(ncclGroupStart(), "all_to_all")) return;
    for (int k = 0; k < size_; ++k) {
      ncclSend(static_cast<const char*>(in.data) + k * chunk, count, t, k, comm_, stream_);
      ncclRecv(static_cast<char*>(out.data) + k * chunk, count, t, k, comm_, stream_);
    }
    if (!check(ncclGroupEnd(), "all_to_all")) return;
    (void)wait("all_to_all");
  }

  // ncclCommSplit by group (color rank / group_size), non-blocking like the parent.
  StatusOr<std::unique_ptr<Communicator>> split(int group_size) override {
    STRATA_RETURN_IF_ERROR(status());
    if (group_size < 1 || size_ % group_size != 0)
      return invalid_argument("split: groups of {} ranks do not divide {}", group_size, size_);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t child = nullptr;
    ncclResult_t r = ncclCommSplit(comm_, rank_ / group_size, rank_, &child, &config);
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
    while (r == ncclInProgress) {
      if (ncclCommGetAsyncError(child, &r) != ncclSuccess || r != ncclInProgress) break;
      if (stop_requested() || std::chrono::steady_clock::now() > deadline) {
        if (child != nullptr) ncclCommAbort(child);
        return unavailable("NCCL split into groups of {}: peers did not join", group_size);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (r != ncclSuccess) {
      if (child != nullptr) ncclCommAbort(child);
      return nccl_error(r, "split");
    }
    return std::unique_ptr<Communicator>(std::make_unique<NcclComm>(
        child, rank_ % group_size, group_size, stream_, timeout_s_, give_up_));
  }

  Status broadcast_bytes(std::vector<uint8_t>& bytes, int root) override {
    STRATA_RETURN_IF_ERROR(status());
    int64_t n = rank_ == root ? int64_t(bytes.size()) : 0;
    STRATA_RETURN_IF_ERROR(ensure_scratch(sizeof(int64_t)));
    cudaMemcpyAsync(scratch_, &n, sizeof(n), cudaMemcpyHostToDevice, stream_);
    if (!check(ncclBroadcast(scratch_, scratch_, 1, ncclInt64, root, comm_, stream_), "broadcast"))
      return status();
    cudaMemcpyAsync(&n, scratch_, sizeof(n), cudaMemcpyDeviceToHost, stream_);
    STRATA_RETURN_IF_ERROR(wait("broadcast"));
    bytes.resize(size_t(n));
    if (n == 0) return Status();
    STRATA_RETURN_IF_ERROR(ensure_scratch(size_t(n)));
    if (rank_ == root)
      cudaMemcpyAsync(scratch_, bytes.data(), size_t(n), cudaMemcpyHostToDevice, stream_);
    if (!check(ncclBroadcast(scratch_, scratch_, size_t(n), ncclUint8, root, comm_, stream_),
               "broadcast"))
      return status();
    if (rank_ != root)
      cudaMemcpyAsync(bytes.data(), scratch_, size_t(n), cudaMemcpyDeviceToHost, stream_);
    return wait("broadcast");
  }

  Status barrier() override {
    STRATA_RETURN_IF_ERROR(status());
    STRATA_RETURN_IF_ERROR(ensure_scratch(sizeof(float)));
    if (!check(ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_),
               "barrier"))
      return status();
    return wait("barrier");
  }

  void abort(const Status& reason) override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (status_.ok()) status_ = reason.ok() ? internal_error("aborted") : reason;
    }
    // ncclCommAbort stops kernels blocked on peers; safe to call from another thread.
    if (!aborted_.exchange(true)) ncclCommAbort(comm_);
  }
  Status status() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return status_;
  }

 private:
  static bool nccl_type(DType d, ncclDataType_t* t) {
    switch (d) {
      case DType::kF32:
        *t = ncclFloat32;
        return true;
      case DType::kBF16:
        *t = ncclBfloat16;
        return true;
      case DType::kF16:
        *t = ncclFloat16;
        return true;
      case DType::kI32:
        *t = ncclInt32;
        return true;
      case DType::kU8:
        *t = ncclUint8;
        return true;
      default:
        return false;
    }
  }
  void fail(const Status& s) { abort(s.with_context("tensor-parallel rank {}", rank_)); }

  // A call on a non-blocking communicator: wait for it to be enqueued (ncclInProgress).
  bool check(ncclResult_t r, const char* what) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
    while (r == ncclInProgress) {
      if (ncclCommGetAsyncError(comm_, &r) != ncclSuccess) break;
      if (r != ncclInProgress) break;
      if (stop_requested() || std::chrono::steady_clock::now() > deadline) {
        fail(unavailable("NCCL {}: gave up waiting to enqueue", what));
        return false;
      }
      std::this_thread::yield();
    }
    if (r != ncclSuccess) {
      fail(nccl_error(r, what));
      return false;
    }
    return true;
  }

  bool stop_requested() const {
    return aborted_.load() || (give_up_ != nullptr && give_up_->load());
  }

  // Waits for the stream like a watchdog: completion, NCCL's async error, a group abort, or the
  // timeout, whichever comes first.
  Status wait(const char* what) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
    for (;;) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return status();
      if (q != cudaErrorNotReady) {
        fail(unavailable("CUDA during NCCL {}: {}", what, cudaGetErrorString(q)));
        return status();
      }
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        fail(nccl_error(async, what));
        return status();
      }
      if (stop_requested()) {
        fail(unavailable("NCCL {}: another rank failed", what));
        return status();
      }
      if (std::chrono::steady_clock::now() > deadline) {
        fail(unavailable(
            "NCCL {}: no progress for {} s (a peer rank is gone or stuck; STRATA_NCCL_TIMEOUT_S)",
            what, timeout_s_));
        return status();
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  Status ensure_scratch(size_t n) {
    if (n <= scratch_bytes_) return Status();
    STRATA_RETURN_IF_ERROR(wait("scratch"));
    if (scratch_ != nullptr) cudaFree(scratch_);
    scratch_ = nullptr;
    scratch_bytes_ = 0;
    if (cudaMalloc(&scratch_, n) != cudaSuccess)
      return resource_exhausted("NCCL scratch of {} bytes", n);
    scratch_bytes_ = n;
    return Status();
  }

  ncclComm_t comm_;
  const int rank_, size_;
  cudaStream_t stream_;
  double timeout_s_;  // STRATA_NCCL_TIMEOUT_S (tunables.h NcclEnv), read when the comm was made
  const std::atomic<bool>* give_up_;
  mutable std::mutex mu_;
  Status status_;
  std::atomic<bool> aborted_{false};
  void* scratch_ = nullptr;  // device bytes for broadcast / barrier
  size_t scratch_bytes_ = 0;
};

}  // namespace

std::string nccl_id_to_hex(const NcclId& id) {
  std::string s;
  for (char c : id.bytes) s += fmt::format("{:02x}", uint8_t(c));
  return s;
}

StatusOr<NcclId> nccl_id_from_hex(const std::string& hex) {
  NcclId id;
  if (hex.size() != id.bytes.size() * 2)
    return invalid_argument("NCCL id: {} hex digits, expected {}", hex.size(), id.bytes.size() * 2);
  for (size_t i = 0; i < id.bytes.size(); ++i) {
    unsigned v = 0;
    if (std::sscanf(hex.c_str() + 2 * i, "%2x", &v) != 1)
      return invalid_argument("NCCL id: not hex at {}", 2 * i);
    id.bytes[i] = char(v);
  }
  return id;
}

void nccl_apply_env_defaults() { cuda::apply_nccl_env_defaults(); }

StatusOr<NcclId> nccl_new_id() {
  nccl_apply_env_defaults();
  ncclUniqueId u;
  const ncclResult_t r = ncclGetUniqueId(&u);
  if (r != ncclSuccess) return nccl_error(r, "get unique id");
  NcclId id;
  std::memcpy(id.bytes.data(), &u, sizeof(u));
  return id;
}

StatusOr<NcclId> nccl_id_for_launch(const LaunchRank& launch, const std::string& id_file,
                                    double timeout_s) {
  if (const auto hex = cuda::NcclEnv::from_environment().id_hex) return nccl_id_from_hex(*hex);
  if (launch.rank == 0) {
    STRATA_ASSIGN_OR_RETURN(NcclId id, nccl_new_id());
    const std::string tmp = id_file + ".tmp";
    {
      std::ofstream out(tmp);
      out << nccl_id_to_hex(id) << "\n";
      if (!out) return unavailable("cannot write the NCCL id file {}", tmp);
    }
    if (std::rename(tmp.c_str(), id_file.c_str()) != 0)
      return unavailable("cannot rename {} to {}", tmp, id_file);
    return id;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    std::ifstream in(id_file);
    std::string hex;
    if (in && std::getline(in, hex) && !hex.empty()) return nccl_id_from_hex(hex);
    if (std::chrono::steady_clock::now() > deadline)
      return unavailable("rank {}: rank 0 did not write the NCCL id to {} within {} s", launch.rank,
                         id_file, timeout_s);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

StatusOr<int> cuda_visible_device_count() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaErrorNoDevice) return 0;
  if (e != cudaSuccess) return unavailable("cudaGetDeviceCount: {}", cudaGetErrorString(e));
  return n;
}

std::string nccl_visible_devices_note() {
  const auto v = cuda::NcclEnv::from_environment().visible_devices;
  return v ? fmt::format(" (CUDA_VISIBLE_DEVICES={})", *v) : std::string();
}

Status cuda_bind_device(int device) {
  const cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) return unavailable("cudaSetDevice({}): {}", device, cudaGetErrorString(e));
  return Status();
}

void* cuda_backend_stream(Backend& backend) {
  auto* cuda = dynamic_cast<cuda::CudaBackend*>(&backend);
  CHECK_MSG(cuda != nullptr, "NCCL ranks need the CUDA backend, got {}", backend.name());
  return cuda->stream();
}

StatusOr<std::unique_ptr<Communicator>> make_nccl_comm(const NcclId& id, int rank, int size,
                                                       void* stream,
                                                       const std::atomic<bool>* give_up) {
  nccl_apply_env_defaults();
  const double timeout_s = cuda::NcclEnv::from_environment().timeout_s;
  ncclUniqueId u;
  std::memcpy(&u, id.bytes.data(), sizeof(u));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // init and calls return at once; we poll, so an abort can interrupt them
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, size, u, rank, &config);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (r == ncclInProgress) {
    if (ncclCommGetAsyncError(comm, &r) != ncclSuccess || r != ncclInProgress) break;
    if ((give_up != nullptr && give_up->load()) || std::chrono::steady_clock::now() > deadline) {
      ncclCommAbort(comm);
      return unavailable("NCCL init of rank {} of {}: {}", rank, size,
                         give_up != nullptr && give_up->load() ? "another rank failed"
                                                               : "peers did not join in time");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (r != ncclSuccess) {
    if (comm != nullptr) ncclCommAbort(comm);
    return nccl_error(r, "init").with_context("rank {} of {}", rank, size);
  }
  return std::unique_ptr<Communicator>(std::make_unique<NcclComm>(
      comm, rank, size, static_cast<cudaStream_t>(stream), timeout_s, give_up));
}

}  // namespace strata

#endif  // STRATA_HAVE_NCCL
