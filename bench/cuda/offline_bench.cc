// Offline throughput through the real engine (continuous batching, chunked prefill, the paged
// pool, sampling on the GPU) on random bf16 weights of a real Llama shape (default Llama-3.1-8B):
// N prompts of random token ids, fixed output length (ignore_eos), greedy — the workload of
// SGLang's bench_offline_throughput with --dataset-name random. Output tokens per second of
// wall time from the first submission to the last completion.
//
// Then a breakdown of one decode step at batch B and context C outside the engine: the forward
// pass with GPU sampling (what the engine runs: only ids come back), the same with the logits'
// download instead, the logits' download alone, the sampling op alone and the host argmax of B
// rows, so the engine's per-step cost can be split into GPU work and host work.
//
// Usage: strata_bench_offline_bench [--config PATH] [--tokenizer DIR] [--prompts N] [--in N]
//   [--out N] [--kv-cache-dtype auto|fp8_e4m3|fp8_e5m2] [--max-running N] [--mem-fraction F]
//   [--max-seconds S] [--page-size N] (the KV page, default 16) [--tp-size N]
//   [--dcp-size N] [--tp-one-rank 1] (rank 0 of --tp-size alone, collectives skipped and counted)
//   [--cuda-graph-max-bs N] (decode steps of at most N requests replay CUDA graphs; default: the
//   engine's) [--schedule-conservativeness F] [--hicache-ratio R] (host KV tier of R x the pool:
//   pages of retracted requests come back from host memory instead of being recomputed)
//   [--hicache-write-policy P] (write_through (the engine's default) | write_back: copies only
//   the pages the device evicts, i.e. the retracted requests' in this workload)
//   [--enable-deterministic-inference 1] (batch-invariant kernels: the engine's and the
//   breakdown's backend; CudaTunables::deterministic)
//   [--speculative-algorithm NGRAM|EAGLE3 --speculative-num-steps N --speculative-eagle-topk 1
//   --speculative-num-draft-tokens T --speculative-draft-model-path DIR
//   --speculative-batch-size-threshold B] (speculative decoding; the mean accept length is
//   printed)
//   [--variant NAME] (a named tunable change of tunable_variants.h on the engine's backend, e.g.
//   mla_rows16: an A/B of a default at large batches)
// Breakdown: [--breakdown-batch B] (0: none) [--breakdown-context C] [--breakdown-pages P,P,...]
//   (then forward + sampling alone at each page size) [--breakdown-scatter 0|1] (each also with
//   the pages scattered over the pool) [--breakdown-overlap 1] (instead: the step's two halves at
//   once on two streams vs one after the other)
// --tp-size N runs the engine over N GPUs (NCCL). Only rank 0's weights get random values (the
// other ranks keep the checkpoint's zeros): dense-model timings do not depend on the values.
// The tokenizer directory only supplies tokenizer files (ids past its vocabulary decode to
// nothing); the default is house-llama's.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <optional>
#include <random>
#include <thread>

#include "backend/cuda/cuda_backend.h"
#include "bench_args.h"
#include "bench_checkpoint.h"
#include "dist/tensor_parallel.h"
#include "engine/engine.h"
#include "step_batch.h"
#include "tunable_variants.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct Args {
  std::string config = std::string(STRATA_SHARED_DIR) + "/configs/llama-3.1-8b/config.json";
  std::string tokenizer = std::string(STRATA_SHARED_DIR) + "/models/house-llama";
  int prompts = 1000, in = 1024, out = 1024, max_running = 0;
  std::string kv = "auto";
  double mem_fraction = 0.88, max_seconds = 400;
  int bd_batch = 256, bd_context = 1536;
  bool bd_scatter = false;
  bool bd_overlap = false;    // time two half-batches at once instead (overlap_breakdown)
  std::vector<int> bd_pages;  // page sizes to time the step at, after the full breakdown
  int page_size = 16;         // the engine's and the breakdown's KV page
  int tp = 1;
  int dcp = 1;            // --dcp-size: decode context parallelism over the tp ranks (arch/dcp.h)
  bool one_rank = false;  // --tp-one-rank 1: rank 0 of --tp-size alone (backend/solo_comm.h)
  std::optional<int> cuda_graph_max_bs;  // unset: the engine's default
  double schedule_conservativeness = 1.0;
  std::string variant;  // --variant: tunable_variants.h's name, applied after the engine's creation
  double hicache_ratio = 0;          // > 0: the host KV tier at this ratio of the device pool
  std::string hicache_write_policy;  // empty: the engine's default
  bool deterministic = false;        // --enable-deterministic-inference 1
  // Speculative decoding (SGLang's flags; engine/spec/spec_config.h). On random weights and
  // random prompts NGRAM accepts next to nothing: this times the verify path's cost.
  std::string speculative_algorithm;
  SpeculativeConfig speculative;
};

