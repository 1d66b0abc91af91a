// Step times of one model, or of one tensor-parallel rank (--tp-size N: rank 0's shards alone,
// backend/solo_comm.h), outside the engine, on random weights of a config's shape in its stored
// format (bench_checkpoint.h): decode steps at each batch of --batches and context --context,
// eager and replayed as a CUDA graph (as the engine runs them), and one prefill of --prefill
// tokens. Each line also gives the collectives the rank skipped in that step (calls and payload
// bytes), from which bench/cuda/project_tp.py projects the N-GPU step.
//
// Batches whose KV does not fit next to the weights run at the longest context that does (said
// on their line): under tensor parallelism MLA's latent cache is whole on every rank.
//
// Usage: strata_bench_rank_step_bench --config PATH [--tp-size N] [--batches 1,32,128,256]
//   [--context 4096] [--prefill 8192] [--kv-cache-dtype bf16|fp8_e4m3] [--page-size 64]
//   [--mem-fraction 0.9] [--reps 20] [--ncu-step 0|1] [--op-profile 0|1] [--timeline 0|1|2]
//   [--compare-unfused 0|1]
// --compare-unfused 1: each batch's graph step also with CudaTunables::fusion off (the launch
// sequence of the MLA + MoE step before the 2026-12-02 fusions), in the same process.
// --variants a,b,...: each batch's graph step, and the prefill, also under each named tunable
// change (A/B in one process; tunable_variants.h lists them).
// --ncu-step 1: after each batch's timings, one more eager step between cudaProfilerStart and
// cudaProfilerStop, for `ncu --profile-from-start off` (bench/cuda/decode_profile.sh);
// --ncu-variant NAME: that step under a named tunable change instead of the defaults.
// --op-profile 1: the backend's own per-op device times of 4 eager steps (events around every
// launch: CudaBackend::set_profile), which needs no profiler.
// --timeline 1|2: after each batch's timings, one graph-mode step's kernels as the GPU ran them
// (CUPTI, PDL overlap kept: kernel_timeline.h), by kernel name with the time each moved the
// step's end; 2 also lists every kernel of the step in start order. --timeline-variants a,b: the
// same under each named tunable change too.
#include <cuda_profiler_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/solo_comm.h"
#include "bench_args.h"
#include "bench_checkpoint.h"
#include "dist/tp_driver.h"
#include "kernel_timeline.h"
#include "model/config.h"
#include "model/weights.h"
#include "step_batch.h"
#include "tunable_variants.h"

