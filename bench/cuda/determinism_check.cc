// Batch invariance of the CUDA backend (--enable-deterministic-inference, CudaTunables::
// deterministic), checked on a real model with and without the mode:
//
//   kernel   the batch-invariant GEMM against cuBLAS / the GEMV (the non-deterministic backend)
//            on shapes of the 8B model and odd ones (k tails, m past one tile): close (a bf16
//            rounding), and each row of an m-row product bitwise equal to the same row computed
//            alone (m = 1).
//   logits   64 sequences (random prompts of 9..160 tokens, then 6 forced continuation tokens)
//            through the model in the schedules of tests/support/logit_schedules.h (a batch of
//            64; reverse order on other pages with 16-token prefill chunks; beside other
//            sequences' decode steps with 5-token chunks; the decode positions computed by one
//            prefill chunk), each sequence's logits rows compared bitwise with the sequence run
//            alone (its prompt as one chunk, then one decode step per token). The mode must give
//            0 differing rows in every schedule; without it the count shows that the comparison
//            can fail. The CPU reference must give 0 too, and each mode's "alone" logits are
//            compared with the CPU's (float32): the mode must be as close as the default kernels.
//   engine   greedy generation of 64 prompts x --gen-tokens through the engine, twice with
//            different batch compositions (all at once, max running 64; in reverse order, max
//            running 16, prefill chunks of 64 tokens): the requests whose tokens differ.
//
// Usage: strata_bench_determinism_check --model DIR [--gen-tokens 512] [--skip-engine 1]
//   [--skip-kernel 1]. Prints PASS/FAIL lines; exit status 1 when a check of the mode fails.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "arch/model.h"
#include "backend/cuda/cuda_backend.h"
#include "dist/tensor_parallel.h"
#include "engine/engine.h"
#include "support/logit_schedules.h"

namespace strata {
namespace {

int g_failures = 0;
void verdict(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "PASS" : "FAIL", what.c_str());
  std::fflush(stdout);
  if (!ok) ++g_failures;
}

std::unique_ptr<Backend> cuda_backend(bool det) {
  return make_cuda_backend(BackendOptions{.deterministic = det});
}

// ---- kernel: the GEMM alone ----

// out = x · wᵀ through `be`'s linear (bf16), downloaded as float.
std::vector<float> run_linear(Backend& be, const LinearWeight& w, const std::vector<float>& x,
                              int64_t m, int64_t k, int64_t n) {
  auto xd =
      be.upload(Tensor::make(const_cast<float*>(x.data()), DType::kF32, {m, k}), DType::kBF16);
  auto out = be.alloc(DType::kBF16, {m, n});
  be.linear(xd->view(), w, out->view());
  std::vector<float> r(size_t(m * n));
  be.download_f32(out->view(), r.data());
  return r;
}

void check_kernel() {
  auto det = cuda_backend(true), ref = cuda_backend(false);
  struct Shape {
    int64_t k, n;
  };
  // 8B: qkv, o_proj, gate_up, down; odd: a k tail of 8 past 32, n past a tile, a tiny k.
  const Shape shapes[] = {{4096, 6144}, {4096, 4096}, {4096, 28672}, {14336, 4096},
                          {328, 200},   {8200, 72},   {16, 24}};
  const int64_t ms[] = {1, 2, 7, 64, 65, 300};
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (const Shape& s : shapes) {
    std::vector<float> wv(size_t(s.k * s.n)), xv(size_t(300 * s.k));
    for (auto& v : wv) v = u(rng) * 0.05f;
    for (auto& v : xv) v = u(rng);
    const Tensor wt = Tensor::make(wv.data(), DType::kF32, {s.n, s.k});
    LinearWeight wd, wr;  // dense bf16 [n, k] (out and in read from the shape)
    wd.weight = det->upload(wt, DType::kBF16);
    wr.weight = ref->upload(wt, DType::kBF16);
    // Row r alone (m = 1) in the mode: the bits every batch must reproduce.
    std::vector<std::vector<float>> alone;
    for (int64_t r = 0; r < 300; r += 37) {
      std::vector<float> x1(xv.begin() + r * s.k, xv.begin() + (r + 1) * s.k);
      alone.push_back(run_linear(*det, wd, x1, 1, s.k, s.n));
    }
    int64_t differing = 0, rows_checked = 0;
    double max_rel = 0;
    for (int64_t m : ms) {
      std::vector<float> x(xv.begin(), xv.begin() + m * s.k);
      const auto a = run_linear(*det, wd, x, m, s.k, s.n);
      const auto b = run_linear(*ref, wr, x, m, s.k, s.n);
      double num = 0, den = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        num += double(a[i] - b[i]) * (a[i] - b[i]);
        den += double(b[i]) * b[i];
      }
      max_rel = std::max(max_rel, std::sqrt(num / std::max(den, 1e-30)));
      for (int64_t r = 0, j = 0; r < m; r += 37, ++j) {
        ++rows_checked;
        if (std::memcmp(a.data() + r * s.n, alone[size_t(j)].data(), size_t(s.n) * 4) != 0)
          ++differing;
      }
    }
    verdict(differing == 0 && max_rel < 1e-2,
            fmt::format("kernel k {} n {}: {} of {} rows differ from the row alone; relative "
                        "error against the default kernels {:.2e} (m 1..300)",
                        s.k, s.n, differing, rows_checked, max_rel));
  }
}

