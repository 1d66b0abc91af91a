// Checkpoint loading on the host, without a GPU: writes the sparse zero checkpoint of a config
// (bench/cuda/bench_checkpoint.h write_zero_checkpoint: no disk space, the kernel serves zero
// pages as if from a fast disk), then loads it through the real loader (WeightStore + the
// architecture's create_model, optionally one tensor-parallel rank's shards) into a backend that
// keeps nothing: every byte a backend would upload is copied once into a reused staging buffer,
// as a GPU backend's host side copies into its pinned staging, and then forgotten. In a CUDA
// build, --backend cuda loads onto the GPU instead (the same numbers for the real backend).
//
// Prints, per repetition, the wall time, the bytes that reached the backend and their rate, the
// time inside the backend's upload calls (the staging copies) and outside them (the loader: read,
// convert, slice, concat, stack), the CPU time (user / system) and the page faults. Run under
// `perf record -g` for the breakdown by function.
//
// Usage: strata_bench_load_bench --config PATH [--quant-from PATH] [--layers N] [--tp-size N]
//   [--reps 2] [--dir /tmp/strata_load_bench] [--keep] [--evict] [--backend sink|cuda]
//   --tp-size:    rank 0's shards of N ranks, loaded alone (backend/solo_comm.h).
//   --quant-from: the quantization_config of another config (top level or text_config), e.g.
//                 kimi-k2.5's on moonlight-16b-a3b: its W4A16 variant.
//   --layers:     keep only the first N decoder layers (a slice of a very large model).
//   --evict:      drop the checkpoint's pages from the page cache before each load
//                 (posix_fadvise on this file only).
//   --backend:    sink (default: keeps nothing), or cuda (CUDA builds: the real CudaBackend, on
//                 the GPU; the time in upload calls is then its host copies, DMA and repacks).
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>
#include <vector>

#include "arch/model.h"
#include "arch/tp.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/solo_comm.h"
#if STRATA_CUDA
#include "backend/cuda/cuda_backend.h"
#endif
#include "core/thread_pool.h"
#include "cuda/bench_checkpoint.h"
#include "model/config.h"
#include "model/sharding.h"
#include "model/weights.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// A device tensor without memory: the shape and dtype a backend would have allocated.
class SinkTensor : public DeviceTensor {
 public:
  SinkTensor(DType dtype, const Shape& shape) { view_ = Tensor::make(nullptr, dtype, shape); }
};

// Keeps nothing. Uploads copy their host bytes into one staging buffer (in parallel, as the CUDA
// backend's staged uploads do); formats as the CUDA backend keeps them (bf16 dense, INT4 and fp8
// block packed). Not for running a forward pass.
class SinkBackend : public cpu::CpuBackend {
 public:
  std::string name() const override { return "sink"; }
  DType weight_dtype() const override { return DType::kBF16; }
  WeightPolicy weight_policy() const override {
    return WeightPolicy{.dense_dtype = DType::kBF16, .keep_fp8_block = true, .keep_int4 = true};
  }
  DeviceTensorPtr upload(const Tensor& host, DType dtype) override {
    stage(host.data, host.nbytes());
    return std::make_unique<SinkTensor>(dtype, host.shape);
  }
  LinearWeight upload_linear(const HostLinearWeight& w, const Tensor& bias_f32) override {
    w.check_sizes();
    stage(w.values.data(), int64_t(w.values.size()));
    stage(w.scales.data(), int64_t(w.scales.size()));
    LinearWeight lw;
    lw.format = weight_policy().device_format(w.format);
    lw.stack = w.stack;
    lw.out = w.out;
    lw.in = w.in;
    lw.weight = std::make_unique<SinkTensor>(
        DType::kU8, Shape{w.stack * linear_device_bytes(lw.format, w.out, w.in)});
    if (!bias_f32.empty()) lw.bias = upload(bias_f32, DType::kF32);
    return lw;
  }
  int64_t staged_bytes() const { return staged_bytes_; }

 private:
  static constexpr int64_t kStaging = int64_t(64) << 20;
  void stage(const void* src, int64_t n) {
    if (n <= 0) return;
    if (staging_.empty()) staging_.resize(size_t(kStaging));
    staged_bytes_ += n;
    const auto* s = static_cast<const char*>(src);
    for (int64_t at = 0; at < n; at += kStaging) {
      const int64_t len = std::min(kStaging, n - at);
      parallel_for(len, int64_t(1) << 20, [&](int64_t b, int64_t e) {
        std::memcpy(staging_.data() + b, s + at + b, size_t(e - b));
      });
    }
  }
  std::vector<char> staging_;
  int64_t staged_bytes_ = 0;
};

