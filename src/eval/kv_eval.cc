#include "eval/kv_eval.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>

#include "core/log.h"
#include "core/thread_pool.h"
#include "eval/eval_checkpoint.h"
#include "eval/paged_runner.h"
#include "eval/reference_logits.h"
#include "model/config.h"

namespace strata {
namespace {

// {"role","content"} or ShareGPT {"from","value"} turns -> {"role","content"}.
nlohmann::json normalize_turns(const nlohmann::json& turns) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& t : turns) {
    if (t.contains("role")) {
      out.push_back({{"role", t.at("role")}, {"content", t.value("content", "")}});
    } else {
      std::string from = t.value("from", "user");
      if (from == "human") from = "user";
      if (from == "gpt") from = "assistant";
      out.push_back({{"role", from}, {"content", t.value("value", "")}});
    }
  }
  return out;
}

PositionScore position_score(const LogitStatsRow& r) {
  return PositionScore{.kl = r.kl,
                       .top1_agree = r.top1_agree > 0.5f,
                       .dp = r.dp,
                       .nll_ref = r.nll_ref,
                       .nll_cand = r.nll_cand};
}

void add_scores(const std::vector<ScoredPosition>& scores, KvMetrics& metrics) {
  for (const ScoredPosition& p : scores) metrics.add(p.position, position_score(p.stats));
}

// FNV-1a 64 of the windows' tokens: the checkpoint key names the data by its content.
uint64_t hash_windows(const std::vector<std::vector<int32_t>>& windows, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t w = 0; w < n; ++w)
    for (int32_t t : windows[w])
      for (int b = 0; b < 4; ++b) h = (h ^ ((uint32_t(t) >> (8 * b)) & 0xffu)) * 1099511628211ull;
  return h;
}

int first_divergence(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i)
    if (a[i] != b[i]) return int(i);
  return int(n);
}

}  // namespace

nlohmann::json FreeRunResult::to_json() const {
  int diverged = 0;
  double sum = 0;
  for (int d : first_divergence) {
    diverged += d < tokens_per_prompt;
    sum += d;
  }
  std::vector<int> sorted = first_divergence;
  std::sort(sorted.begin(), sorted.end());
  return {{"prompts", prompts},
          {"tokens_per_prompt", tokens_per_prompt},
          {"diverged", diverged},
          {"mean_first_divergence", prompts ? sum / prompts : 0.0},
          {"median_first_divergence", sorted.empty() ? 0 : sorted[sorted.size() / 2]},
          {"first_divergence", first_divergence}};
}

StatusOr<EvalData> load_eval_data(const std::string& path, const PromptEncoder& enc,
                                  int context_len, int64_t max_tokens, bool allow_repeat,
                                  int free_run_prompts) {
  if (context_len < 2) return invalid_argument("--context-len must be >= 2, got {}", context_len);
  std::ifstream f(path);
  if (!f) return not_found("--data: cannot open '{}'", path);
  EvalData d;
  std::vector<int32_t> stream;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(f, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception& e) {
      return invalid_argument("--data '{}' line {}: not JSON: {}", path, line_no, e.what());
    }
    std::vector<int32_t> ids, prompt;
    if (j.contains("text") || j.contains("prompt")) {
      const std::string text =
          j.contains("text") ? j.at("text").get<std::string>() : j.at("prompt").get<std::string>();
      ids = enc.encode_raw(text);
      prompt.assign(ids.begin(), ids.begin() + long(std::min<size_t>(ids.size(), 32)));
    } else if (j.contains("messages") || j.contains("conversations")) {
      const nlohmann::json turns =
          normalize_turns(j.contains("messages") ? j.at("messages") : j.at("conversations"));
      STRATA_ASSIGN_OR_RETURN(ids, enc.encode_chat(turns, false));
      nlohmann::json head = turns;
      while (!head.empty() && head.back().value("role", "") == "assistant")
        head.erase(head.size() - 1);
      if (!head.empty()) {
        STRATA_ASSIGN_OR_RETURN(prompt, enc.encode_chat(head, true));
      }
    } else {
      return invalid_argument(
          "--data '{}' line {}: needs \"text\", \"prompt\", \"messages\" or \"conversations\"",
          path, line_no);
    }
    ++d.records;
    stream.insert(stream.end(), ids.begin(), ids.end());
    if (int(d.prompts.size()) < free_run_prompts && !prompt.empty() &&
        int(prompt.size()) <= context_len / 2)
      d.prompts.push_back(std::move(prompt));
  }
  d.stream_tokens = int64_t(stream.size());
  if (d.stream_tokens < context_len)
    return invalid_argument("--data '{}': {} tokens, fewer than one window of --context-len {}",
                            path, d.stream_tokens, context_len);
  const int64_t per_window = context_len - 1;
  const int64_t want = (max_tokens + per_window - 1) / per_window;
  // Pass k starts at offset k·context_len/3 (mod the window), so a repeated pass sees the same
  // text under other contexts; the record says whether this happened.
  for (int64_t pass = 0; int64_t(d.windows.size()) < want; ++pass) {
    if (pass > 0 && !allow_repeat) break;
    if (pass >= 3) break;
    const int64_t offset = (pass * context_len / 3) % context_len;
    for (int64_t b = offset; b + context_len <= d.stream_tokens && int64_t(d.windows.size()) < want;
         b += context_len)
      d.windows.emplace_back(stream.begin() + b, stream.begin() + b + context_len);
    if (pass > 0) d.repeated = true;
  }
  return d;
}