// ---- logits: schedules of one model (tests/support/logit_schedules.h) ----

// The schedules against alone on `be`; returns the rows that differ (all schedules).
int schedules_against_alone(Model& model, Backend& be, const testing::InvarianceSetup& setup,
                            const testing::LogitRows& alone, std::optional<DType> kv_dtype,
                            const std::string& label, bool must_hold) {
  int differing = 0;
  for (const auto& sched : testing::invariance_schedules(setup)) {
    const auto got =
        testing::run_schedule(model, be, setup, sched.steps, sched.page_base, kv_dtype);
    const auto d = testing::compare_rows(alone, got);
    differing += d.differing;
    std::printf("%s %-10s: %d of %d logits rows differ bitwise from alone (max |diff| %.3g)\n",
                label.c_str(), sched.name.c_str(), d.differing, d.rows, d.max_abs);
    if (must_hold)
      verdict(d.differing == 0, fmt::format("{} {}: batch-invariant", label, sched.name));
  }
  return differing;
}

void check_logits(const std::string& dir) {
  testing::LogitRows cpu;
  testing::InvarianceSetup setup;
  {  // the CPU reference: the float32 logits, and its own batch invariance
    auto cpu_be = make_cpu_backend();
    auto m = load_model(dir, *cpu_be);
    CHECK_MSG(m.ok(), "{}", m.status().to_string());
    setup = testing::make_invariance_setup(64, (*m)->spec().vocab_size, 9, 160);
    cpu = testing::alone_rows(**m, *cpu_be, setup);
    schedules_against_alone(**m, *cpu_be, setup, cpu, std::nullopt, dir + " cpu", true);
  }
  testing::LogitDiff default_vs_cpu;
  for (bool det : {false, true}) {  // the default kernels first: the mode is measured against them
    auto be = cuda_backend(det);
    auto m = load_model(dir, *be);
    CHECK_MSG(m.ok(), "{}", m.status().to_string());
    const std::string label = dir + (det ? " deterministic" : " default");
    const auto alone = testing::alone_rows(**m, *be, setup, DType::kBF16);
    const auto vs_cpu = testing::compare_rows(cpu, alone);
    std::printf("%s: alone against the CPU reference: max |diff| %.4f, argmax same %d of %d\n",
                label.c_str(), vs_cpu.max_abs, vs_cpu.argmax_same, vs_cpu.rows);
    if (det)  // the mode's kernels compute the model: about as close to the reference
      verdict(vs_cpu.max_abs <= 2 * default_vs_cpu.max_abs + 0.05 &&
                  vs_cpu.argmax_same >= default_vs_cpu.argmax_same - vs_cpu.rows / 50,
              fmt::format("{}: as close to the CPU reference as the default kernels (max |diff| "
                          "{:.4f} vs {:.4f}, argmax same {} vs {})",
                          label, vs_cpu.max_abs, default_vs_cpu.max_abs, vs_cpu.argmax_same,
                          default_vs_cpu.argmax_same));
    else
      default_vs_cpu = vs_cpu;
    const int differing = schedules_against_alone(**m, *be, setup, alone, DType::kBF16, label, det);
    if (!det)
      std::printf("%s: %d rows differ in all (the comparison can fail: expected > 0)\n",
                  label.c_str(), differing);
  }
}