// Times and counts a backend's uploads: the bytes it keeps (as tests/support/counting_backend.h
// counts them) and the seconds inside upload / upload_linear (the CUDA backend returns from them
// with the copy done).
template <typename Base>
class TimedBackend : public Base {
 public:
  DeviceTensorPtr upload(const Tensor& host, DType dtype) override {
    const auto t = Clock::now();
    DeviceTensorPtr r = Base::upload(host, dtype);
    if (!in_linear_) {
      seconds_ += since(t);
      bytes_ += r->view().nbytes();
      ++uploads_;
    }
    return r;
  }
  LinearWeight upload_linear(const HostLinearWeight& w, const Tensor& bias_f32) override {
    const auto t = Clock::now();
    in_linear_ = true;
    LinearWeight lw = Base::upload_linear(w, bias_f32);
    in_linear_ = false;
    seconds_ += since(t);
    for (const DeviceTensorPtr* d : {&lw.weight, &lw.scales, &lw.bias})
      if (*d) bytes_ += (*d)->view().nbytes();
    ++linear_uploads_;
    return lw;
  }
  double upload_seconds() const { return seconds_; }
  int64_t device_bytes() const { return bytes_; }
  int64_t uploads() const { return uploads_; }
  int64_t linear_uploads() const { return linear_uploads_; }

 private:
  bool in_linear_ = false;
  double seconds_ = 0;
  int64_t bytes_ = 0, uploads_ = 0, linear_uploads_ = 0;
};

struct Args {
  std::string config;
  std::string quant_from;
  int layers = 0;
  int tp = 1;
  int rank = 0;
  int reps = 2;
  std::string dir = "/tmp/strata_load_bench";
  bool keep = false;
  bool evict = false;
  std::string backend = "sink";
};

// The config the checkpoint is written for: --config with --quant-from's quantization_config and
// --layers applied (where the config keeps its text model's fields: top level or text_config).
std::string prepare_config(const Args& a) {
  std::ifstream in(a.config);
  nlohmann::json c = nlohmann::json::parse(in);
  nlohmann::json& text = c.contains("text_config") ? c["text_config"] : c;
  if (!a.quant_from.empty()) {
    std::ifstream qin(a.quant_from);
    const nlohmann::json q = nlohmann::json::parse(qin);
    const nlohmann::json& qc = q.contains("quantization_config")
                                   ? q["quantization_config"]
                                   : q.at("text_config").at("quantization_config");
    c["quantization_config"] = qc;
  }
  if (a.layers > 0) text["num_hidden_layers"] = a.layers;
  std::filesystem::create_directories(a.dir);
  const std::string path = a.dir + "/source_config.json";
  std::ofstream(path) << c.dump(2);
  return path;
}

