// strata eval-kv: what a lossy KV cache costs, measured against the bf16 KV cache on the same
// token stream (teacher forcing, float32 logits over the full vocabulary), plus a noise floor and
// free-running divergence. Writes one JSON record per candidate into the quality-records
// directory the serve/generate gate reads (eval/kv_quality.h), keyed by where it ran (--device,
// --tp-size: the engine's ranks). Resumable (--checkpoint FILE). Optional: per-layer sensitivity
// with the most sensitive layers kept in bf16 (--auto-bf16-layers), scale calibration
// (--calibrate FILE), a KLD-vs-position plot (--plot, needs gnuplot).
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "command.h"
#include "core/log.h"
#include "core/parse_enum.h"
#include "dist/tensor_parallel.h"
#include "engine_flags.h"
#include "eval/kv_report.h"

namespace strata::tools {
namespace {

struct EvalKvFlags {
  EvalKvOptions eval;
  std::string dtypes = "fp8_e4m3";
  std::string bf16_layers;
  std::string scales_path;
  std::string rope_dtype;
  int auto_bf16_layers = 0;
  std::string mixed_bf16_layers;  // a mixed candidate from an earlier sensitivity run
  std::string calibrated_scales;  // a calibrated candidate from an earlier --calibrate
  int64_t sensitivity_tokens = 8192;
  std::string calibrate_path;
  std::string calibration_data;
  int64_t calibration_tokens = 32768;
  std::string json_path;
  std::string plot_path;
  std::string records_dir;
  bool no_records = false;
  bool no_noise = false;
  std::string device = "cpu";
  int batch_windows = 0;  // 0: 2 on the CPU, 16 on a GPU
  std::string log_level = "info";
};

// "\r<what>: done / total (pct) · N positions/s · ETA" on stderr; the rate counts only this
// process's work (a resumed run starts past zero).
class ProgressLine {
 public:
  void operator()(const std::string& what, int64_t done, int64_t total) {
    using Clock = std::chrono::steady_clock;
    const auto now = Clock::now();
    if (what != what_) what_ = what, start_ = now, start_done_ = done, last_ = {};
    if (done < total && now - last_ < std::chrono::milliseconds(500)) return;
    last_ = now;
    const double s = std::chrono::duration<double>(now - start_).count();
    const double rate = s > 0 ? double(done - start_done_) / s : 0;
    std::string eta = "-";
    if (rate > 0) {
      const int64_t left = int64_t(double(total - done) / rate);
      eta = fmt::format("{}:{:02d}:{:02d}", left / 3600, (left / 60) % 60, left % 60);
    }
    std::fprintf(stderr, "\r%s: %lld / %lld (%.1f%%) · %.0f /s · ETA %s   ", what.c_str(),
                 (long long)done, (long long)total,
                 total > 0 ? 100.0 * double(done) / double(total) : 100.0, rate, eta.c_str());
    if (done >= total) std::fprintf(stderr, "\n");
  }

 private:
  std::string what_;
  std::chrono::steady_clock::time_point start_{}, last_{};
  int64_t start_done_ = 0;
};

Status run(EvalKvFlags& f) {
  if (!set_log_level(f.log_level))
    return invalid_argument("--log-level: unknown level '{}'", f.log_level);
  if (f.eval.data_path.empty()) return invalid_argument("--data FILE.jsonl is required");
  STRATA_ASSIGN_OR_RETURN(std::vector<int> bf16_layers,
                          parse_layer_list(f.bf16_layers, "--kv-bf16-layers"));
  STRATA_ASSIGN_OR_RETURN(ModelIdentity id, model_identity(f.eval.model_path));
  STRATA_ASSIGN_OR_RETURN(f.eval.device, parse_enum<Device>(f.device, "--device"));
  if (f.batch_windows < 0)
    return invalid_argument("--batch-windows must be >= 0, got {}", f.batch_windows);
  f.eval.batch_windows = f.batch_windows > 0             ? f.batch_windows
                         : f.eval.device == Device::kCpu ? 2
                                                         : 16;
  if (!f.calibrate_path.empty() && (f.eval.device != Device::kCpu || f.eval.tp_size > 1))
    return invalid_argument(
        "--calibrate reads the KV pool on the host: run it with --device cpu --tp-size 1, then "
        "pass the scales file with --kv-scales or --calibrated-scales here");
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<KvEvaluator> ev,
                          KvEvaluator::create(f.eval, &tensor_parallel_runtime()));
  const EvalData& data = ev->data();
  LOG_INFO("eval-kv: {} ({}): {} records, {} tokens, {} windows of {}{}", id.name, id.fingerprint,
           data.records, data.stream_tokens, data.windows.size(), f.eval.context_len,
           data.repeated ? " (repeated contexts: the stream was shorter than --max-tokens)" : "");
  LOG_INFO("eval-kv: on {} tp {} ({} backend), {} windows per forward", device_name(f.eval.device),
           f.eval.tp_size, ev->deployment().value("backend", "?"), f.eval.batch_windows);
  ev->set_progress(ProgressLine());