// ---- engine: greedy generation under two batch compositions ----

std::vector<std::vector<int32_t>> generate(const std::string& dir, bool det, bool reversed,
                                           int gen_tokens, int vocab) {
  EngineConfig ec;
  ec.model_path = dir;
  ec.device = Device::kCuda;
  ec.deterministic_inference = det;
  ec.max_running_requests = reversed ? 16 : 64;
  if (reversed) ec.chunked_prefill_size = 64;
  auto e = Engine::create(ec, &tensor_parallel_runtime());
  CHECK_MSG(e.ok(), "{}", e.status().to_string());
  Engine& eng = **e;
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> len(8, 200), tok(1, vocab - 1);
  std::vector<std::vector<int32_t>> prompts(64);
  for (auto& p : prompts) {
    p.resize(size_t(len(rng)));
    for (auto& t : p) t = tok(rng);
  }
  std::vector<std::vector<int32_t>> out(64);
  std::mutex mu;
  for (int j = 0; j < 64; ++j) {
    const int i = reversed ? 63 - j : j;
    GenerateRequest r;
    r.prompt_ids = prompts[size_t(i)];
    r.params.temperature = 0.0f;
    r.params.max_new_tokens = gen_tokens;
    r.params.ignore_eos = true;
    r.on_event = [&out, &mu, i](const StreamEvent& ev) {
      std::lock_guard<std::mutex> lk(mu);
      out[size_t(i)].insert(out[size_t(i)].end(), ev.token_ids.begin(), ev.token_ids.end());
    };
    auto id = eng.submit(std::move(r));
    CHECK_MSG(id.ok(), "{}", id.status().to_string());
  }
  eng.wait_idle();
  return out;
}

void check_engine(const std::string& dir, int gen_tokens) {
  int vocab = 0;
  {
    auto cpu_be = make_cpu_backend();
    auto m = load_model(dir, *cpu_be);
    CHECK_MSG(m.ok(), "{}", m.status().to_string());
    vocab = (*m)->spec().vocab_size;
  }
  for (bool det : {false, true}) {
    const auto a = generate(dir, det, false, gen_tokens, vocab);
    const auto b = generate(dir, det, true, gen_tokens, vocab);
    int same = 0, full = 0;
    for (int i = 0; i < 64; ++i) {
      same += a[size_t(i)] == b[size_t(i)];
      full += int(a[size_t(i)].size()) == gen_tokens && int(b[size_t(i)].size()) == gen_tokens;
    }
    const char* mode = det ? "deterministic" : "default";
    std::printf(
        "%s engine: %d of 64 greedy generations of %d tokens identical across two batch "
        "compositions (%d complete)\n",
        mode, same, gen_tokens, full);
    if (det)
      verdict(same == 64 && full == 64,
              fmt::format("{} {} engine: 64 x {} tokens identical", dir, mode, gen_tokens));
  }
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  std::string model;
  int gen_tokens = 512;
  bool skip_engine = false, skip_kernel = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--model")
      model = v;
    else if (k == "--gen-tokens")
      gen_tokens = std::stoi(v);
    else if (k == "--skip-engine")
      skip_engine = std::stoi(v) != 0;
    else if (k == "--skip-kernel")
      skip_kernel = std::stoi(v) != 0;
    else {
      std::fprintf(stderr, "determinism_check: unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  if (model.empty()) {
    std::fprintf(stderr, "determinism_check: --model DIR is required\n");
    return 2;
  }
  if (!skip_kernel) strata::check_kernel();
  strata::check_logits(model);
  if (!skip_engine) strata::check_engine(model, gen_tokens);
  std::printf("%s: %d failed checks\n", model.c_str(), strata::g_failures);
  return strata::g_failures == 0 ? 0 : 1;
}
