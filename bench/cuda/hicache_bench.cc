// Host KV tier benchmarks on the GPU (issue 10):
//   bandwidth  promotion (host -> device) and backup (device -> host) bandwidth of the host copy
//              path (backend/kv_host_io.h) for both io backends, on scattered 16-token pages of
//              an 8B-shape KV layout (32 layers x 8 KV heads x 128 dims, bf16: 2 MiB per page),
//              with a byte-exact round-trip check of every copied page
//   ttft       time to first token of a 32K-token prompt whose prefix KV sits in the host tier
//              (promote every prefix page, then prefill the last page) vs recomputing it
//              (chunked prefill, 8,192 tokens per chunk), random weights of the config's shape
//
// Usage: strata_bench_hicache_bench [--config PATH] [--what bandwidth,ttft] [--gib 4]
//                                   [--prompt 32768]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "arch/model.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/kv_host_io.h"
#include "bench_checkpoint.h"

namespace strata {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The 8B KV layout of a Llama config: per layer K and V of kv_heads x head_dim bf16 values.
KvLayout kv_layout_of(const std::string& config_path, int64_t num_pages, int page_size) {
  json c = json::parse(std::ifstream(config_path));
  const int heads = c["num_attention_heads"], kv_heads = c.value("num_key_value_heads", heads);
  const int hd = c.value("head_dim", int(c["hidden_size"]) / heads);
  return KvLayout{.num_layers = c["num_hidden_layers"],
                  .num_pages = num_pages,
                  .page_size = page_size,
                  .k_dim = kv_heads * hd,
                  .v_dim = kv_heads * hd,
                  .dtype = DType::kBF16};
}

std::vector<uint8_t> device_page_bytes(const KvStorage& kv, int layer, bool value, int32_t page) {
  const Tensor t = value ? kv.v(layer) : kv.k(layer);
  const int64_t n = t.nbytes() / kv.layout().num_pages;
  std::vector<uint8_t> out(static_cast<size_t>(n));
  CUDA_CHECK(cudaMemcpy(out.data(), static_cast<const char*>(t.data) + int64_t(page) * n, size_t(n),
                        cudaMemcpyDeviceToHost));
  return out;
}

void bench_bandwidth(cuda::CudaBackend& be, const std::string& config, double gib) {
  const int page = 16;
  KvLayout probe = kv_layout_of(config, 1, page);
  const int64_t page_bytes = probe.bytes_per_token() * page;
  const int64_t host_pages = int64_t(gib * double(int64_t(1) << 30)) / page_bytes;
  const int64_t device_pages = 2 * host_pages + 16;
  auto kv = be.alloc_kv(kv_layout_of(config, device_pages, page));
  for (int l = 0; l < probe.num_layers; ++l) {
    be.fill_random(kv->k(l), 100 + uint64_t(l), 1.0f);
    be.fill_random(kv->v(l), 200 + uint64_t(l), 1.0f);
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  // Scattered: host pages in random order onto a random half of the device pages; the round
  // trip comes back onto the other half.
  std::vector<int32_t> dev(static_cast<size_t>(device_pages)),
      host(static_cast<size_t>(host_pages));
  std::iota(dev.begin(), dev.end(), 0);
  std::iota(host.begin(), host.end(), 0);
  std::mt19937 rng(17);
  std::shuffle(dev.begin(), dev.end(), rng);
  std::shuffle(host.begin(), host.end(), rng);
  std::vector<KvPageCopy> out, back;
  for (int64_t i = 0; i < host_pages; ++i) {
    out.push_back({dev[size_t(i)], host[size_t(i)]});
    back.push_back({dev[size_t(host_pages + i)], host[size_t(i)]});
  }
  const double bytes = double(page_bytes) * double(host_pages);
  std::printf(
      "bandwidth  layout %d layers x K,V %d bf16, page %d tokens = %.2f MiB (%lld B per layer K|V "
      "part); "
      "%lld scattered pages = %.2f GiB per batch\n",
      probe.num_layers, probe.k_dim, page, double(page_bytes) / double(1 << 20),
      (long long)(page_bytes / (2 * probe.num_layers)), (long long)host_pages,
      bytes / double(int64_t(1) << 30));
  {  // The link's ceiling: one pinned copy of 1 GiB each way.
    const size_t n = size_t(1) << 30;
    void *h = nullptr, *d = nullptr;
    CUDA_CHECK(cudaHostAlloc(&h, n, cudaHostAllocDefault));
    CUDA_CHECK(cudaMalloc(&d, n));
    std::memset(h, 1, n);
    for (int dir = 0; dir < 2; ++dir) {
      double best = 1e9;
      for (int rep = 0; rep < 4; ++rep) {
        auto t0 = Clock::now();
        CUDA_CHECK(dir == 0 ? cudaMemcpy(d, h, n, cudaMemcpyHostToDevice)
                            : cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost));
        best = std::min(best, seconds_since(t0));
      }
      std::printf("bandwidth  ceiling: one 1 GiB pinned cudaMemcpy %s: %.1f GB/s\n",
                  dir == 0 ? "H2D" : "D2H", double(n) / best / 1e9);
    }
    cudaFreeHost(h);
    cudaFree(d);
  }
  for (KvIoBackend io : {KvIoBackend::kKernel, KvIoBackend::kDirect}) {
    auto t0 = Clock::now();
    auto made = make_kv_host_io(be, *kv, host_pages, io);
    CHECK_MSG(made.ok(), "{}", made.status().to_string());
    KvHostIo& h = **made;
    const double alloc_s = seconds_since(t0);
    h.wait(h.device_to_host(out));  // warm-up (first touch of the pinned pages)
    h.wait(h.host_to_device(back));
    double best_d2h = 1e9, best_h2d = 1e9;
    for (int rep = 0; rep < 3; ++rep) {
      t0 = Clock::now();
      h.wait(h.device_to_host(out));
      best_d2h = std::min(best_d2h, seconds_since(t0));
      t0 = Clock::now();
      h.wait(h.host_to_device(back));
      best_h2d = std::min(best_h2d, seconds_since(t0));
    }
    // Every copied page of the round trip equals its source, byte for byte (sampled pages all
    // layers; every page of layer 0 K).
    int64_t bad = 0;
    for (int64_t i = 0; i < host_pages; ++i) {
      const bool all = i % 97 == 0;
      for (int l = 0; l < (all ? probe.num_layers : 1); ++l)
        for (bool v : {false, true}) {
          if (!all && v) continue;
          if (device_page_bytes(*kv, l, v, out[size_t(i)].device_page) !=
              device_page_bytes(*kv, l, v, back[size_t(i)].device_page))
            ++bad;
        }
    }
    std::printf(
        "bandwidth  io %-6s: host->device (promotion) %.1f GB/s, device->host (backup) %.1f GB/s "
        "(best of 3, wall time incl. launch); pinned %.2f GiB in %.2f s; round trip %s\n",
        std::string(kv_io_backend_name(io)).c_str(), bytes / best_h2d / 1e9, bytes / best_d2h / 1e9,
        double(h.host_bytes()) / double(int64_t(1) << 30), alloc_s,
        bad == 0 ? "byte-exact" : "MISMATCH");
    // Contiguous runs, the direct backend's best case: 64 consecutive pages at a time.
    std::vector<KvPageCopy> runs;
    for (int64_t i = 0; i < host_pages; ++i) runs.push_back({int32_t(i), int32_t(i)});
    t0 = Clock::now();
    h.wait(h.host_to_device(runs));
    std::printf("bandwidth  io %-6s: host->device, pages in one contiguous run: %.1f GB/s\n",
                std::string(kv_io_backend_name(io)).c_str(), bytes / seconds_since(t0) / 1e9);
    std::fflush(stdout);
  }
}

// Runs `ids` (positions start..start+n) through the model for one sequence whose page table is
// `pages`; returns the argmax of the last position.
int32_t forward(Model& m, KvStorage& kv, const std::vector<int32_t>& pages, int page, int32_t start,
                const std::vector<int32_t>& ids, std::vector<float>& logits) {
  const int n = int(ids.size());
  const int32_t len = start + n;
  std::vector<int32_t> pos(static_cast<size_t>(n)), slots(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    pos[size_t(i)] = start + i;
    slots[size_t(i)] = pages[size_t((start + i) / page)] * page + (start + i) % page;
  }
  int32_t q_indptr[2] = {0, n}, kv_lens[1] = {len}, page_indptr[2] = {0, (len + page - 1) / page};
  int32_t rows[1] = {n - 1};
  ForwardBatch b;
  b.token_ids = ids.data();
  b.attn = AttentionMetadata{.num_seqs = 1,
                             .num_tokens = n,
                             .page_size = page,
                             .q_indptr = q_indptr,
                             .kv_lens = kv_lens,
                             .page_indptr = page_indptr,
                             .page_indices = pages.data(),
                             .positions = pos.data(),
                             .slot_mapping = slots.data()};
  b.logit_rows = rows;
  b.num_logit_rows = 1;
  m.forward(b, kv, logits.data());
  return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

void bench_ttft(cuda::CudaBackend& be, const std::string& config, int prompt) {
  const int page = 16, chunk = 8192;
  const std::string dir = "/tmp/strata_bench_hicache";
  auto t0 = Clock::now();
  const int64_t weight_bytes = write_zero_checkpoint(config, dir);
  auto m = load_model(dir, be);
  CHECK_MSG(m.ok(), "{}", m.status().to_string());
  be.fill_all_random(42, 0.02f);
  const ModelSpec& s = (*m)->spec();
  std::printf("ttft     model %s: %d layers, %.2f GB of random bf16 weights, loaded in %.1f s\n",
              config.c_str(), s.num_layers, double(weight_bytes) / 1e9, seconds_since(t0));
  const int seq_pages = (prompt + page - 1) / page;
  KvLayout layout = (*m)->kv_layout();
  layout.page_size = page;
  layout.num_pages = 2 * seq_pages + 2;
  layout.dtype = DType::kBF16;
  auto kv = be.alloc_kv(layout);
  std::vector<int32_t> perm(size_t(layout.num_pages));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(3));
  std::vector<int32_t> first(perm.begin(), perm.begin() + seq_pages),
      second(perm.begin() + seq_pages, perm.begin() + 2 * seq_pages);
  std::vector<int32_t> ids(static_cast<size_t>(prompt));
  std::mt19937 rng(5);
  for (int32_t& t : ids) t = int32_t(rng() % uint32_t(s.vocab_size));
  std::vector<float> logits(size_t(s.vocab_size));

  auto recompute = [&](const std::vector<int32_t>& pages) {
    int32_t next = -1;
    for (int32_t at = 0; at < prompt; at += chunk) {
      std::vector<int32_t> part(ids.begin() + at, ids.begin() + std::min(prompt, at + chunk));
      next = forward(**m, *kv, pages, page, at, part, logits);
    }
    return next;
  };
  recompute(second);  // warm-up: kernels, workspaces, allocator
  t0 = Clock::now();
  const int32_t token_recompute = recompute(first);
  const double recompute_s = seconds_since(t0);
  std::printf(
      "ttft     %d-token prompt recomputed (chunked prefill, %d tokens per chunk): %.1f ms\n",
      prompt, chunk, recompute_s * 1e3);
  std::fflush(stdout);

  // The prefix (every whole page but the one holding the last token) goes to host; it comes back
  // onto other device pages and only the last page is prefilled, as the engine does on a host hit.
  const int prefix_pages = (prompt - 1) / page;
  std::vector<KvPageCopy> out, in;
  for (int i = 0; i < prefix_pages; ++i) {
    out.push_back({first[size_t(i)], int32_t(i)});
    in.push_back({second[size_t(i)], int32_t(i)});
  }
  std::vector<int32_t> tail(ids.begin() + prefix_pages * page, ids.end());
  std::vector<std::unique_ptr<KvHostIo>> ios;
  for (KvIoBackend io : {KvIoBackend::kKernel, KvIoBackend::kDirect}) {
    auto made = make_kv_host_io(be, *kv, prefix_pages, io);
    CHECK_MSG(made.ok(), "{}", made.status().to_string());
    ios.push_back(std::move(made).value());
    ios.back()->wait(ios.back()->device_to_host(out));
  }
  // Scramble the device pool: the first token below comes from the promoted pages or is wrong.
  for (int l = 0; l < layout.num_layers; ++l) {
    be.fill_random(kv->k(l), 300 + uint64_t(l), 1.0f);
    be.fill_random(kv->v(l), 400 + uint64_t(l), 1.0f);
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  for (auto& hp : ios) {
    KvHostIo& h = *hp;
    double best = 1e9, copy_s = 0;
    int32_t token_host = -1;
    for (int rep = 0; rep < 3; ++rep) {
      t0 = Clock::now();
      const double c0 = h.copy_seconds();
      h.wait(h.host_to_device(in));
      token_host = forward(**m, *kv, second, page, prefix_pages * page, tail, logits);
      const double t = seconds_since(t0);
      if (t < best) {
        best = t;
        copy_s = h.copy_seconds() - c0;
      }
    }
    std::printf(
        "ttft     %d-token prompt, prefix of %d tokens (%.2f GiB of KV) served from host (io %s): "
        "%.1f ms (copy %.1f ms + prefill of the last %d tokens) vs recomputed (chunks of %d): %.1f "
        "ms "
        "-> %.1fx; first token %s (%d vs %d)\n",
        prompt, prefix_pages * page,
        double(prefix_pages) * double(page) * double(layout.bytes_per_token()) /
            double(int64_t(1) << 30),
        std::string(kv_io_backend_name(h.backend())).c_str(), best * 1e3, copy_s * 1e3,
        int(tail.size()), chunk, recompute_s * 1e3, recompute_s / best,
        token_host == token_recompute ? "equal" : "DIFFERS", token_host, token_recompute);
    std::fflush(stdout);
  }
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  using namespace strata;
  std::string config = std::string(STRATA_SHARED_DIR) + "/configs/llama-3.1-8b/config.json";
  std::string what = "bandwidth,ttft";
  double gib = 4;
  int prompt = 32768;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--config")
      config = v;
    else if (a == "--what")
      what = v;
    else if (a == "--gib")
      gib = std::stod(v);
    else if (a == "--prompt")
      prompt = std::stoi(v);
    else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device   %s\n", prop.name);
  auto be = std::make_unique<cuda::CudaBackend>();
  if (what.find("bandwidth") != std::string::npos) bench_bandwidth(*be, config, gib);
  std::fflush(stdout);
  if (what.find("ttft") != std::string::npos) bench_ttft(*be, config, prompt);
  return 0;
}