  std::vector<std::pair<std::string, KvCacheConfig>> cands;
  std::vector<KvCacheConfig> bases;
  std::optional<DType> rope_dtype;
  if (!f.rope_dtype.empty()) {
    auto rope = parse_kv_cache_dtype(f.rope_dtype);
    if (!rope.ok()) return rope.status().with_context("--kv-mla-rope-dtype");
    rope_dtype = *rope;
  }
  std::stringstream ss(f.dtypes);
  for (std::string name; std::getline(ss, name, ',');) {
    STRATA_ASSIGN_OR_RETURN(KvCacheDtype d, parse_enum<KvCacheDtype>(name, "--kv-cache-dtype"));
    KvCacheOptions o{.dtype = d,
                     .bf16_layers = bf16_layers,
                     .scales_path = f.scales_path,
                     .mla_rope_dtype = rope_dtype};
    STRATA_ASSIGN_OR_RETURN(KvCacheConfig c, ev->resolve(o));
    bases.push_back(c);
    cands.push_back({c.describe(), c});
  }
  nlohmann::json extra = nlohmann::json::object();
  std::vector<std::vector<int32_t>> calib_windows = data.windows;
  if (!f.calibration_data.empty()) {
    STRATA_ASSIGN_OR_RETURN(
        EvalData cd,
        load_eval_data(f.calibration_data, ev->encoder(), f.eval.context_len,
                       std::max(f.calibration_tokens, f.sensitivity_tokens), false, 0));
    calib_windows = std::move(cd.windows);
  }
  const std::string calib_source =
      f.calibration_data.empty() ? f.eval.data_path : f.calibration_data;
  if (f.auto_bf16_layers > 0) {
    // The first lossy plain candidate only: each layer costs one more pass over the tokens.
    for (const KvCacheConfig& base : bases) {
      if (!base.lossy() || base.format != KvFormat::kPlain || extra.contains("sensitivity"))
        continue;
      STRATA_ASSIGN_OR_RETURN(const std::vector<double> sens,
                              ev->layer_sensitivity(base, calib_windows, f.sensitivity_tokens));
      KvCacheConfig c = base;
      c.bf16_layers = most_sensitive_layers(sens, f.auto_bf16_layers);
      std::string line;
      for (size_t l = 0; l < sens.size(); ++l) line += fmt::format(" {}:{:.2e}", l, sens[l]);
      LOG_INFO("per-layer sensitivity of {} (mean KLD, one layer quantized, {} tokens of {}):{}",
               base.describe(), f.sensitivity_tokens, calib_source, line);
      extra["sensitivity"][base.describe()] = {
          {"mean_kld_per_layer", sens}, {"tokens", f.sensitivity_tokens}, {"data", calib_source}};
      cands.push_back({c.describe() + " (auto)", c});
    }
  }
  // Candidates derived from the first plain fp8 one, with layers or scales chosen earlier.
  const KvCacheConfig* first_fp8 = nullptr;
  for (const auto& b : bases)
    if (!first_fp8 && b.lossy() && b.format == KvFormat::kPlain) first_fp8 = &b;
  if (!f.mixed_bf16_layers.empty() || !f.calibrated_scales.empty()) {
    if (!first_fp8)
      return invalid_argument(
          "--mixed-bf16-layers / --calibrated-scales need an fp8_e4m3 or fp8_e5m2 "
          "--kv-cache-dtype");
    const KvCacheDtype dtype = kv_cache_dtype_of(first_fp8->dtype);
    if (!f.mixed_bf16_layers.empty()) {
      STRATA_ASSIGN_OR_RETURN(std::vector<int> layers,
                              parse_layer_list(f.mixed_bf16_layers, "--mixed-bf16-layers"));
      KvCacheOptions o{.dtype = dtype,
                       .bf16_layers = layers,
                       .scales_path = f.scales_path,
                       .mla_rope_dtype = rope_dtype};
      STRATA_ASSIGN_OR_RETURN(KvCacheConfig c, ev->resolve(o));
      cands.push_back({c.describe() + " (mixed)", c});
    }
    if (!f.calibrated_scales.empty()) {
      KvCacheOptions o{.dtype = dtype,
                       .bf16_layers = bf16_layers,
                       .scales_path = f.calibrated_scales,
                       .mla_rope_dtype = rope_dtype};
      STRATA_ASSIGN_OR_RETURN(KvCacheConfig c, ev->resolve(o));
      cands.push_back({std::string(enum_name(dtype)) + " calibrated", c});
    }
  }
  if (!f.calibrate_path.empty()) {
    const KvCacheConfig* base = nullptr;
    for (const auto& b : bases)
      if (b.lossy() && b.format == KvFormat::kPlain) base = base ? base : &b;
    if (!base)
      return invalid_argument("--calibrate needs an fp8_e4m3 or fp8_e5m2 --kv-cache-dtype");
    KvScales s = ev->calibrate(calib_windows, f.calibration_tokens, base->dtype);
    STRATA_RETURN_IF_ERROR(
        write_kv_scales(f.calibrate_path, s,
                        {{"model", id.name},
                         {"fingerprint", id.fingerprint},
                         {"dtype", kv_cache_dtype_name(base->dtype)},
                         {"method", "amax over calibration tokens / max finite of the dtype"},
                         {"data", calib_source},
                         {"tokens", f.calibration_tokens}}));
    LOG_INFO("calibrated scales written to {}", f.calibrate_path);
    KvCacheOptions o{.dtype = kv_cache_dtype_of(base->dtype),
                     .bf16_layers = base->bf16_layers,
                     .scales_path = f.calibrate_path,
                     .mla_rope_dtype = rope_dtype};
    STRATA_ASSIGN_OR_RETURN(KvCacheConfig c, ev->resolve(o));
    cands.push_back({kv_cache_dtype_name(base->dtype) + std::string(" calibrated"), c});
  }