std::string prepare_dir(const Args& a) {
  const std::string dir = "/tmp/strata_offline_model";
  write_zero_checkpoint(a.config, dir);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}) {
    const std::string src = a.tokenizer + "/" + f;
    if (std::filesystem::exists(src))
      std::filesystem::copy_file(src, dir + "/" + f,
                                 std::filesystem::copy_options::overwrite_existing);
  }
  return dir;
}

void run_engine(const Args& a, const std::string& dir) {
  EngineConfig ec;
  ec.model_path = dir;
  ec.device = Device::kCuda;
  auto kv = parse_enum<KvCacheDtype>(a.kv, "--kv-cache-dtype");
  CHECK_MSG(kv.ok(), "{}", kv.status().to_string());
  ec.kv_cache_dtype = *kv;
  ec.mem_fraction_static = a.mem_fraction;
  ec.context_length = a.in + a.out + 64;
  ec.page_size = a.page_size;
  if (a.max_running > 0) ec.max_running_requests = a.max_running;
  ec.tp_size = a.tp;
  ec.dcp_size = a.dcp;
  ec.tp_one_rank = a.one_rank;
  ec.deterministic_inference = a.deterministic;
  ec.cuda_graph_max_bs = a.cuda_graph_max_bs;
  ec.schedule_conservativeness = a.schedule_conservativeness;
  if (a.hicache_ratio > 0) {  // retracted requests' pages then come back from host memory
    ec.enable_hierarchical_cache = true;
    ec.hicache_ratio = a.hicache_ratio;
    if (!a.hicache_write_policy.empty()) {
      auto policy = parse_hicache_write_policy(a.hicache_write_policy);
      CHECK_MSG(policy.ok(), "{}", policy.status().to_string());
      ec.hicache_write_policy = *policy;
    }
  }
  if (!a.speculative_algorithm.empty()) {
    ec.speculative = a.speculative;
    auto algo =
        parse_enum<SpeculativeAlgorithm>(a.speculative_algorithm, "--speculative-algorithm");
    CHECK_MSG(algo.ok(), "{}", algo.status().to_string());
    ec.speculative.algorithm = *algo;
  }
  auto t_load = Clock::now();
  auto e = Engine::create(ec, &tensor_parallel_runtime());
  CHECK_MSG(e.ok(), "{}", e.status().to_string());
  Engine& eng = **e;
  dynamic_cast<cuda::CudaBackend&>(eng.backend()).fill_all_random(42, 0.02f);
  if (!a.variant.empty()) {
    const bench::Variant* v = bench::find_variant(a.variant);
    CHECK_MSG(v != nullptr, "offline_bench: unknown --variant {}", a.variant);
    dynamic_cast<cuda::CudaBackend&>(eng.backend()).tune(v->apply);
    std::printf("variant  %s: %s\n", v->name, v->what);
  }
  std::printf(
      "engine   %s, tp %d, dcp %d, KV %s, %lld KV tokens, max running %d, loaded in %.1f s\n",
      a.config.c_str(), a.tp, a.dcp, eng.kv_config().describe().c_str(),
      (long long)eng.plan().kv_tokens, eng.plan().max_running_requests, since(t_load));

  std::mt19937 rng(1);
  std::uniform_int_distribution<int32_t> tok(0, int32_t(eng.spec().vocab_size - 1));
  std::atomic<int64_t> out_tokens{0}, done{0};
  // When the first and the latest output tokens arrived (ns after t0): the decode rate between
  // them leaves out the prefill, the first step's graph capture and this loop's polling.
  std::atomic<int64_t> first_token_ns{-1}, last_token_ns{-1};
  std::vector<int64_t> ids;
  auto t0 = Clock::now();
  for (int i = 0; i < a.prompts; ++i) {
    GenerateRequest r;
    r.prompt_ids.resize(size_t(a.in));
    for (auto& x : r.prompt_ids) x = tok(rng);
    r.params.temperature = 0.0f;
    r.params.max_new_tokens = a.out;
    r.params.ignore_eos = true;
    r.on_event = [&](const StreamEvent& ev) {
      const int64_t ns =
          std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
      int64_t unset = -1;
      if (!ev.token_ids.empty()) {
        first_token_ns.compare_exchange_strong(unset, ns);
        last_token_ns = ns;
      }
      out_tokens += int64_t(ev.token_ids.size());
      if (ev.finished) ++done;
    };
    auto id = eng.submit(std::move(r));
    CHECK_MSG(id.ok(), "{}", id.status().to_string());
    ids.push_back(*id);
  }
  int64_t max_running = 0;
  double next_print = 10;
  bool aborted = false;
  while (done < a.prompts) {
    std::this_thread::sleep_for(std::chrono::milliseconds(a.prompts == 1 ? 5 : 200));
    const EngineStats st = eng.stats();
    max_running = std::max(max_running, st.num_running);
    const double t = since(t0);
    if (t >= next_print) {
      std::printf(
          "progress %6.1f s: %lld output tokens (%.0f tok/s), %lld done, %lld running, %lld "
          "waiting, %lld steps\n",
          t, (long long)out_tokens.load(), double(out_tokens) / t, (long long)done.load(),
          (long long)st.num_running, (long long)st.num_waiting, (long long)st.steps_total);
      std::fflush(stdout);
      next_print += 10;
    }
    if (t > a.max_seconds) {
      aborted = true;
      break;
    }
  }
  const double wall = since(t0);
  const int64_t toks = out_tokens, finished = done;
  const EngineStats st = eng.stats();
  std::printf(
      "offline  %d prompts x %d in / %d out, greedy, KV %s: %lld output tokens in %.1f s = "
      "%.0f output tok/s (%.0f total tok/s); %lld of %d finished%s; %lld steps, max running "
      "%lld, retractions %lld; %.1f ms per engine step\n",
      a.prompts, a.in, a.out, eng.kv_config().describe().c_str(), (long long)toks, wall,
      double(toks) / wall, double(toks + finished * a.in) / wall, (long long)finished, a.prompts,
      aborted ? " (stopped at --max-seconds; rate over the tokens made so far)" : "",
      (long long)st.steps_total, (long long)max_running, (long long)st.retractions_total,
      st.steps_total > 0 ? wall * 1e3 / double(st.steps_total) : 0.0);
  if (toks > 1 && last_token_ns > first_token_ns)
    std::printf(
        "decode   %.0f output tok/s from the first output token (%.3f s) to the last (%.3f s); "
        "at batch 1 the inter-token rate, prefill and first-step capture left out\n",
        double(toks - 1) / (double(last_token_ns - first_token_ns) * 1e-9),
        double(first_token_ns) * 1e-9, double(last_token_ns) * 1e-9);
  if (st.spec_verify_total > 0)
    std::printf("speculative: %lld verifies, %lld drafts, %lld accepted, accept len %.2f\n",
                (long long)st.spec_verify_total, (long long)st.spec_draft_tokens_total,
                (long long)st.spec_accepted_tokens_total,
                double(st.spec_accepted_tokens_total + st.spec_verify_total) /
                    double(st.spec_verify_total));
  std::fflush(stdout);
  if (aborted)
    for (int64_t id : ids) eng.abort(id);
  eng.wait_idle();
}