namespace strata {
namespace {

using bench::find_variant;
using bench::Variant;

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct Args {
  std::string config = std::string(STRATA_SHARED_DIR) + "/configs/kimi-k2.5/config.json";
  int tp = 1;
  std::vector<int> batches = {1, 32, 128, 256};
  int context = 4096;
  int prefill = 8192;
  std::string kv = "bf16";
  int page = 64;
  double mem_fraction = 0.9;
  int reps = 20;
  bool ncu_step = false;
  std::string ncu_variant;
  bool op_profile = false;
  int timeline = 0;
  std::vector<std::string> timeline_variants;
  bool compare_unfused = false;
  std::vector<std::string> variants;
};

// Appends the comma-separated variant names of `v` to *out; false (the known names on stderr) at
// an unknown one.
bool parse_variants(const std::string& v, std::vector<std::string>* out) {
  for (size_t b = 0; b <= v.size();) {
    const size_t e = std::min(v.find(',', b), v.size());
    out->push_back(v.substr(b, e - b));
    if (!find_variant(out->back())) {
      std::fprintf(stderr, "rank_step_bench: unknown variant '%s' (%s )\n", out->back().c_str(),
                   bench::variant_names().c_str());
      return false;
    }
    b = e + 1;
  }
  return true;
}

// Milliseconds per call of fn, after untimed calls: the first captures a graph in graph mode; a
// tenth of reps more, because the default's first graph timing of a process read up to 2% above
// a no-change variant timed later in it (H100, 2026-12-06 session 44: Moonlight 2.771 against
// 2.715 ms) — after one warm-up call only.
template <class F>
double time_ms(Backend& be, int reps, F&& fn) {
  for (int i = 0; i < 1 + reps / 10; ++i) fn();
  be.synchronize();
  const auto t = Clock::now();
  for (int i = 0; i < reps; ++i) fn();
  be.synchronize();
  return since(t) / reps * 1e3;
}

// The host's graph-mode recording per step between two GraphStats snapshots (the capture's own
// time left out): the forward's host code, the signature and the graph launch, during which the
// device waits (the step's end downloads the sampled tokens).
std::string host_recording(const cuda::GraphStats& a, const cuda::GraphStats& b) {
  const int64_t steps = b.recorded_steps - a.recorded_steps;
  if (steps <= 0) return "";
  const double rec = double((b.record_ns - a.record_ns) - (b.capture_ns - a.capture_ns)) / 1e3;
  const double flush = double((b.flush_ns - a.flush_ns) - (b.capture_ns - a.capture_ns)) / 1e3;
  return fmt::format("; host recording {:.0f} us a step (flush {:.0f} us), {} launches",
                     rec / double(steps), flush / double(steps), (b.launches - a.launches) / steps);
}

void print_collectives(const SkippedCollectives& s) {
  if (s.all_reduce_calls == 0 && s.all_gather_calls == 0) return;
  std::printf("; skipped collectives: all_reduce %lld x %lld B, all_gather %lld x %lld B",
              (long long)s.all_reduce_calls,
              (long long)(s.all_reduce_calls ? s.all_reduce_bytes / s.all_reduce_calls : 0),
              (long long)s.all_gather_calls,
              (long long)(s.all_gather_calls ? s.all_gather_bytes / s.all_gather_calls : 0));
}

void run(const Args& a) {
  const std::string dir = "/tmp/strata_rank_step_model";
  const int64_t file_bytes = write_zero_checkpoint(a.config, dir);
  auto spec = load_model_spec(dir);
  CHECK_MSG(spec.ok(), "{}", spec.status().to_string());
  auto weights = WeightStore::open(dir, spec->quant);
  CHECK_MSG(weights.ok(), "{}", weights.status().to_string());
  const auto t_load = Clock::now();
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  if (a.tp > 1) {
    const TpConfig tpc{.tp_size = a.tp, .device = Device::kCuda, .one_rank = true};
    auto factory = make_tp_rank_factory(tpc);
    CHECK_MSG(factory.ok(), "{}", factory.status().to_string());
    auto m = create_tp_model(*spec, *weights, tpc, *factory, &backend);
    CHECK_MSG(m.ok(), "{}", m.status().to_string());
    model = std::move(*m);
  } else {
    backend = make_cuda_backend();
    auto m = create_model(*spec, *weights, *backend);
    CHECK_MSG(m.ok(), "{}", m.status().to_string());
    model = std::move(*m);
  }
  auto& be = dynamic_cast<cuda::CudaBackend&>(*backend);
  be.fill_all_random(43, 0.02f);
  be.synchronize();
  const int64_t total = be.device_memory_bytes();
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const int64_t used = int64_t(total_b - free_b);
  std::printf(
      "model    %s, %s, loaded in %.1f s: %.2f GB of checkpoint weights, %.2f GB of device memory "
      "in use\n",
      a.config.c_str(), a.tp > 1 ? fmt::format("rank 0 of tp {} alone", a.tp).c_str() : "tp 1",
      since(t_load), double(file_bytes) / 1e9, double(used) / 1e9);

  const DType kv_dtype = a.kv == "bf16"       ? DType::kBF16
                         : a.kv == "fp8_e5m2" ? DType::kFP8E5M2
                                              : DType::kFP8E4M3;
  KvLayout lay = model->kv_layout();
  lay.dtype = kv_dtype;
  lay.page_size = a.page;
  lay.num_pages = 1;
  const int64_t page_bytes = lay.bytes_per_token() * a.page;
  const int64_t kv_budget =
      int64_t(double(total) * a.mem_fraction) - used - (int64_t(2) << 30);  // 2 GiB: activations
  const int64_t max_pages = std::max<int64_t>(0, kv_budget / page_bytes);
  std::printf("kv       %s, %lld B per token, room for %lld tokens at --mem-fraction %.2f\n",
              dtype_name(kv_dtype), (long long)(page_bytes / a.page),
              (long long)(max_pages * a.page), a.mem_fraction);

  for (const int B : a.batches) {
    // The longest context (whole pages, at most --context) whose B sequences fit.
    int C = a.context;
    const int64_t pages_per_seq_max = max_pages / std::max(1, B);
    if ((C + a.page) / a.page > pages_per_seq_max) C = int(pages_per_seq_max * a.page - a.page);
    if (C < 1) {
      std::printf("decode   batch %d: no room for its KV\n", B);
      continue;
    }
    auto kv = random_kv(be, *model, kv_dtype, int64_t(B) * ((C + a.page) / a.page), a.page);
    auto batch = StepBatch::decode(B, C, a.page, false);
    std::vector<SampleRowParams> greedy(static_cast<size_t>(B));
    std::vector<int32_t> ids(static_cast<size_t>(B));
    const SampleArgs args{.params = greedy.data(), .token_ids = ids.data()};
    const SkippedCollectives c0 = skipped_collectives();
    model->forward_sample(batch->fb, *kv, args);
    const SkippedCollectives per_step = skipped_collectives() - c0;
    const double eager =
        time_ms(be, std::max(3, a.reps / 4), [&] { model->forward_sample(batch->fb, *kv, args); });
    be.set_graph_mode(true);
    const cuda::GraphStats g0 = be.graph_stats();
    const double graph = time_ms(be, a.reps, [&] { model->forward_sample(batch->fb, *kv, args); });
    const std::string recording = host_recording(g0, be.graph_stats());
    be.set_graph_mode(false);
    std::printf(
        "decode   batch %d, context %d%s, KV %s: step %.3f ms as a CUDA graph (%.0f tok/s), %.3f "
        "ms eager%s",
        B, C, C < a.context ? " (the longest that fits)" : "", dtype_name(kv_dtype), graph,
        B / (graph * 1e-3), eager, recording.c_str());
    print_collectives(per_step);
    std::printf("\n");
    std::fflush(stdout);
    if (a.compare_unfused) {
      be.tune([](cuda::CudaTunables& t) { t.fusion = false; });
      be.set_graph_mode(true);
      const double unfused =
          time_ms(be, a.reps, [&] { model->forward_sample(batch->fb, *kv, args); });
      be.set_graph_mode(false);
      be.tune([](cuda::CudaTunables& t) { t.fusion = true; });
      std::printf("unfused  batch %d, context %d: step %.3f ms as a CUDA graph with fusion off\n",
                  B, C, unfused);
      std::fflush(stdout);
    }
    for (const std::string& name : a.variants) {
      const Variant* v = find_variant(name);
      const cuda::CudaTunables saved = be.tunables();
      be.tune(v->apply);
      be.set_graph_mode(true);
      const cuda::GraphStats v0 = be.graph_stats();
      const double ms = time_ms(be, a.reps, [&] { model->forward_sample(batch->fb, *kv, args); });
      const std::string v_recording = host_recording(v0, be.graph_stats());
      be.set_graph_mode(false);
      be.set_tunables(saved);
      std::printf(
          "variant  batch %d, context %d: %-12s step %.3f ms as a CUDA graph (default %.3f: "
          "%+.1f%%; %s)%s\n",
          B, C, v->name, ms, graph, 100.0 * (ms / graph - 1.0), v->what, v_recording.c_str());
      std::fflush(stdout);
    }
    if (a.ncu_step) {
      const cuda::CudaTunables saved = be.tunables();
      if (!a.ncu_variant.empty()) be.tune(find_variant(a.ncu_variant)->apply);
      model->forward_sample(batch->fb, *kv, args);  // any first-use set-up of the variant
      be.synchronize();
      CUDA_CHECK(cudaProfilerStart());
      model->forward_sample(batch->fb, *kv, args);
      be.synchronize();
      CUDA_CHECK(cudaProfilerStop());
      be.set_tunables(saved);
    }
    // The timelines (the defaults, then each --timeline-variants change), their graphs captured
    // again with CUPTI on (it traces the nodes of graphs instantiated after it).
    for (size_t tv = 0; a.timeline > 0 && tv <= a.timeline_variants.size(); ++tv) {
      if (!bench::timeline_begin()) break;
      const cuda::CudaTunables saved = be.tunables();
      const std::string vname = tv == 0 ? "defaults" : a.timeline_variants[tv - 1];
      if (tv > 0) be.tune(find_variant(vname)->apply);
      be.reset_graphs();
      be.set_graph_mode(true);
      for (int i = 0; i < 3; ++i) model->forward_sample(batch->fb, *kv, args);
      be.synchronize();
      const double traced =
          time_ms(be, a.reps, [&] { model->forward_sample(batch->fb, *kv, args); });
      bench::timeline_mark();
      model->forward_sample(batch->fb, *kv, args);
      be.synchronize();
      const bench::Timeline k = bench::timeline_end();
      be.set_graph_mode(false);
      be.reset_graphs();
      be.set_tunables(saved);
      const std::string label = "batch " + std::to_string(B) + ", context " + std::to_string(C) +
                                ", " + vname +
                                " (graph step with CUPTI on: " + std::to_string(traced) + " ms)";
      bench::timeline_print(k, label.c_str(), 40, a.timeline > 1);
      std::fflush(stdout);
    }
    if (a.op_profile) {
      constexpr int kSteps = 4;
      be.set_profile(true);
      for (int i = 0; i < kSteps; ++i) model->forward_sample(batch->fb, *kv, args);
      std::printf("profile  batch %d, context %d, eager, per step:\n%s", B, C,
                  be.profile_report(kSteps).c_str());
      be.set_profile(false);
      std::fflush(stdout);
    }
  }
  if (a.prefill > 0) {
    const int pages = (a.prefill + a.page - 1) / a.page;
    if (pages > max_pages) {
      std::printf("prefill  %d tokens: no room for its KV\n", a.prefill);
      return;
    }
    auto kv = random_kv(be, *model, kv_dtype, pages, a.page);
    auto batch = StepBatch::prefill(a.prefill, a.page);
    SampleRowParams greedy{};
    int32_t id = 0;
    const SampleArgs args{.params = &greedy, .token_ids = &id};
    const SkippedCollectives c0 = skipped_collectives();
    model->forward_sample(batch->fb, *kv, args);
    const SkippedCollectives per_step = skipped_collectives() - c0;
    const double ms = time_ms(be, 3, [&] { model->forward_sample(batch->fb, *kv, args); });
    std::printf("prefill  %d tokens in one step: %.2f ms (%.0f tok/s)", a.prefill, ms,
                a.prefill / (ms * 1e-3));
    print_collectives(per_step);
    std::printf("\n");
    for (const std::string& name : a.variants) {  // the same prefill under each tunable change
      const cuda::CudaTunables saved = be.tunables();
      be.tune(find_variant(name)->apply);
      model->forward_sample(batch->fb, *kv, args);
      const double v_ms = time_ms(be, 3, [&] { model->forward_sample(batch->fb, *kv, args); });
      be.set_tunables(saved);
      std::printf("variant  prefill %d tokens: %-12s %.2f ms (default %.2f)\n", a.prefill,
                  name.c_str(), v_ms, ms);
    }
  }
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  using namespace strata;
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--config")
      a.config = v;
    else if (k == "--tp-size")
      a.tp = std::stoi(v);
    else if (k == "--batches")
      a.batches = parse_int_list(v);
    else if (k == "--context")
      a.context = std::stoi(v);
    else if (k == "--prefill")
      a.prefill = std::stoi(v);
    else if (k == "--kv-cache-dtype")
      a.kv = v;
    else if (k == "--page-size")
      a.page = std::stoi(v);
    else if (k == "--mem-fraction")
      a.mem_fraction = std::stod(v);
    else if (k == "--reps")
      a.reps = std::stoi(v);
    else if (k == "--ncu-step")
      a.ncu_step = v == "1";
    else if (k == "--ncu-variant") {
      std::vector<std::string> one;
      if (!parse_variants(v, &one) || one.size() != 1) return 2;
      a.ncu_variant = v;
    } else if (k == "--op-profile")
      a.op_profile = v == "1";
    else if (k == "--timeline")
      a.timeline = std::stoi(v);
    else if (k == "--compare-unfused")
      a.compare_unfused = v == "1";
    else if (k == "--variants" || k == "--timeline-variants") {
      if (!parse_variants(v, k == "--variants" ? &a.variants : &a.timeline_variants)) return 2;
    } else {
      std::fprintf(stderr, "rank_step_bench: unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  if (argc % 2 == 0) {
    std::fprintf(stderr, "rank_step_bench: flag %s has no value\n", argv[argc - 1]);
    return 2;
  }
  run(a);
  return 0;
}