KvCacheConfig reference_kv_config(const ModelSpec& spec) {
  KvCacheConfig c;
  c.dtype = DType::kBF16;
  c.num_layers = spec.num_layers;
  c.scales.k.assign(size_t(spec.num_layers), 1.0f);
  c.scales.v.assign(size_t(spec.num_layers), 1.0f);
  return c;
}

std::vector<int> most_sensitive_layers(const std::vector<double>& sensitivity, int count) {
  std::vector<int> idx(sensitivity.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(),
                   [&](int a, int b) { return sensitivity[size_t(a)] > sensitivity[size_t(b)]; });
  idx.resize(size_t(std::clamp<int>(count, 0, int(idx.size()))));
  std::sort(idx.begin(), idx.end());
  return idx;
}

StatusOr<std::unique_ptr<KvEvaluator>> KvEvaluator::create(const EvalKvOptions& o,
                                                           const ParallelRuntime* parallel) {
  std::unique_ptr<KvEvaluator> e(new KvEvaluator());
  e->options_ = o;
  if (o.chunk < 1 || o.noise_chunk < 1 || o.page_size < 1)
    return invalid_argument("chunk, noise chunk and page size must be >= 1");
  if (o.batch_windows < 1)
    return invalid_argument("--batch-windows must be >= 1, got {}", o.batch_windows);
  if (o.tp_size < 1) return invalid_argument("--tp-size must be >= 1, got {}", o.tp_size);
  if (o.tp_size > 1 && parallel == nullptr)
    return failed_precondition(
        "--tp-size {}: no distributed runtime given (dist/tensor_parallel.h)", o.tp_size);
  STRATA_ASSIGN_OR_RETURN(ModelSpec spec, load_model_spec(o.model_path));
  if (o.context_len > spec.max_position_embeddings)
    return invalid_argument("--context-len {} exceeds the model's {} positions", o.context_len,
                            spec.max_position_embeddings);
  STRATA_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::load(o.model_path));
  e->tokenizer_ = std::make_unique<Tokenizer>(std::move(tok));
  STRATA_ASSIGN_OR_RETURN(PromptEncoder enc, PromptEncoder::load(o.model_path, *e->tokenizer_));
  e->encoder_ = std::make_unique<PromptEncoder>(std::move(enc));
  STRATA_ASSIGN_OR_RETURN(WeightStore ws, WeightStore::open(o.model_path, spec.quant));
  e->weights_ = std::make_unique<WeightStore>(std::move(ws));
  if (o.tp_size > 1) {
    // The engine's ranks (threads of this process: in-process CPU ranks, or one GPU each over
    // NCCL); rank 0's model drives the others in every forward.
    EngineConfig config;
    config.model_path = o.model_path;
    config.device = o.device;
    config.tp_size = o.tp_size;
    config.tp_allow_uneven = o.tp_allow_uneven;
    STRATA_ASSIGN_OR_RETURN(ParallelModel group,
                            parallel->create_model(config, spec, *e->weights_));
    e->backend_ = std::move(group.backend);
    e->model_ = std::move(group.model);
  } else {
    switch (o.device) {
      case Device::kCpu:
        e->backend_ = make_cpu_backend();
        break;
      case Device::kCuda:
#ifdef STRATA_CUDA
        e->backend_ = make_cuda_backend();
        break;
#else
        return failed_precondition(
            "--device cuda: this build has no CUDA backend (configure with -DSTRATA_CUDA=ON)");
#endif
    }
    STRATA_ASSIGN_OR_RETURN(e->model_, create_model(spec, *e->weights_, *e->backend_));
  }
  if (!o.data_path.empty()) {
    STRATA_ASSIGN_OR_RETURN(e->data_,
                            load_eval_data(o.data_path, *e->encoder_, o.context_len, o.max_tokens,
                                           o.allow_repeat, o.free_run_prompts));
  }
  return e;
}