std::string file_text(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The bytes write_zero_checkpoint reports for an existing checkpoint: every tensor but the INT4
// weight_shape ones.
int64_t checkpoint_weight_bytes(const std::string& dir) {
  auto spec = load_model_spec(dir);
  CHECK_MSG(spec.ok(), "{}", spec.status().to_string());
  int64_t bytes = 0;
  for (const CheckpointTensor& t : checkpoint_tensors(*spec))
    if (t.values.empty()) bytes += t.bytes();
  return bytes;
}

void evict(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

struct Usage {
  double user = 0, sys = 0;
  long minflt = 0, majflt = 0;
};
Usage usage_now() {
  rusage r{};
  ::getrusage(RUSAGE_SELF, &r);
  return Usage{.user = double(r.ru_utime.tv_sec) + r.ru_utime.tv_usec * 1e-6,
               .sys = double(r.ru_stime.tv_sec) + r.ru_stime.tv_usec * 1e-6,
               .minflt = r.ru_minflt,
               .majflt = r.ru_majflt};
}

template <typename B>
void load_once(const Args& a, const ModelSpec& spec, const std::optional<TpShardPlan>& plan,
               int64_t file_bytes, int rep, TimedBackend<B>& be) {
  std::unique_ptr<Communicator> comm = a.tp > 1 ? make_solo_comm(a.tp, be) : nullptr;
  const Usage u0 = usage_now();
  const auto t = Clock::now();
  auto weights = WeightStore::open(a.dir, spec.quant);
  CHECK_MSG(weights.ok(), "{}", weights.status().to_string());
  auto model =
      create_model(spec, *weights, be, TpRank{.comm = comm.get(), .plan = plan ? &*plan : nullptr});
  CHECK_MSG(model.ok(), "{}", model.status().to_string());
  be.synchronize();
  const double s = since(t);
  const Usage u1 = usage_now();
  std::printf(
      "load %d%s on %s: %.2f s, %.2f GB to the backend = %.2f GB/s (checkpoint %.2f GB = %.2f "
      "GB/s); "
      "in upload calls %.2f s (%lld upload, %lld upload_linear), loader %.2f s; "
      "cpu user %.1f s sys %.1f s; page faults minor %ld major %ld\n",
      rep, a.evict ? " (evicted)" : "", be.name().c_str(), s, double(be.device_bytes()) / 1e9,
      double(be.device_bytes()) / 1e9 / s, double(file_bytes) / 1e9, double(file_bytes) / 1e9 / s,
      be.upload_seconds(), (long long)be.uploads(), (long long)be.linear_uploads(),
      s - be.upload_seconds(), u1.user - u0.user, u1.sys - u0.sys, u1.minflt - u0.minflt,
      u1.majflt - u0.majflt);
#if STRATA_CUDA
  // What the device holds for those bytes (size-class rounding or cached scratch would show).
  if constexpr (std::is_base_of_v<cuda::CudaBackend, TimedBackend<B>>)
    std::printf("device pool: %.3f GB in use, %.3f GB reserved, for %.3f GB of weights kept\n",
                double(be.pool_bytes_in_use()) / 1e9, double(be.pool_bytes()) / 1e9,
                double(be.device_bytes()) / 1e9);
#endif
  std::fflush(stdout);
}

void run(const Args& a) {
  const std::string config = prepare_config(a);
  const auto tw = Clock::now();
  // A checkpoint a --keep run left for the same config is loaded as it is: rewriting it would
  // drop its pages from the page cache (every load then starts cold).
  const bool reuse = std::filesystem::exists(a.dir + "/model.safetensors") &&
                     std::filesystem::exists(a.dir + "/config.json") &&
                     file_text(a.dir + "/config.json") == file_text(config);
  const int64_t file_bytes =
      reuse ? checkpoint_weight_bytes(a.dir) : write_zero_checkpoint(config, a.dir);
  std::printf(
      "checkpoint %s/model.safetensors: %.2f GB of weights (sparse zeros), %s in %.1f s; "
      "%d threads\n",
      a.dir.c_str(), double(file_bytes) / 1e9, reuse ? "kept from an earlier run" : "written",
      since(tw), num_threads());
  auto spec = load_model_spec(a.dir);
  CHECK_MSG(spec.ok(), "{}", spec.status().to_string());
  std::optional<TpShardPlan> plan;
  if (a.tp > 1) {
    auto p = plan_tp_sharding(*spec, a.tp);
    CHECK_MSG(p.ok(), "{}", p.status().to_string());
    plan = std::move(*p);
  }
  for (int rep = 0; rep < a.reps; ++rep) {
    if (a.evict) evict(a.dir + "/model.safetensors");
    if (a.backend == "sink") {
      TimedBackend<SinkBackend> be;
      load_once(a, *spec, plan, file_bytes, rep, be);
    } else {
#if STRATA_CUDA
      TimedBackend<cuda::CudaBackend> be;
      load_once(a, *spec, plan, file_bytes, rep, be);
#else
      CHECK_MSG(false, "--backend cuda: this build has no CUDA backend (-DSTRATA_CUDA=ON)");
#endif
    }
  }
  if (!a.keep) std::filesystem::remove_all(a.dir);
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  strata::Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    auto value = [&]() -> std::string {
      CHECK_MSG(i + 1 < argc, "{} needs a value", f);
      return argv[++i];
    };
    if (f == "--config")
      a.config = value();
    else if (f == "--quant-from")
      a.quant_from = value();
    else if (f == "--layers")
      a.layers = std::stoi(value());
    else if (f == "--tp-size")
      a.tp = std::stoi(value());
    else if (f == "--reps")
      a.reps = std::stoi(value());
    else if (f == "--dir")
      a.dir = value();
    else if (f == "--keep")
      a.keep = true;
    else if (f == "--evict")
      a.evict = true;
    else if (f == "--backend")
      a.backend = value();
    else {
      std::fprintf(stderr, "unknown flag %s (see the header of bench/load_bench.cc)\n", f.c_str());
      return 2;
    }
  }
  if (a.config.empty()) {
    std::fprintf(stderr, "--config PATH is required\n");
    return 2;
  }
  if (a.backend != "sink" && a.backend != "cuda") {
    std::fprintf(stderr, "--backend: sink or cuda, not %s\n", a.backend.c_str());
    return 2;
  }
  strata::run(a);
  return 0;
}