// The breakdown's KV dtype (--kv-cache-dtype: auto and bf16 are bf16).
DType breakdown_kv_dtype(const Args& a) {
  return a.kv == "auto" || a.kv == "bf16" ? DType::kBF16
         : a.kv == "fp8_e5m2"             ? DType::kFP8E5M2
                                          : DType::kFP8E4M3;
}

// A random pool for `seqs` sequences of the breakdown's context at this page size.
std::unique_ptr<KvStorage> random_kv(cuda::CudaBackend& be, const Model& model, const Args& a,
                                     int seqs, int page) {
  return random_kv(be, model, breakdown_kv_dtype(a), int64_t(seqs) * ((a.bd_context + page) / page),
                   page);
}

// One decode step at batch B, context C (random KV) outside the engine, pages in order; then
// forward + sampling alone for each page size of --breakdown-pages, in order and (with
// --breakdown-scatter 1) scattered.
void breakdown(const Args& a, const std::string& dir) {
  auto backend = make_cuda_backend(BackendOptions{.deterministic = a.deterministic});
  auto& be = dynamic_cast<cuda::CudaBackend&>(*backend);
  auto m = load_model(dir, be);
  CHECK_MSG(m.ok(), "{}", m.status().to_string());
  be.fill_all_random(43, 0.02f);
  Model& model = **m;
  const int B = a.bd_batch, C = a.bd_context;
  auto kv = random_kv(be, model, a, B, a.page_size);
  auto batch = StepBatch::decode(B, C, a.page_size, false);
  const ForwardBatch& fb = batch->fb;
  const int64_t vocab = model.spec().vocab_size;
  std::vector<float> logits(size_t(B) * size_t(vocab));
  auto time_it = [&](int reps, auto&& fn) {
    fn();
    be.synchronize();
    auto t = Clock::now();
    for (int i = 0; i < reps; ++i) fn();
    be.synchronize();
    return since(t) / reps * 1e3;
  };
  const double fwd = time_it(5, [&] { model.forward(fb, *kv, logits.data()); });
  std::vector<SampleRowParams> greedy(static_cast<size_t>(B));
  std::vector<int32_t> ids(static_cast<size_t>(B));
  const SampleArgs args{.params = greedy.data(), .token_ids = ids.data()};
  const double fwd_sample = time_it(5, [&] { model.forward_sample(fb, *kv, args); });
  auto dev_logits = be.alloc(DType::kBF16, {B, vocab});
  be.fill_random(*dev_logits, 5, 1.0f);
  const double dl = time_it(5, [&] { be.download_f32(*dev_logits, logits.data()); });
  const double op = time_it(5, [&] { be.sample(*dev_logits, greedy.data(), ids.data()); });
  std::vector<SampleRowParams> hot(
      static_cast<size_t>(B), SampleRowParams{.temperature = 0.8f, .top_p = 0.95f, .uniform = 0.5});
  const double op_hot = time_it(5, [&] { be.sample(*dev_logits, hot.data(), ids.data()); });
  const double am = time_it(3, [&] {
    volatile int64_t sink = 0;
    for (int s = 0; s < B; ++s) {
      const float* r = logits.data() + size_t(s) * size_t(vocab);
      sink = sink + (std::max_element(r, r + vocab) - r);
    }
  });
  std::printf(
      "step     decode batch %d, context %d, KV %s: forward + GPU greedy sampling %.2f ms "
      "(%.0f tok/s if nothing else ran); forward incl. logits download %.2f ms; logits "
      "download + bf16->f32 alone %.2f ms; sampling op alone: greedy %.3f ms, T 0.8 top_p "
      "0.95 %.3f ms; host argmax of %d rows on one core %.2f ms\n",
      B, C, dtype_name(kv->layout().dtype), fwd_sample, B / (fwd_sample * 1e-3), fwd, dl, op,
      op_hot, B, am);
  for (const int page : a.bd_pages) {
    kv.reset();
    kv = random_kv(be, model, a, B, page);
    std::printf("step     same, page size %d: forward + GPU greedy sampling, pages in order", page);
    for (const bool scattered : {false, true}) {
      if (scattered && !a.bd_scatter) continue;
      auto b = StepBatch::decode(B, C, page, scattered);
      std::printf("%s %.2f ms", scattered ? ", scattered over the pool" : "",
                  time_it(5, [&] { model.forward_sample(b->fb, *kv, args); }));
    }
    std::printf("\n");
  }
}