StatusOr<KvCacheConfig> KvEvaluator::resolve(const KvCacheOptions& kv) const {
  STRATA_ASSIGN_OR_RETURN(
      KvCacheConfig c, resolve_kv_cache_config(kv, model_->spec(), weights_.get(), DType::kBF16));
  KvLayout layout = apply_kv_layout(c, model_->spec(), model_->kv_layout());
  layout.page_size = options_.page_size;
  layout.num_pages = 1;
  const Status ok = backend_->check_kv_layout(layout);
  if (!ok.ok()) return ok.with_context("KV cache {} on {}", c.describe(), backend_->name());
  return c;
}

nlohmann::json KvEvaluator::deployment() const {
  return {{"device", device_name(options_.device)},
          {"tp_size", options_.tp_size},
          {"dcp_size", 1},
          {"activation_dtype", dtype_name(backend_->activation_dtype())},
          {"backend", backend_->name()}};
}

std::string KvEvaluator::checkpoint_key(
    const std::vector<std::pair<std::string, KvCacheConfig>>& candidates, bool noise_floor,
    const std::vector<std::vector<int32_t>>& windows, size_t n_windows) const {
  const EvalKvOptions& o = options_;
  std::string key = fmt::format(
      "model={};vocab={};layers={};windows={};tokens={:016x};context={};chunk={};page={};noise_"
      "chunk={};batch={};"
      "noise={};deployment={}",
      o.model_path, spec().vocab_size, spec().num_layers, n_windows,
      hash_windows(windows, n_windows), o.context_len, o.chunk, o.page_size, o.noise_chunk,
      o.batch_windows, noise_floor, deployment().dump());
  for (const auto& [label, cfg] : candidates) key += fmt::format(";cand={}|{}", label, cfg.key());
  return key;
}

