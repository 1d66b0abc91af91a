// strata plan: KV capacity of a deployment before launching it, from config.json alone.
// Several --mem-fraction-static / --kv-cache-dtype values print side by side (every
// combination). The numbers come from planner::plan_kv_capacity, the function the engine calls
// at startup.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "command.h"
#include "core/parse_enum.h"
#include "model/config.h"
#include "model/sharding.h"
#include "planner/planner.h"

namespace strata::tools {
namespace {

constexpr double kGiB = double(int64_t(1) << 30);

struct Flags {
  std::string model_path;
  double gpu_memory_gib = 0;
  int tp_size = 1;
  int dcp_size = 1;
  std::vector<double> fractions;
  std::vector<std::string> kv_dtypes{"bf16"};
  std::vector<int> bf16_layers;
  int page_size = 0;
  int64_t context_length = 0;
  double hicache_size_gb = 0;
  double hicache_ratio = 0;
  int64_t avg_seq_len = 0;
  int64_t max_seq_len = 0;
  int max_running_requests = 0;
  int64_t max_total_tokens = 0;
  std::string device = "cuda";
  bool language_only = false;
  double runtime_reserved_gib = -1;
  double load_overhead_gib = -1;
  int chunked_prefill_size = 0;
  int cuda_graph_max_bs = 0;
  bool json = false;
  bool verbose = false;
};

void add_flags(CLI::App& app, Flags& f) {
  app.add_option("--model-path", f.model_path, "model directory (config.json is enough)")
      ->required();
  app.add_option("--gpu-memory-gib", f.gpu_memory_gib,
                 "memory per GPU in GiB (with --device cpu: the memory budget)")
      ->required();
  app.add_option("--tp-size", f.tp_size, "tensor-parallel ranks");
  app.add_option("--dcp-size", f.dcp_size,
                 "decode context parallelism (MLA): each group of this many ranks holds 1/N of "
                 "every sequence's "
                 "latent KV (divides --tp-size)");
  app.add_option("--mem-fraction-static", f.fractions,
                 "one or more fractions in (0, 1); default: SGLang's rule for the GPU size");
  app.add_option("--kv-cache-dtype", f.kv_dtypes, "one or more of bf16, fp8_e4m3, fp8_e5m2, f32");
  app.add_option("--kv-cache-bf16-layers", f.bf16_layers,
                 "layers whose KV stays bf16 when --kv-cache-dtype is fp8");
  app.add_option("--page-size", f.page_size, "tokens per KV page (default 16 cuda, 1 cpu)");
  app.add_option("--context-length", f.context_length,
                 "context length (default: max_position_embeddings)");
  app.add_option("--hicache-size", f.hicache_size_gb, "host KV tier per rank in GB");
  app.add_option("--hicache-ratio", f.hicache_ratio,
                 "host KV tier as a multiple of the device pool (when --hicache-size is 0)");
  app.add_option("--avg-seq-len", f.avg_seq_len, "typical prompt + output tokens per request");
  app.add_option("--max-seq-len", f.max_seq_len, "longest request (default: context length)");
  app.add_option("--max-running-requests", f.max_running_requests, "cap on running requests");
  app.add_option("--max-total-tokens", f.max_total_tokens, "cap on the KV pool in tokens");
  app.add_option("--device", f.device, enum_name_list<Device>());
  app.add_flag("--language-only", f.language_only, "do not count a VL wrapper's vision tower");
  app.add_option("--runtime-reserved-gib", f.runtime_reserved_gib,
                 "override: memory gone before weights load (CUDA context, NCCL)");
  app.add_option("--load-overhead-gib", f.load_overhead_gib,
                 "override: memory allocated at load beside the checkpoint tensors");
  app.add_option("--chunked-prefill-size", f.chunked_prefill_size,
                 "for the default fraction only (SGLang default by GPU size)");
  app.add_option("--cuda-graph-max-bs", f.cuda_graph_max_bs,
                 "for the default fraction only (SGLang default by GPU size)");
  app.add_flag("--json", f.json, "print JSON (an object, or an array for several columns)");
  app.add_flag("--verbose", f.verbose, "explain every term");
}

// Builds one Deployment per (fraction, dtype) combination; errors name the bad flag value.
StatusOr<std::vector<Deployment>> deployments(const Flags& f) {
  if (!(f.gpu_memory_gib > 0)) return invalid_argument("--gpu-memory-gib must be positive");
  Deployment base;
  base.gpu_memory_bytes = int64_t(f.gpu_memory_gib * kGiB);
  base.tp_size = f.tp_size;
  base.dcp_size = f.dcp_size;
  STRATA_ASSIGN_OR_RETURN(const Device device, parse_enum<Device>(f.device, "--device"));
  base.device = device == Device::kCpu ? PlanDevice::kCpu : PlanDevice::kCuda;
  // The CPU reference holds every weight as float32 (Backend::weight_policy).
  if (base.device == PlanDevice::kCpu)
    base.weight_policy = WeightPolicy{.dense_dtype = DType::kF32};
  base.kv_bf16_layers = f.bf16_layers;
  base.page_size = f.page_size > 0 ? f.page_size : (base.device == PlanDevice::kCpu ? 1 : 16);
  if (f.page_size < 0) return invalid_argument("--page-size must be >= 1");
  base.context_length = f.context_length;
  base.hicache_bytes = int64_t(f.hicache_size_gb * 1e9);
  base.hicache_ratio = f.hicache_ratio;
  base.avg_seq_len = f.avg_seq_len;
  base.max_seq_len = f.max_seq_len;
  if (f.max_running_requests > 0) base.max_running_requests = f.max_running_requests;
  if (f.max_total_tokens > 0) base.max_total_tokens = f.max_total_tokens;
  base.language_only = f.language_only;
  if (f.runtime_reserved_gib >= 0)
    base.runtime_reserved_bytes = int64_t(f.runtime_reserved_gib * kGiB);
  if (f.load_overhead_gib >= 0) base.load_overhead_bytes = int64_t(f.load_overhead_gib * kGiB);
  base.chunked_prefill_size = f.chunked_prefill_size;
  base.cuda_graph_max_bs = f.cuda_graph_max_bs;
  for (double fr : f.fractions) {
    if (!(fr > 0.0 && fr < 1.0)) {
      return invalid_argument("--mem-fraction-static {} is outside (0, 1)", fr);
    }
  }
  std::vector<std::optional<double>> fractions(f.fractions.begin(), f.fractions.end());
  if (fractions.empty()) fractions.push_back(std::nullopt);
  std::vector<Deployment> out;
  for (const auto& fr : fractions) {
    for (const std::string& name : f.kv_dtypes) {
      STRATA_ASSIGN_OR_RETURN(DType dtype, parse_kv_cache_dtype(name));
      Deployment d = base;
      d.mem_fraction_static = fr;
      d.kv_cache_dtype = dtype;
      out.push_back(d);
    }
  }
  return out;
}

std::string count_str(int64_t n) {
  if (n >= int64_t(1e12)) return fmt::format("{:.3f} T", n / 1e12);
  if (n >= int64_t(1e9)) return fmt::format("{:.2f} B", n / 1e9);
  return fmt::format("{:.2f} M", n / 1e6);
}

nlohmann::json to_json(const Deployment& d, const StatusOr<Plan>& plan, bool verbose) {
  nlohmann::json j;
  j["kv_cache_dtype"] = kv_cache_dtype_name(d.kv_cache_dtype);
  j["tp_size"] = d.tp_size;
  j["gpu_memory_bytes"] = d.gpu_memory_bytes;
  j["page_size"] = d.page_size;
  if (!plan.ok()) {
    if (d.mem_fraction_static) j["mem_fraction_static"] = *d.mem_fraction_static;
    j["error"] = plan.status().to_string();
    return j;
  }
  const Plan& p = *plan;
  j["mem_fraction_static"] = p.mem_fraction_static;
  j["total_params"] = p.total_params;
  j["active_params"] = p.active_params;
  j["weight_bytes_per_rank"] = p.weight_bytes_per_rank;
  j["load_overhead_bytes"] = p.load_overhead_bytes;
  j["runtime_reserved_bytes"] = p.runtime_reserved_bytes;
  j["kv_bytes_per_token"] = p.kv_bytes_per_token;
  j["kv_tokens"] = p.kv_tokens;
  j["kv_tokens_per_rank"] = p.kv_tokens_per_rank;
  j["dcp_size"] = p.dcp_size;
  j["dcp_gather_bytes_per_token_layer"] = p.dcp_gather_bytes_per_token_layer;
  j["dcp_all_to_all_bytes_per_token_layer"] = p.dcp_all_to_all_bytes_per_token_layer;
  j["dp_attention_extra_weight_bytes"] = p.dp_attention_extra_weight_bytes;
  j["dp_attention_kv_tokens_per_rank"] = p.dp_attention_kv_tokens_per_rank;
  j["kv_pool_bytes"] = p.kv_pool_bytes;
  j["context_length"] = p.context_length;
  j["max_running_requests"] = p.max_running_requests;
  j["requests_at_avg_len"] = p.requests_at_avg_len;
  j["requests_at_max_len"] = p.requests_at_max_len;
  j["host_tier_tokens"] = p.host_tier_tokens;
  j["headroom_bytes"] = p.headroom_bytes;
  if (verbose) j["explanation"] = p.explanation;
  return j;
}

void print_table(const ModelSpec& spec, const Flags& f, const std::vector<Deployment>& ds,
                 const std::vector<StatusOr<Plan>>& plans) {
  const Plan* any = nullptr;
  for (const auto& p : plans) {
    if (p.ok()) any = &*p;
  }
  std::printf("model: %s (%s), %s\n", spec.model_type.c_str(), spec.text_model_type.c_str(),
              f.model_path.c_str());
  if (any) {
    std::printf("params: %s total, %s active per token\n", count_str(any->total_params).c_str(),
                count_str(any->active_params).c_str());
    std::printf("weights per rank: %.2f GiB (TP %d) + load overhead %.2f GiB\n",
                any->weight_bytes_per_rank / kGiB, f.tp_size, any->load_overhead_bytes / kGiB);
  }
  std::vector<std::vector<std::string>> rows = {
      {"mem_fraction_static"}, {"kv_cache_dtype"},   {"kv bytes/token/rank"}, {"kv tokens"},
      {"kv pool GiB/rank"},    {"max running reqs"}, {"headroom GiB"}};
  if (f.avg_seq_len > 0) rows.push_back({"reqs @ avg len"});
  rows.push_back({"reqs @ max len"});
  if (f.hicache_size_gb > 0 || f.hicache_ratio > 0) rows.push_back({"host tier tokens"});
  for (size_t c = 0; c < plans.size(); ++c) {
    const Deployment& d = ds[c];
    size_t r = 0;
    if (!plans[c].ok()) {
      rows[r++].push_back(d.mem_fraction_static ? fmt::format("{:.3f}", *d.mem_fraction_static)
                                                : "default");
      rows[r++].push_back(kv_cache_dtype_name(d.kv_cache_dtype));
      while (r < rows.size()) rows[r++].push_back("does not fit");
      continue;
    }
    const Plan& p = *plans[c];
    rows[r++].push_back(
        fmt::format("{:.3f}{}", p.mem_fraction_static, p.mem_fraction_defaulted ? "*" : ""));
    rows[r++].push_back(kv_cache_dtype_name(p.kv_cache_dtype));
    rows[r++].push_back(fmt::format("{}", p.kv_bytes_per_token));
    rows[r++].push_back(fmt::format("{}", p.kv_tokens));
    rows[r++].push_back(fmt::format("{:.2f}", p.kv_pool_bytes / kGiB));
    rows[r++].push_back(fmt::format("{}", p.max_running_requests));
    rows[r++].push_back(fmt::format("{:.2f}", p.headroom_bytes / kGiB));
    if (f.avg_seq_len > 0) rows[r++].push_back(fmt::format("{}", p.requests_at_avg_len));
    rows[r++].push_back(fmt::format("{}", p.requests_at_max_len));
    if (r < rows.size()) rows[r++].push_back(fmt::format("{}", p.host_tier_tokens));
  }
  for (const auto& row : rows) {
    std::printf("%-22s", row[0].c_str());
    for (size_t i = 1; i < row.size(); ++i) std::printf(" %14s", row[i].c_str());
    std::printf("\n");
  }
  if (!f.fractions.size()) std::printf("* SGLang's default mem_fraction_static for this GPU\n");
  if (any && any->dcp_size > 1) {
    const int64_t per_token =
        any->dcp_gather_bytes_per_token_layer + any->dcp_all_to_all_bytes_per_token_layer;
    std::printf(
        "decode context parallelism %d: kv tokens = %d x the tokens of one rank's pool; each "
        "decoded token "
        "costs every rank %lld B of query all-gather + %lld B of partial all-to-all per layer "
        "(%.2f MB over "
        "%d layers)\n",
        any->dcp_size, any->dcp_size, (long long)any->dcp_gather_bytes_per_token_layer,
        (long long)any->dcp_all_to_all_bytes_per_token_layer,
        double(per_token) * spec.num_layers / 1e6, spec.num_layers);
  }
  if (any && spec.is_mla() && f.tp_size > 1) {
    const int64_t rank_tokens = any->dp_attention_kv_tokens_per_rank;
    std::printf(
        "data-parallel attention instead: +%.2f GiB of attention weights per rank, %s\n",
        any->dp_attention_extra_weight_bytes / kGiB,
        rank_tokens == 0
            ? "which leaves no KV room: does not fit"
            : fmt::format(
                  "{} tokens per rank x {} = {} tokens (each request within one rank's pool)",
                  rank_tokens, f.tp_size, rank_tokens * f.tp_size)
                  .c_str());
  }
  if (!f.verbose) return;
  for (size_t c = 0; c < plans.size(); ++c) {
    if (!plans[c].ok()) continue;
    std::printf("\n[%s, %s]\n", fmt::format("{:.3f}", plans[c]->mem_fraction_static).c_str(),
                kv_cache_dtype_name(plans[c]->kv_cache_dtype));
    for (const std::string& line : plans[c]->explanation) std::printf("  %s\n", line.c_str());
  }
}

int plan_main(int argc, char** argv) {
  CLI::App app("KV capacity of a deployment, before launching it", "strata plan");
  Flags f;
  add_flags(app, f);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::printf("%s", app.help().c_str());
    return 0;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "strata plan: %s\n", e.what());
    return 2;
  }
  auto ds = deployments(f);
  if (!ds.ok()) {
    std::fprintf(stderr, "strata plan: %s\n", ds.status().message().c_str());
    return 2;
  }
  auto spec = load_model_spec(f.model_path);
  if (!spec.ok()) {
    std::fprintf(stderr, "strata plan: %s\n", spec.status().message().c_str());
    return 2;
  }
  // The weights must shard over --tp-size as the engine will shard them (model/sharding.h):
  // intermediate, vocab and expert sizes, quantization groups; the planner checks the heads.
  if (f.tp_size > 1) {
    if (auto sharding = plan_tp_sharding(*spec, f.tp_size); !sharding.ok()) {
      std::fprintf(stderr, "strata plan: %s\n", sharding.status().message().c_str());
      return 2;
    }
  }
  std::vector<StatusOr<Plan>> plans;
  int rc = 0;
  for (const Deployment& d : *ds) {
    plans.push_back(plan_kv_capacity(*spec, d));
    const Status& st = plans.back().status();
    if (st.ok()) continue;
    std::fprintf(stderr, "strata plan: %s\n", st.message().c_str());
    // Bad input is the same for every column: stop at the first. A column that does not fit
    // is still shown beside the others.
    if (st.code() != StatusCode::kResourceExhausted) return 2;
    rc = 1;
  }
  if (f.json) {
    nlohmann::json out = nlohmann::json::array();
    for (size_t i = 0; i < plans.size(); ++i) {
      nlohmann::json j = to_json((*ds)[i], plans[i], f.verbose);
      j["model_path"] = f.model_path;
      j["model_type"] = spec->model_type;
      out.push_back(std::move(j));
    }
    std::printf("%s\n", (out.size() == 1 ? out[0] : out).dump(2).c_str());
  } else {
    print_table(*spec, f, *ds, plans);
  }
  return rc;
}

const CommandRegistrar reg("plan", "KV capacity before launch (weights, KV tokens, requests)",
                           plan_main);

}  // namespace
}  // namespace strata::tools