  bool stopped = false;
  STRATA_ASSIGN_OR_RETURN(
      const std::vector<CandidateResult> results,
      ev->compare(cands, !f.no_noise, f.eval.free_run_prompts > 0, nullptr, -1, true, &stopped));
  if (stopped) {
    LOG_WARN(
        "eval-kv: stopped after {} new windows (--stop-after-windows); no records written. The "
        "same command "
        "continues from {}",
        f.eval.stop_after_windows,
        f.eval.checkpoint_path.empty() ? std::string("zero (no --checkpoint)")
                                       : f.eval.checkpoint_path);
    return Status();
  }
  std::printf("%s", format_kv_table(results).c_str());
  const CandidateResult* noise = f.no_noise ? nullptr : &results[0];
  nlohmann::json records = nlohmann::json::array();
  for (size_t i = f.no_noise ? 0 : 1; i < results.size(); ++i) {
    nlohmann::json rec =
        make_kv_record(id, results[i], noise, f.eval, data, ev->deployment(), extra);
    if (!f.no_records) {
      STRATA_ASSIGN_OR_RETURN(
          std::string path,
          save_kv_record(f.records_dir.empty() ? default_kv_records_dir() : f.records_dir, rec));
      LOG_INFO("record: {}", path);
    }
    records.push_back(std::move(rec));
  }
  if (!f.json_path.empty()) {
    std::ofstream out(f.json_path);
    out << (records.size() == 1 ? records[0] : records).dump(2) << "\n";
    if (!out) return invalid_argument("--json: cannot write '{}'", f.json_path);
  }
  if (!f.plot_path.empty()) STRATA_RETURN_IF_ERROR(write_kld_plot(f.plot_path, results));
  return Status();
}

int eval_kv_main(int argc, char** argv) {
  CLI::App app("strata eval-kv: KV cache quality against the bf16 KV cache", "strata eval-kv");
  EvalKvFlags f;
  f.eval.model_path = default_model_path();
  app.add_option("--model-path,--model", f.eval.model_path, "model directory")
      ->capture_default_str();
  app.add_option("--data", f.eval.data_path,
                 "JSONL dataset ({\"text\"}, {\"messages\"} or {\"conversations\"})");
  app.add_option("--kv-cache-dtype", f.dtypes,
                 "candidate(s), comma-separated: fp8_e4m3, fp8_e5m2, fp8_flashmla (MLA), bf16")
      ->capture_default_str();
  app.add_option("--kv-bf16-layers", f.bf16_layers, "layers kept in bf16, e.g. 0,7");
  app.add_option("--kv-scales", f.scales_path, "per-layer K/V scales JSON (from --calibrate)");
  app.add_option("--kv-mla-rope-dtype", f.rope_dtype, "MLA rope part: bf16 | fp8_e4m3 | fp8_e5m2");
  app.add_option(
      "--auto-bf16-layers", f.auto_bf16_layers,
      "also evaluate the first fp8 candidate with its N most sensitive layers in bf16 (measured)");
  app.add_option("--mixed-bf16-layers", f.mixed_bf16_layers,
                 "also evaluate the first fp8 candidate with these layers in bf16 (e.g. from an "
                 "earlier --auto-bf16-layers)");
  app.add_option("--calibrated-scales", f.calibrated_scales,
                 "also evaluate the first fp8 candidate with these scales (a file from an earlier "
                 "--calibrate)");
  app.add_option("--sensitivity-tokens", f.sensitivity_tokens,
                 "tokens for the per-layer sensitivity")
      ->capture_default_str();
  app.add_option("--calibrate", f.calibrate_path,
                 "compute per-layer scales (amax/max finite), write FILE, evaluate them");
  app.add_option("--calibration-data", f.calibration_data,
                 "JSONL for calibration and sensitivity (default: --data)");
  app.add_option("--calibration-tokens", f.calibration_tokens, "tokens for calibration")
      ->capture_default_str();
  app.add_option("--json", f.json_path, "write the record(s) here too");
  app.add_option("--max-tokens", f.eval.max_tokens, "positions to score per candidate")
      ->capture_default_str();
  app.add_option("--context-len", f.eval.context_len, "window length")->capture_default_str();
  app.add_option("--chunk", f.eval.chunk, "prefill chunk")->capture_default_str();
  app.add_option("--page-size", f.eval.page_size, "KV page size")->capture_default_str();
  app.add_flag("--allow-repeat", f.eval.allow_repeat,
               "wrap around a short dataset (other offsets; recorded)");
  app.add_option("--free-run-prompts", f.eval.free_run_prompts,
                 "greedy generations compared (0: none)")
      ->capture_default_str();
  app.add_option("--free-run-tokens", f.eval.free_run_tokens, "tokens per greedy generation")
      ->capture_default_str();
  app.add_flag("--no-noise-floor", f.no_noise, "skip the bf16-vs-bf16 run");
  app.add_option("--plot", f.plot_path, "PNG of mean KLD against position (gnuplot)");
  app.add_option("--kv-quality-records", f.records_dir,
                 "records directory (default " + default_kv_records_dir() + ")");
  app.add_flag("--no-save-records", f.no_records, "do not write records for the quality gate");
  app.add_option("--device", f.device,
                 "where the reference and the candidates run: " + enum_name_list<Device>())
      ->capture_default_str();
  app.add_option("--tp-size,--tp", f.eval.tp_size,
                 "tensor-parallel ranks (cpu: in-process ranks; cuda: one GPU each over NCCL), as "
                 "the engine runs them")
      ->capture_default_str();
  app.add_flag("--tp-allow-uneven", f.eval.tp_allow_uneven,
               "tests: let ranks hold unequal head counts");
  app.add_option("--batch-windows", f.batch_windows,
                 "windows per forward (0: 2 on cpu, 16 on cuda)")
      ->capture_default_str();
  app.add_option("--checkpoint", f.eval.checkpoint_path,
                 "statistics of finished windows, appended as they finish: an interrupted run "
                 "given the same file "
                 "continues where it stopped");
  app.add_option("--stop-after-windows", f.eval.stop_after_windows,
                 "stop after scoring N new windows, as if interrupted (tests the checkpoint)");
  app.add_option("--log-level", f.log_level, "trace | debug | info | warning | error")
      ->capture_default_str();
  if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;
  const Status s = run(f);
  if (!s.ok()) {
    std::fprintf(stderr, "strata eval-kv: %s\n", s.to_string().c_str());
    return 1;
  }
  return 0;
}

const CommandRegistrar reg("eval-kv",
                           "KV cache quality against bf16 (teacher forcing, KL divergence)",
                           eval_kv_main);

}  // namespace
}  // namespace strata::tools