StatusOr<std::vector<CandidateResult>> KvEvaluator::compare(
    const std::vector<std::pair<std::string, KvCacheConfig>>& candidates, bool noise_floor,
    bool free_run, const std::vector<std::vector<int32_t>>* windows_in, int max_windows,
    bool checkpoint, bool* stopped) {
  const auto& windows = windows_in ? *windows_in : data_.windows;
  const EvalKvOptions& o = options_;
  const int L = o.context_len;
  const int G = o.batch_windows;
  const int64_t vocab = model_->spec().vocab_size;
  const size_t n_windows =
      max_windows < 0 ? windows.size() : std::min(windows.size(), size_t(max_windows));
  if (stopped) *stopped = false;
  std::vector<CandidateResult> results;
  auto add = [&](const std::string& label, const KvCacheConfig& cfg) {
    results.emplace_back();
    results.back().label = label;
    results.back().config = cfg;
  };
  if (noise_floor) add("bf16-noise", reference_kv_config(spec()));
  for (const auto& [label, cfg] : candidates) add(label, cfg);
  const size_t first_cand = noise_floor ? 1 : 0;

  // Finished groups from an earlier, interrupted run of the same evaluation.
  std::unique_ptr<EvalCheckpoint> saved;
  size_t w_begin = 0;
  if (checkpoint && !o.checkpoint_path.empty()) {
    std::vector<CheckpointGroup> done;
    STRATA_ASSIGN_OR_RETURN(
        saved,
        EvalCheckpoint::open(o.checkpoint_path,
                             checkpoint_key(candidates, noise_floor, windows, n_windows), &done));
    for (const CheckpointGroup& g : done) {
      if (g.first_window != int64_t(w_begin) || g.results.size() != results.size())
        return data_loss(
            "--checkpoint '{}': group at window {} does not continue the groups before it",
            o.checkpoint_path, g.first_window);
      for (size_t r = 0; r < results.size(); ++r) add_scores(g.results[r], results[r].metrics);
      w_begin += size_t(g.windows);
    }
    if (w_begin > 0)
      LOG_INFO("eval-kv: {} of {} windows restored from {}", w_begin, n_windows, o.checkpoint_path);
  }

  // The reference batches G windows per step (chunk, page size); the noise floor half as many,
  // in reverse order, in noise_chunk chunks on pages of one token: another batch composition.
  const int noise_batch = std::max(1, G / 2);
  PagedRunner ref(*model_, reference_kv_config(spec()), o.page_size, G, L);
  PagedRunner noise(*model_, reference_kv_config(spec()), 1, std::max(2, noise_batch), L);
  std::vector<std::unique_ptr<PagedRunner>> cands;
  for (const auto& [label, cfg] : candidates)
    cands.push_back(std::make_unique<PagedRunner>(*model_, cfg, o.page_size, G, L));
  ReferenceLogits ref_logits(*backend_, G, L, vocab);

  int64_t new_windows = 0;
  for (size_t w0 = w_begin; w0 < n_windows; w0 += size_t(G)) {
    const int nw = int(std::min<size_t>(size_t(G), n_windows - w0));
    auto window = [&](int k) -> const std::vector<int32_t>& { return windows[w0 + size_t(k)]; };
    // The chunks of windows `group` (indices into this group; runner sequence = place in `group`)
    // at positions [b, e).
    auto chunks_of = [&](const std::vector<int>& group, int b, int e) {
      std::vector<std::pair<int, std::vector<int32_t>>> chunks;
      for (size_t j = 0; j < group.size(); ++j)
        chunks.push_back({int(j), std::vector<int32_t>(window(group[j]).begin() + b,
                                                       window(group[j]).begin() + e)});
      return chunks;
    };
    std::vector<int> all(static_cast<size_t>(nw));
    std::iota(all.begin(), all.end(), 0);

    ref.reset();
    for (int b = 0; b < L; b += o.chunk) {
      const int e = std::min(L, b + o.chunk);
      ref.step_on_device(chunks_of(all, b, e), [&](const Tensor& logits) {
        for (int k = 0; k < nw; ++k) ref_logits.store(logits, int64_t(k) * (e - b), k, b, e - b);
      });
    }
    // One scoring pass of `run` over the group: windows `order` in batches of `per_step`, chunks of
    // `chunk`. Scores come back window by window, positions in order, however they were batched.
    auto score_pass = [&](PagedRunner& run, const std::vector<int>& order, int per_step,
                          int chunk) {
      std::vector<std::vector<ScoredPosition>> per_window(static_cast<size_t>(nw));
      run.reset();
      for (size_t s = 0; s < order.size(); s += size_t(per_step)) {
        const std::vector<int> group(
            order.begin() + long(s),
            order.begin() + long(std::min(order.size(), s + size_t(per_step))));
        for (int b = 0; b < L; b += chunk) {
          const int e = std::min(L, b + chunk);
          run.step_on_device(chunks_of(group, b, e), [&](const Tensor& logits) {
            for (size_t j = 0; j < group.size(); ++j) {
              const int k = group[j];
              const std::vector<LogitStatsRow> rows =
                  ref_logits.score(logits, int64_t(j) * (e - b), k, b, e - b, window(k));
              for (size_t i = 0; i < rows.size(); ++i)
                per_window[size_t(k)].push_back({int32_t(b + int(i)), rows[i]});
            }
          });
        }
        run.reset();
      }
      std::vector<ScoredPosition> out;
      for (auto& w : per_window) out.insert(out.end(), w.begin(), w.end());
      return out;
    };
    CheckpointGroup g{.first_window = int64_t(w0), .windows = nw, .results = {}};
    if (noise_floor)
      g.results.push_back(score_pass(noise, std::vector<int>(all.rbegin(), all.rend()), noise_batch,
                                     o.noise_chunk));
    for (auto& c : cands) g.results.push_back(score_pass(*c, all, G, o.chunk));
    for (size_t r = 0; r < results.size(); ++r) add_scores(g.results[r], results[r].metrics);
    if (saved) STRATA_RETURN_IF_ERROR(saved->append(g));
    report("teacher forcing", int64_t(w0 + size_t(nw)) * (L - 1), int64_t(n_windows) * (L - 1));
    new_windows += nw;
    if (o.stop_after_windows > 0 && new_windows >= o.stop_after_windows &&
        w0 + size_t(nw) < n_windows) {
      if (stopped) *stopped = true;
      return results;
    }
  }

  if (free_run) {
    for (auto& r : results) {
      r.free_run.prompts = int(data_.prompts.size());
      r.free_run.tokens_per_prompt = o.free_run_tokens;
    }
    for (size_t p = 0; p < data_.prompts.size(); ++p) {
      const auto& prompt = data_.prompts[p];
      ref.reset();
      const std::vector<int32_t> want = ref.greedy(0, prompt, o.free_run_tokens, o.chunk);
      if (noise_floor) {
        noise.reset();
        results[0].free_run.first_divergence.push_back(
            first_divergence(want, noise.greedy(1, prompt, o.free_run_tokens, o.noise_chunk)));
      }
      for (size_t c = 0; c < cands.size(); ++c) {
        cands[c]->reset();
        results[first_cand + c].free_run.first_divergence.push_back(
            first_divergence(want, cands[c]->greedy(0, prompt, o.free_run_tokens, o.chunk)));
      }
      report("free running", int64_t(p + 1), int64_t(data_.prompts.size()));
    }
  }
  return results;
}