// Two halves of one decode step at the same time on one GPU: two backends (each with its own
// stream, cuBLAS handle and memory), two copies of the weights, two host threads, against the
// same halves one after the other. The ratio is how much the GPU overlaps one half's attention
// (bandwidth-bound) with the other's GEMMs (compute-bound, with idle SMs in their last wave): the
// gain a two-stream micro-batched decode step can have, measured before building one.
void overlap_breakdown(const Args& a, const std::string& dir) {
  const int half = a.bd_batch / 2, reps = 10;
  struct Half {
    std::unique_ptr<Backend> backend;
    std::unique_ptr<Model> model;
    std::unique_ptr<KvStorage> kv;
    std::unique_ptr<StepBatch> batch;
    std::vector<SampleRowParams> greedy;
    std::vector<int32_t> ids;
    void step() {
      model->forward_sample(batch->fb, *kv,
                            SampleArgs{.params = greedy.data(), .token_ids = ids.data()});
    }
  };
  Half h[2];
  for (int i = 0; i < 2; ++i) {
    h[i].backend = make_cuda_backend();
    auto& be = dynamic_cast<cuda::CudaBackend&>(*h[i].backend);
    auto m = load_model(dir, be);
    CHECK_MSG(m.ok(), "{}", m.status().to_string());
    h[i].model = std::move(*m);
    be.fill_all_random(43 + uint64_t(i), 0.02f);
    h[i].kv = random_kv(be, *h[i].model, a, half, a.page_size);
    h[i].batch = StepBatch::decode(half, a.bd_context, a.page_size, false);
    h[i].greedy.resize(size_t(half));
    h[i].ids.resize(size_t(half));
  }
  for (Half& x : h) x.step();  // warm-up: cuBLAS heuristics, the pools' first allocations
  auto t = Clock::now();
  for (int r = 0; r < reps; ++r) {
    h[0].step();
    h[1].step();
  }
  const double serial = since(t) / reps * 1e3;
  t = Clock::now();
  std::thread other([&] {
    for (int r = 0; r < reps; ++r) h[1].step();
  });
  for (int r = 0; r < reps; ++r) h[0].step();
  other.join();
  const double both = since(t) / reps * 1e3;
  std::printf(
      "overlap  decode batch %d as two halves of %d, context %d, KV %s: one after the other "
      "%.2f ms, at the same time on two streams %.2f ms (%.2fx)\n",
      2 * half, half, a.bd_context, dtype_name(h[0].kv->layout().dtype), serial, both,
      serial / both);
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
    else if (k == "--tokenizer")
      a.tokenizer = v;
    else if (k == "--variant")
      a.variant = v;
    else if (k == "--prompts")
      a.prompts = std::stoi(v);
    else if (k == "--in")
      a.in = std::stoi(v);
    else if (k == "--out")
      a.out = std::stoi(v);
    else if (k == "--kv-cache-dtype")
      a.kv = v;
    else if (k == "--max-running")
      a.max_running = std::stoi(v);
    else if (k == "--mem-fraction")
      a.mem_fraction = std::stod(v);
    else if (k == "--max-seconds")
      a.max_seconds = std::stod(v);
    else if (k == "--breakdown-batch")
      a.bd_batch = std::stoi(v);
    else if (k == "--breakdown-context")
      a.bd_context = std::stoi(v);
    else if (k == "--breakdown-scatter")
      a.bd_scatter = std::stoi(v) != 0;
    else if (k == "--breakdown-overlap")
      a.bd_overlap = std::stoi(v) != 0;
    else if (k == "--breakdown-pages")
      a.bd_pages = parse_int_list(v);
    else if (k == "--page-size")
      a.page_size = std::stoi(v);
    else if (k == "--tp-size")
      a.tp = std::stoi(v);
    else if (k == "--dcp-size")
      a.dcp = std::stoi(v);
    else if (k == "--tp-one-rank")
      a.one_rank = std::stoi(v) != 0;
    else if (k == "--cuda-graph-max-bs")
      a.cuda_graph_max_bs = std::stoi(v);
    else if (k == "--schedule-conservativeness")
      a.schedule_conservativeness = std::stod(v);
    else if (k == "--hicache-ratio")
      a.hicache_ratio = std::stod(v);
    else if (k == "--hicache-write-policy")
      a.hicache_write_policy = v;
    else if (k == "--enable-deterministic-inference")
      a.deterministic = std::stoi(v) != 0;
    else if (k == "--speculative-algorithm")
      a.speculative_algorithm = v;
    else if (k == "--speculative-draft-model-path")
      a.speculative.draft_model_path = v;
    else if (k == "--speculative-num-steps")
      a.speculative.num_steps = std::stoi(v);
    else if (k == "--speculative-eagle-topk")
      a.speculative.eagle_topk = std::stoi(v);
    else if (k == "--speculative-num-draft-tokens")
      a.speculative.num_draft_tokens = std::stoi(v);
    else if (k == "--speculative-batch-size-threshold")
      a.speculative.batch_size_threshold = std::stoi(v);
    else {
      std::fprintf(stderr, "offline_bench: unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  if (argc % 2 == 0) {
    std::fprintf(stderr, "offline_bench: flag %s has no value\n", argv[argc - 1]);
    return 2;
  }
  const std::string dir = prepare_dir(a);
  if (a.prompts > 0) run_engine(a, dir);
  if (a.bd_batch > 0 && a.tp == 1) {  // one GPU's step, outside the engine
    if (a.bd_overlap)
      overlap_breakdown(a, dir);
    else
      breakdown(a, dir);
  }
  return 0;
}
