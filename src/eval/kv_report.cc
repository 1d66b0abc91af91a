#include "eval/kv_report.h"

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <fstream>

#include "planner/planner.h"

namespace strata {
namespace {

std::string iso_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace

nlohmann::json make_kv_record(const ModelIdentity& model, const CandidateResult& r,
                              const CandidateResult* noise, const EvalKvOptions& o,
                              const EvalData& data, const nlohmann::json& deployment,
                              const nlohmann::json& extra) {
  const KvCacheConfig& c = r.config;
  nlohmann::json kv = {
      {"key", c.key()},
      {"describe", c.describe()},
      {"dtype", kv_cache_dtype_name(c.dtype)},
      {"format", c.format == KvFormat::kFlashMlaFp8 ? "flashmla" : "plain"},
      {"bf16_layers", c.bf16_layers},
      {"mla_rope_dtype", c.mla_rope_dtype ? kv_cache_dtype_name(*c.mla_rope_dtype) : "same"},
      {"scales", {{"source", c.scales.source}, {"k", c.scales.k}, {"v", c.scales.v}}}};
  nlohmann::json j = {
      {"format", kKvRecordFormat},
      {"date", iso_now()},
      {"label", r.label},
      {"model", {{"name", model.name}, {"path", model.path}, {"fingerprint", model.fingerprint}}},
      {"kv", kv},
      {"deployment", deployment},
      {"reference",
       fmt::format(
           "bf16 KV cache on the same devices ({} tp {}, {} activations, logits in that dtype "
           "reduced in double), same token stream",
           deployment.value("device", "cpu"), deployment.value("tp_size", 1),
           deployment.value("activation_dtype", "f32"))},
      {"data",
       {{"path", o.data_path},
        {"records", data.records},
        {"stream_tokens", data.stream_tokens},
        {"windows", data.windows.size()},
        {"context_len", o.context_len},
        {"chunk", o.chunk},
        {"page_size", o.page_size},
        {"batch_windows", o.batch_windows},
        {"repeated_contexts", data.repeated}}},
      {"metrics", r.metrics.to_json()},
      {"tokens_scored", r.metrics.tokens()},
      {"free_run", r.free_run.to_json()}};
  if (noise) {
    nlohmann::json n = noise->metrics.to_json();
    n.erase("buckets");
    n["how"] = fmt::format(
        "bf16 vs bf16: {} windows per forward in reverse order (the reference: {}), chunk {} "
        "(the reference: {}), page size 1 (the reference: {})",
        std::max(1, o.batch_windows / 2), o.batch_windows, o.noise_chunk, o.chunk, o.page_size);
    const double floor = noise->metrics.mean_kl();
    j["kld_vs_noise_floor"] =
        floor > 0 ? nlohmann::json(r.metrics.mean_kl() / floor) : nlohmann::json(nullptr);
    j["noise_floor"] = n;
  }
  for (const auto& [k, v] : extra.items()) j[k] = v;
  return j;
}

std::string format_kv_table(const std::vector<CandidateResult>& results) {
  std::string s =
      fmt::format("{:<34} {:>8} {:>22} {:>9} {:>9} {:>9} {:>9} {:>16} {:>10} {:>10} {:>18} {:>9}\n",
                  "kv config", "tokens", "KLD mean ± SE", "median", "p99", "p99.9", "max",
                  "top-1 ± SE", "Δp mean", "Δp RMS", "ln PPL ratio ± SE", "free-run");
  for (const auto& r : results) {
    const nlohmann::json m = r.metrics.to_json();
    const auto& k = m["kld"];
    std::string fr = "-";
    if (r.free_run.prompts > 0) {
      const nlohmann::json f = r.free_run.to_json();
      fr = fmt::format("{}/{} div", f["diverged"].get<int>(), r.free_run.prompts);
    }
    s += fmt::format(
        "{:<34} {:>8} {:>11.3e} ± {:<8.1e} {:>9.2e} {:>9.2e} {:>9.2e} {:>9.2e} {:>8.5f}±{:<7.5f} "
        "{:>10.2e} {:>10.2e} {:>9.2e}±{:<8.1e} {:>9}\n",
        r.label.substr(0, 34), m["tokens"].get<int64_t>(), k["mean"].get<double>(),
        k["se"].get<double>(), k["median"].get<double>(), k["p99"].get<double>(),
        k["p99_9"].get<double>(), k["max"].get<double>(), m["top1"]["agree"].get<double>(),
        m["top1"]["se"].get<double>(), m["dp"]["mean"].get<double>(), m["dp"]["rms"].get<double>(),
        m["ln_ppl_ratio"]["value"].get<double>(), m["ln_ppl_ratio"]["se"].get<double>(), fr);
  }
  s += "\nmean KLD by context position:\n";
  s += fmt::format("{:<34}", "kv config");
  if (!results.empty()) {
    const nlohmann::json first =
        results[0].metrics.to_json();  // named: ["buckets"] of a temporary dangles
    for (const auto& b : first["buckets"])
      s += fmt::format(" {:>13}",
                       fmt::format("[{},{})", b["begin"].get<int64_t>(), b["end"].get<int64_t>()));
  }
  s += "\n";
  for (const auto& r : results) {
    s += fmt::format("{:<34}", r.label.substr(0, 34));
    const nlohmann::json m = r.metrics.to_json();
    for (const auto& b : m["buckets"])
      s += fmt::format(" {:>13.3e}", b["kld"]["mean"].get<double>());
    s += "\n";
  }
  return s;
}

Status write_kld_plot(const std::string& png, const std::vector<CandidateResult>& results) {
  const std::string dat = png + ".dat";
  {
    std::ofstream f(dat);
    if (!f) return invalid_argument("--plot: cannot write '{}'", dat);
    for (const auto& r : results) {
      f << "\"" << r.label << "\"\n";
      const nlohmann::json m = r.metrics.to_json();
      for (const auto& b : m["buckets"])
        f << 0.5 * double(b["begin"].get<int64_t>() + b["end"].get<int64_t>()) << " "
          << std::max(1e-12, b["kld"]["mean"].get<double>()) << " " << b["kld"]["se"].get<double>()
          << "\n";
      f << "\n\n";
    }
  }
  std::string script = fmt::format(
      "set terminal pngcairo size 900,560; set output '{}'; set logscale xy; set xlabel 'context "
      "position'; "
      "set ylabel 'mean KL divergence vs bf16 KV (nats)'; set key outside; plot ",
      png);
  for (size_t i = 0; i < results.size(); ++i)
    script += fmt::format("{}'{}' index {} using 1:2 with linespoints title columnheader(1)",
                          i ? ", " : "", dat, i);
  FILE* p = popen("gnuplot 2>&1", "w");
  if (!p)
    return unavailable("--plot: cannot run gnuplot (apt-get install gnuplot-nox); data in {}", dat);
  std::fputs(script.c_str(), p);
  std::fputs("\n", p);
  const int rc = pclose(p);
  if (rc != 0)
    return unavailable(
        "--plot: gnuplot failed or is not installed (apt-get install gnuplot-nox); data in {}",
        dat);
  return Status();
}

}  // namespace strata