KvScales KvEvaluator::calibrate(const std::vector<std::vector<int32_t>>& windows, int64_t tokens,
                                DType dtype) {
  KvCacheConfig exact = reference_kv_config(spec());
  exact.dtype = DType::kF32;
  const int L = options_.context_len;
  PagedRunner run(*model_, exact, 1, 1, L);
  const int layers = spec().num_layers;
  std::vector<float> k_amax(size_t(layers), 0.0f), v_amax(size_t(layers), 0.0f);
  std::vector<float> row;
  int64_t seen = 0;
  for (const auto& w : windows) {
    if (seen >= tokens) break;
    const int n = int(std::min<int64_t>(int64_t(w.size()), tokens - seen));
    std::vector<int32_t> ids(w.begin(), w.begin() + n);
    run.reset();
    for (int b = 0; b < n; b += options_.chunk)
      run.step({{0, std::vector<int32_t>(ids.begin() + b,
                                         ids.begin() + std::min(n, b + options_.chunk))}},
               false);
    const KvLayout& lay = run.kv().layout();
    for (int l = 0; l < layers; ++l) {
      // Page size 1 and one sequence: slots 0 .. n-1 hold this window, f32 and unscaled.
      const float* k = run.kv().k(l).ptr<float>();
      for (int64_t i = 0; i < int64_t(n) * lay.k_dim; ++i)
        k_amax[size_t(l)] = std::max(k_amax[size_t(l)], std::fabs(k[i]));
      if (lay.v_dim > 0) {
        const float* v = run.kv().v(l).ptr<float>();
        for (int64_t i = 0; i < int64_t(n) * lay.v_dim; ++i)
          v_amax[size_t(l)] = std::max(v_amax[size_t(l)], std::fabs(v[i]));
      }
    }
    seen += n;
    report("calibration", seen, tokens);
  }
  const float fmax = dtype == DType::kFP8E5M2 ? kFp8E5M2Max : kFp8E4M3Max;
  KvScales s;
  s.source = "calibrated";
  for (int l = 0; l < layers; ++l) {
    s.k.push_back(k_amax[size_t(l)] > 0 ? k_amax[size_t(l)] / fmax : 1.0f);
    s.v.push_back(v_amax[size_t(l)] > 0 ? v_amax[size_t(l)] / fmax : 1.0f);
  }
  return s;
}

StatusOr<std::vector<double>> KvEvaluator::layer_sensitivity(
    const KvCacheConfig& base, const std::vector<std::vector<int32_t>>& windows, int64_t tokens) {
  std::vector<std::pair<std::string, KvCacheConfig>> cands;
  const int layers = spec().num_layers;
  for (int l = 0; l < layers; ++l) {
    KvCacheConfig c = base;
    c.bf16_layers.clear();
    for (int m = 0; m < layers; ++m)
      if (m != l) c.bf16_layers.push_back(m);
    cands.push_back({"layer " + std::to_string(l), c});
  }
  const int n_windows = int((tokens + options_.context_len - 2) / (options_.context_len - 1));
  STRATA_ASSIGN_OR_RETURN(std::vector<CandidateResult> r,
                          compare(cands, false, false, &windows, std::max(1, n_windows)));
  std::vector<double> out;
  for (const auto& c : r) out.push_back(c.metrics.mean_kl());
  return out;
}

}  // namespace strata
